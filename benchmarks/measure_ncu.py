"""benchmarks/gpu_measure.py --ncu: the ncu counters of six kernels, one ncu process each, merged into the run's
measurement file."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from typing import Optional

from benchmarks.measure_calls import make_call, make_inputs
from benchmarks.measure_machine import child_env
from benchmarks.measure_plan import ELEMENTS, ROOT, Row
from benchmarks.measure_results import document, write_outputs

# ------------------------------------------------------------------------------------------------ ncu
NCU_TARGETS = (
    Row("ldr", "fwd", "cuda", "bf16", 1024),
    Row("ldr", "bwd", "cuda", "bf16", 1024),
    Row("ldr", "fwd", "cuda", "bf16", 4096),
    Row("ldr", "bwd", "cuda", "bf16", 4096),
    Row("ldr", "bwd", "triton", "bf16", 4096),
    Row("bias_relu", "bwd", "cuda", "bf16", 4096),
)
NCU_METRICS = (
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "smsp__inst_executed.sum",
    "lts__t_sector_hit_rate.pct",
    "gpu__time_duration.sum",
)
NCU_RANGE = "gpu_measure_ncu"


def ncu_command(ncu: str, target: int) -> list[str]:
    return [
        ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", f"{NCU_RANGE}/", "--section", "WarpStateStats",
        "--metrics", ",".join(NCU_METRICS), "--csv", "--page", "raw",
        sys.executable, "-m", "benchmarks.gpu_measure", "--ncu-target", str(target),
    ]  # fmt: skip


def _number(text: str) -> Optional[float]:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse_ncu_csv(text: str, elements: int) -> list[dict]:
    """ncu's `--csv --page raw` output -> per kernel: name, the counters, instructions per element and the three
    largest warp-stall ratios (every column naming an issue stall)."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if len(lines) < 2:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header, body = rows[0], rows[1:]
    if body and not _number(body[0][0] or "x") and body[0][0] == "":  # the units line
        body = body[1:]
    out = []
    for vals in body:
        rec = dict(zip(header, vals))
        if not rec.get("ID", "").strip().isdigit():
            continue
        get = {k: _number(v) for k, v in rec.items()}
        stalls = {
            k: v for k, v in get.items() if v is not None and "issue_stalled" in k and not k.endswith("not_issued")
        }
        top = sorted(stalls.items(), key=lambda kv: -kv[1])[:3]
        inst = get.get("smsp__inst_executed.sum")
        out.append(
            {
                "name": rec.get("Kernel Name", ""),
                "dram_throughput_pct": get.get("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
                "achieved_occupancy_pct": get.get("sm__warps_active.avg.pct_of_peak_sustained_active"),
                "inst_executed": inst,
                "inst_per_element": inst / elements if inst is not None else None,
                "l2_hit_rate_pct": get.get("lts__t_sector_hit_rate.pct"),
                "duration": get.get("gpu__time_duration.sum"),
                "top_stalls": [{"metric": k, "value": v} for k, v in top],
            }
        )
    return out


def run_ncu(args, meta: dict, out_dirs: list[str], stem: str) -> dict:
    """The ncu counters of NCU_TARGETS, one ncu process each, within --budget; failures are recorded."""
    import shutil

    ncu = shutil.which("ncu") or next(
        (p for p in ("/usr/local/cuda/bin/ncu",) if os.path.exists(p)), None
    )  # fmt: skip
    results = []
    t0 = time.monotonic()
    env = child_env(args.wheel_dir)
    for i, row in enumerate(NCU_TARGETS):
        res = {"row": asdict(row), "status": None, "kernels": []}
        left = args.budget - (time.monotonic() - t0)
        if ncu is None:
            res["status"] = "ncu not found"
        elif left < 20:
            res["status"] = "skipped: budget"
        else:
            try:
                q = subprocess.run(ncu_command(ncu, i), cwd=ROOT, env=env, capture_output=True, text=True,
                                   timeout=min(left, 150))  # fmt: skip
                res["kernels"] = parse_ncu_csv(q.stdout, ELEMENTS)
                if q.returncode != 0 or not res["kernels"]:
                    res["status"] = f"ncu exited {q.returncode}: {(q.stderr or q.stdout)[-600:]}"
                else:
                    res["status"] = "measured"
            except subprocess.TimeoutExpired:
                res["status"] = "ncu timed out"
        print(f"ncu {row.label()}: {res['status'] if res['status'] != 'measured' else len(res['kernels'])} kernels",
              flush=True)  # fmt: skip
        results.append(res)
    return merge_ncu(results, meta, out_dirs, stem)


def merge_ncu(results: list[dict], meta: dict, out_dirs: list[str], stem: str) -> list[dict]:
    """The ncu results under the key "ncu" of the run's measurement file <stem>.json in each folder (a file with
    no rows where the measuring step wrote none), its markdown rewritten with them. Returns the documents."""
    docs = []
    for d in out_dirs:
        path = os.path.join(d, stem + ".json")
        if os.path.exists(path):
            with open(path) as fh:
                doc = json.load(fh)
        else:
            doc = document(meta, [])
        doc["ncu"] = results
        write_outputs(doc, [d], stem)
        docs.append(doc)
    return docs


def ncu_target(index: int) -> int:
    """Inside ncu: the target row's call, warmed outside and run once inside the NVTX range ncu profiles."""
    import torch

    row = NCU_TARGETS[index]
    t = make_inputs(row.dtype, row.n, "cuda")
    fn = make_call(row, t, "cuda")
    fn()
    fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(NCU_RANGE)
    fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    return 0
