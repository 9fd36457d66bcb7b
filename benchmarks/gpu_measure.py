"""One prepared device measurement of gpuopt's ops, sized to finish in 300 s on a fresh H100 or H200.

    python -m benchmarks.gpu_measure --dry-run                      # the plan and its time budget (any machine)
    python -m benchmarks.gpu_measure --wheel dist/gpuopt-*.whl      # measure (GPU); writes docs/measurements/
    python -m benchmarks.gpu_measure --ns 1024,4096 --ops ldr,dan_ln --budget 120     # a trimmed plan
    python -m benchmarks.gpu_measure --ncu                          # ncu counters of six kernels (separate step)
    python -m benchmarks.gpu_measure --attach-model FILE.json       # the model's estimate per row (CPU machine)
    python -m benchmarks.gpu_measure --device cpu --elements 4096 --ns 256   # the same loop on the CPU kernels

Rows: op x direction (fwd, bwd) x backend (cuda, triton) x dtype (bf16, fp32) x N (768 ... 16384), M = 2^26 // N;
the gated ops at their own N (GATED_NS, --gated-ns: the intermediate size F, the output's last dimension).
The ops are the model's rows (tools.roofline_gpuopt), named as below; p = 0.1 wherever there is a dropout, except
the gated ops, which run as LLaMA-style MLPs do, without one (p = 0, the model's gated rows):
    ldr        layer_norm_dropout_relu(x, N, w, b)                      model op layer_norm_dropout_relu
    bias_relu  bias_relu(x, b)                                          model op bias_relu
    dan_ln     dropout_add_norm(x, residual, w, b, prenorm=True)        model op dropout_add_norm
    dan_rms    dropout_add_norm(x, residual, w, norm="rms", prenorm=True)  model op dropout_add_rms_norm
    rms_drop   norm_dropout(x, w, norm="rms")                           model op rms_norm_dropout
    bias_gelu  bias_act(x, b, act="gelu")                               model op bias_act_gelu
    gated_silu gated_act(gate, up) (SwiGLU, two (M, F) tensors)         model op gated_act_silu
    gated_silu_packed  gated_act(gate_up) (one (M, 2F) tensor [gate | up])  model op gated_act_silu_packed
    copy       y.copy_(x), one per (dtype, N) group: the yardstick the fractions divide by
fwd runs the forward under torch.no_grad; bwd is torch.autograd.grad of a forward taken once (retain_graph), with
a gradient for every output the model's backward reads (dropout_add_norm's sum included). Where liger_kernel or
quack import, their LayerNorm alone (op "ln", backends "liger" / "quack", the norm-only anchor) joins the bf16
groups of N 1024, 4096, 16384 (liger) and 4096 (quack, whose kernels compile in the measuring process); they are
never installed here. Liger's SwiGLU (op "swiglu", backend "liger": LigerSiLUMulFunction on two tensors, the
gated_silu rows' peer) joins the bf16 groups of PEER_SWIGLU_NS; its backward writes the gradients into the tensors
it saved, so its rows run on copies of the group's inputs.

Per row (docs/measurements/README.md has the file format):
    kernel_us  the GPU time of one call's own kernels: torch.profiler (CUPTI) durations of every kernel, memset
               and memcpy the call issues, summed per call, the median over PROFILE_CALLS calls (aggregate_kernels;
               per kernel name where the calls differ); `kernels` names each. One profiler session serves a whole
               (dtype, N) group: a marker kernel (torch.cuda._sleep, "spin_kernel") between rows splits the events.
    replay_us  REPLAY_CALLS calls captured in one CUDA graph, the graph replayed REPLAY_TIMES times, each replay
               timed with events; the median / REPLAY_CALLS. The call is built on the capture's stream (a backward
               row's forward too: autograd runs a backward node on its forward's stream).
    eager_us   what benchmarks/run.py measures: triton.testing.do_bench (a 256 MB cache clear before each call,
               events around the call) median, warm-up EAGER_WARMUP_MS, repetitions EAGER_REP_MS.
    host_us    the CPU time of one call (Python, dispatch, planning, launches, autograd), the median over the
               profiled calls of a torch.profiler record_function range around each.
    bytes      the model's ideal bytes of the row (tools.roofline_gpuopt.ideal_bytes).
    *_frac     (bytes / time) / (copy bytes / copy time), the group's copy timed the same way.
    model_frac tools.roofline's estimate for the row on the GPU's description (H100 or H200), filled in by
               --attach-model on a machine with the built extension and cuobjdump (the model needs no GPU, and
               building it takes minutes: not part of the device's 300 s).

Time. Triton compiles its kernels on first use, one to a few seconds each; a fresh machine has no cache. Before
measuring, COMPILE_WORKERS processes run every Triton row once at its real shape (filling Triton's on-disk
cache), so the compiles run side by side; the measuring process then loads them from the cache. Then the groups
run in order (bf16 and fp32 at N 1024, 4096, 16384 first): each group warms its rows, profiles them in one
session, times them eagerly, then as graph replays. Before each group and each phase the script checks the clock
against --budget; a group whose estimate (scaled by how the finished groups compared with theirs) does not fit
is skipped, a phase past the deadline stops, and the file is rewritten after every group, so a run cut short
still leaves what it measured. --dry-run prints the plan with each row's estimate from the ASSUMPTIONS below.

The gpuopt wheel: --wheel unpacks it into a temporary folder put first on sys.path (so the checkout's gpuopt_ops,
which has no compiled extension, does not shadow it); without --wheel, gpuopt_ops is imported as installed
(benchmarks/gpu_check.sh installs the wheel into its own folder first). Nothing is installed. The file's name
carries --commit (gpu_check.sh: GPU_CHECK_COMMIT), else the checkout's git commit, else "unknown".
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
ELEMENTS = 1 << 26  # M * N of every row (the model's ELEMENTS)
NS = (768, 1024, 2048, 4096, 8192, 16384)
FIRST_NS = (1024, 4096, 16384)  # measured first: the N of docs/RESULTS.md's table
DTYPES = ("bf16", "fp32")
ELEM = {"bf16": 2, "fp32": 4}
DIRECTIONS = ("fwd", "bwd")
BACKENDS = ("cuda", "triton")
OPS = {  # op -> the model's op label (tools.roofline_gpuopt.OPS)
    "ldr": "layer_norm_dropout_relu",
    "bias_relu": "bias_relu",
    "dan_ln": "dropout_add_norm",
    "dan_rms": "dropout_add_rms_norm",
    "rms_drop": "rms_norm_dropout",
    "bias_gelu": "bias_act_gelu",
    "gated_silu": "gated_act_silu",
    "gated_silu_packed": "gated_act_silu_packed",
}
# The gated ops' N is the intermediate size F (2^26 // F rows), not NS. gated_silu runs at F = 4096 alone: its
# kernels take the M x F elements as one flat problem in both backends, so F does not change their work (the model's
# two-tensor rows are alike at every F). The packed layout (a 2-D walk or tiles, whose shape follows F; the model's
# gated_act_silu_packed rows) is not in the default ops, nor are the model's other F (2048, 11008, 14336, 28672):
# the plan must fit the 290 s benchmarks/gpu_check.sh gives it (284.7 s as here; 289.5 with the packed rows at 4096
# too, 296.8 with gated_silu at 14336 as well: one more group a dtype). --ops and --gated-ns add them.
GATED_OPS = ("gated_silu", "gated_silu_packed")
GATED_NS = {"gated_silu": (4096,), "gated_silu_packed": (4096, 14336)}
DEFAULT_OPS = tuple(op for op in OPS if op != "gated_silu_packed")
# the peers' rows: op -> the model op whose ideal bytes they are charged (their own model_op is None)
PEER_OPS = {"ln": "layer_norm_dropout_relu", "swiglu": "gated_act_silu"}
PEER_SWIGLU_NS = (4096, 14336)  # where gated_silu runs (one program a row: its tile follows F)
MODEL_DIRECTION = {"fwd": "forward", "bwd": "backward"}
PEER_BACKENDS = ("liger", "quack")
PEER_NS = {"liger": (1024, 4096, 16384), "quack": (4096,)}  # quack compiles in-process: one N
P = 0.1
EPS = 1e-5
BUDGET_S = 300.0
PROFILE_CALLS = 20
REPLAY_CALLS = 5
REPLAY_TIMES = 3
EAGER_WARMUP_MS = 5.0
EAGER_REP_MS = 20.0
COMPILE_WORKERS = 8
MARKER = "spin_kernel"  # the kernel of torch.cuda._sleep
MARKER_CYCLES = 1000


@dataclass(frozen=True)
class Assumptions:
    """What the dry run's estimate assumes of a fresh H100 / H200 machine (16 CPU cores). Each figure is set on
    the slow side of what such machines do, so that the plan fits with room; the run checks its own clock too."""

    startup_s: float = 25.0  # python, torch, gpuopt and triton imports, the CUDA context, the first profiler init
    worker_start_s: float = 20.0  # a compile worker's imports and CUDA context (the workers start side by side)
    compile_s: float = 2.0  # one Triton kernel variant: frontend, LLVM, ptxas, the launcher stub (often 0.5-1.5 s)
    cache_load_s: float = 0.1  # the measuring process loading one compiled variant from the disk cache
    quack_compile_s: float = 10.0  # quack's CuTe DSL kernels of one row, compiled in the measuring process
    # bytes / s a call moves at least: the slowest measured rows of docs/RESULTS.md (H200, copy 3.9 TB/s) were CUDA
    # backwards at 0.33 of copy (1.3 TB/s) and Triton backwards at 0.12 (0.47 TB/s); an H100 copies 0.7 x as fast
    bandwidth: float = 0.9e12
    triton_bwd_bandwidth: float = 0.3e12
    host_s: float = 300e-6  # the least time of a call: its CPU time (24-96 us measured for the Triton launchers)
    flush_s: float = 0.15e-3  # do_bench's 256 MB cache clear before each call
    row_overhead_s: float = 0.04  # building the call, synchronising, bookkeeping, per row and phase
    group_overhead_s: float = 3.0  # inputs, the profiler session's start, stop and event parsing, empty_cache
    capture_s: float = 0.05  # capturing and instantiating a row's graph of REPLAY_CALLS calls
    write_s: float = 3.0  # the JSON and markdown files, rewritten after every group

    def variants(self, row: Row) -> int:
        """Triton kernel variants a row may compile: forward 1 (the rows kernel), backward 2 (the rows kernel and
        the column-sum stage), one more at N >= 8192 (the wide backward asks the compiled facts of the kernel it
        plans before it runs one). Counted per row, though rows share variants: the launchers of ldr, dan_ln and
        bias_relu planned on meta tensors launch or query 49 distinct variants over both dtypes and the six N, 120
        by this count. liger's LayerNorm: as a Triton row; quack's: compiled in-process (quack_compile_s). The
        gated ops and Liger's SwiGLU: one kernel each way (no column sums)."""
        if row.backend not in ("triton", "liger"):
            return 0
        if row.op in GATED_OPS or row.op == "swiglu":
            return 1
        return 1 if row.direction == "fwd" else (3 if row.n >= 8192 else 2)


ASSUMPTIONS = Assumptions()


# ---------------------------------------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class Row:
    op: str
    direction: str
    backend: str
    dtype: str
    n: int
    elements: int = ELEMENTS  # M x N

    @property
    def m(self) -> int:
        return self.elements // self.n

    @property
    def key(self) -> tuple:
        return (self.op, self.direction, self.backend, self.dtype, self.n)

    def label(self) -> str:
        return f"{self.op} {self.direction} {self.backend} {self.dtype} N={self.n}"


def group_order(dtypes, ns) -> list[tuple[str, int]]:
    """(dtype, N) groups in the order they run: FIRST_NS before the others, bf16 before fp32 within each."""
    first = [(d, n) for n in ns if n in FIRST_NS for d in dtypes]
    rest = [(d, n) for n in ns if n not in FIRST_NS for d in dtypes]
    return first + rest


def build_plan(
    ops=DEFAULT_OPS,
    directions=DIRECTIONS,
    backends=BACKENDS,
    dtypes=DTYPES,
    ns=NS,
    peers=(),
    elements: int = ELEMENTS,
    gated_ns: Optional[dict] = None,
) -> list[Row]:
    """Every row, group by group (group_order): per group its copy, then op x backend x direction (the gated ops
    in the groups of their own N, gated_ns[op], default GATED_NS); the peers' LayerNorm rows (`peers`: the
    importable ones) in the bf16 groups of PEER_NS[peer], liger's SwiGLU in those of PEER_SWIGLU_NS where the
    gated_silu rows run."""
    gated_ns = GATED_NS if gated_ns is None else gated_ns
    op_ns = {op: tuple(gated_ns.get(op, ())) if op in GATED_OPS else tuple(ns) for op in ops}
    all_ns = tuple(dict.fromkeys(n for op in ops for n in op_ns[op]))
    norm_ns = {n for op in ops if op not in GATED_OPS for n in op_ns[op]}  # where the LayerNorm anchors join
    plan: list[Row] = []
    for dtype, n in group_order(dtypes, all_ns):
        plan.append(Row("copy", "fwd", "torch", dtype, n, elements))
        for op in ops:
            if n not in op_ns[op]:
                continue
            for backend in backends:
                for direction in directions:
                    plan.append(Row(op, direction, backend, dtype, n, elements))
        for peer in peers:
            if dtype == "bf16" and n in PEER_NS[peer] and n in norm_ns:
                for direction in directions:
                    plan.append(Row("ln", direction, peer, dtype, n, elements))
        if "liger" in peers and dtype == "bf16" and n in PEER_SWIGLU_NS and n in op_ns.get("gated_silu", ()):
            for direction in directions:
                plan.append(Row("swiglu", direction, "liger", dtype, n, elements))
    return plan


def groups_of(plan: list[Row]) -> list[tuple[tuple[str, int], list[Row]]]:
    out: dict[tuple[str, int], list[Row]] = {}
    for r in plan:
        out.setdefault((r.dtype, r.n), []).append(r)
    return list(out.items())


def ideal_bytes(row: Row) -> int:
    """The model's ideal bytes of the row (every input read once, every output written once)."""
    e = ELEM[row.dtype]
    if row.op == "copy":
        return 2 * row.m * row.n * e
    from tools import roofline_gpuopt as G

    model_op = OPS.get(row.op) or PEER_OPS[row.op]  # the peers' "ln": LayerNorm's bytes are ldr's
    return G.ideal_bytes(model_op, MODEL_DIRECTION[row.direction], row.dtype, row.n, row.m)


def call_seconds(row: Row, a: Assumptions = ASSUMPTIONS) -> float:
    bw = a.triton_bwd_bandwidth if (row.backend == "triton" and row.direction == "bwd") else a.bandwidth
    return max(ideal_bytes(row) / bw, a.host_s)


def row_seconds(row: Row, a: Assumptions = ASSUMPTIONS) -> dict[str, float]:
    """The estimated seconds of one row's phases in the measuring process (compiles apart)."""
    t = call_seconds(row, a)
    eager_calls = 5 + (EAGER_WARMUP_MS + EAGER_REP_MS) * 1e-3 / (t + a.flush_s)  # do_bench's estimate + loops
    return {
        "warm": 2 * t + a.row_overhead_s + a.variants(row) * a.cache_load_s
        + (a.quack_compile_s if row.backend == "quack" else 0.0),
        "profile": PROFILE_CALLS * t + a.row_overhead_s,
        "eager": eager_calls * (t + a.flush_s) + a.row_overhead_s,
        "replay": (1 + REPLAY_TIMES) * REPLAY_CALLS * t + a.capture_s + a.row_overhead_s,
    }  # fmt: skip


def group_seconds(rows: list[Row], a: Assumptions = ASSUMPTIONS) -> float:
    return a.group_overhead_s + sum(sum(row_seconds(r, a).values()) for r in rows)


def compile_phase_seconds(plan: list[Row], workers: int, a: Assumptions = ASSUMPTIONS) -> float:
    """The compile workers' wall time: the variants spread over the workers, after their start."""
    variants = sum(a.variants(r) for r in plan)
    if variants == 0:
        return 0.0
    if workers <= 0:  # compiled by the measuring process itself
        return variants * a.compile_s
    return a.worker_start_s + math.ceil(variants / workers) * a.compile_s


def budget(plan: list[Row], workers: int = COMPILE_WORKERS, a: Assumptions = ASSUMPTIONS) -> dict:
    """The plan's time estimate by phase, in seconds."""
    phases = {"startup": a.startup_s, "compile": compile_phase_seconds(plan, workers, a)}
    for name in ("warm", "profile", "eager", "replay"):
        phases[name] = sum(row_seconds(r, a)[name] for r in plan)
    phases["groups"] = a.group_overhead_s * len(groups_of(plan))
    phases["write"] = a.write_s
    return {"phases": phases, "total": sum(phases.values()), "variants": sum(a.variants(r) for r in plan)}


def plan_text(plan: list[Row], budget_s: float, workers: int = COMPILE_WORKERS, a: Assumptions = ASSUMPTIONS) -> str:
    """The dry run's printout: every row with its estimate, the phases, the total against the budget."""
    lines = [
        f"gpu_measure plan: {len(plan)} rows in {len(groups_of(plan))} (dtype, N) groups, M x N = 2^26, p = {P}",
        f"assumptions: {json.dumps(asdict(a))}",
        f"per row: {PROFILE_CALLS} profiled calls, do_bench {EAGER_WARMUP_MS:g} + {EAGER_REP_MS:g} ms, "
        f"{REPLAY_TIMES + 1} replays of a {REPLAY_CALLS}-call graph, 2 warm-up calls",
        "estimate: call = max(bytes / bandwidth (triton_bwd_bandwidth), host_s); warm = 2 calls + variants x "
        "cache_load_s (+ quack_compile_s);"
        f" profile = {PROFILE_CALLS} calls; eager = (5 calls + {EAGER_WARMUP_MS + EAGER_REP_MS:g} ms) with a flush_s "
        f"cache clear each; replay = {(REPLAY_TIMES + 1) * REPLAY_CALLS} calls + capture_s; + row_overhead_s a phase;"
        " compile = worker_start_s + ceil(variants / workers) x compile_s; groups = group_overhead_s each",
        "",
        f"{'#':>4s}  {'row':44s} {'bytes':>11s} {'call us':>8s} {'variants':>8s} {'est s':>6s}",
    ]
    for i, r in enumerate(plan):
        s = sum(row_seconds(r, a).values())
        lines.append(
            f"{i:4d}  {r.label():44s} {ideal_bytes(r):11d} {call_seconds(r, a) * 1e6:8.0f} {a.variants(r):8d} {s:6.2f}"
        )
    b = budget(plan, workers, a)
    lines.append("")
    lines.append(
        f"Triton kernel variants (upper bound): {b['variants']}, compiled by {workers} worker processes "
        f"({a.compile_s:g} s each)"
        if workers > 0
        else f"Triton kernel variants: {b['variants']}, compiled in-process"
    )
    lines.append("phases (estimated seconds):")
    for name, sec in b["phases"].items():
        lines.append(f"  {name:8s} {sec:7.1f}")
    verdict = "fits" if b["total"] <= budget_s else "DOES NOT FIT"
    lines.append(f"total estimated {b['total']:.1f} s of budget {budget_s:.0f} s: {verdict}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- pure arithmetic
def median(vals) -> Optional[float]:
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def fraction(nbytes: int, us: Optional[float], copy_bytes: Optional[int], copy_us: Optional[float]) -> Optional[float]:
    """(bytes / time) as a fraction of the copy's (bytes / time); None where a time is missing."""
    if not us or not copy_us or not copy_bytes or us <= 0 or copy_us <= 0:
        return None
    return (nbytes / us) / (copy_bytes / copy_us)


def split_at_markers(events: list[tuple[str, float, float]], marker: str = MARKER) -> list[list[tuple[str, float]]]:
    """Device events (name, start, duration) of a session -> the (name, duration) lists between marker kernels,
    in time order (the events before the first marker and after the last are dropped)."""
    out: list[list[tuple[str, float]]] = []
    current: Optional[list] = None
    for name, _start, dur in sorted(events, key=lambda e: e[1]):
        if marker in name:
            if current is not None:
                out.append(current)
            current = []
        elif current is not None:
            current.append((name, dur))
    return out


def aggregate_kernels(events: list[tuple[str, float]], calls: int) -> tuple[Optional[float], list[dict]]:
    """One row's device events (name, duration us) in launch order over `calls` calls -> (kernel time of one
    call, its kernels). Where every call launched the same sequence of k kernels: the median over the calls of
    each call's sum, and per launch position its name and median duration. Otherwise (a call launching more or
    other kernels, e.g. a one-time allocation's memset): per kernel name the median duration times its launches
    a call (count / calls), summed in order of first appearance. (None, []) when there are no events."""
    if not events or calls <= 0:
        return None, []
    k = len(events) // calls
    if k and len(events) == k * calls and all(events[i][0] == events[i % k][0] for i in range(len(events))):
        total = statistics.median(sum(d for _, d in events[c * k : (c + 1) * k]) for c in range(calls))
        kernels = [
            {"name": events[j][0], "us": round(statistics.median(events[c * k + j][1] for c in range(calls)), 3),
             "per_call": 1.0}
            for j in range(k)
        ]  # fmt: skip
        return total, kernels
    by_name: dict[str, list[float]] = {}
    for name, dur in events:
        by_name.setdefault(name, []).append(dur)
    kernels = []
    total = 0.0
    for name, durs in by_name.items():
        per_call = len(durs) / calls
        us = statistics.median(durs)
        total += us * per_call
        kernels.append({"name": name, "us": round(us, 3), "per_call": round(per_call, 3)})
    return total, kernels


ROW_FIELDS = (
    "op", "direction", "backend", "dtype", "n", "m", "kernel_us", "kernels", "replay_us", "eager_us", "host_us",
    "bytes", "kernel_frac", "replay_frac", "eager_frac", "model_frac",
)  # fmt: skip


def new_record(row: Row) -> dict:
    """A row's record with every measured field empty (null in the file)."""
    rec = {k: None for k in ROW_FIELDS}
    rec.update(op=row.op, direction=row.direction, backend=row.backend, dtype=row.dtype, n=row.n, m=row.m)
    rec["bytes"] = ideal_bytes(row)
    rec["model_op"] = OPS.get(row.op)
    rec["status"] = "planned"
    rec["notes"] = []
    return rec


def finish_group(records: list[dict]) -> None:
    """The fractions of a group's records against the group's copy record (same dtype and N, timed alike), and
    each record's status: measured (every time), partial, or as it was (skipped / failed)."""
    copy = next((r for r in records if r["op"] == "copy"), None)
    for rec in records:
        for what in ("kernel", "replay", "eager"):
            rec[f"{what}_frac"] = fraction(
                rec["bytes"], rec[f"{what}_us"], copy and copy["bytes"], copy and copy[f"{what}_us"]
            )
        times = [rec[k] for k in ("kernel_us", "replay_us", "eager_us", "host_us")]
        if rec["status"] in ("planned", "measuring"):
            rec["status"] = "measured" if all(t is not None for t in times) else "partial"


def copy_bandwidth(records: list[dict]) -> Optional[float]:
    """Bytes / s of the copy by its kernel time, the median over the groups' copies (None if none measured)."""
    bw = [r["bytes"] / (r["kernel_us"] * 1e-6) for r in records if r["op"] == "copy" and r["kernel_us"]]
    return median(bw)


def document(meta: dict, records: list[dict]) -> dict:
    """The measurement file's object (docs/measurements/README.md)."""
    doc = {k: meta[k] for k in ("gpu", "commit", "date", "versions")}
    doc["copy_bytes_per_s"] = copy_bandwidth(records)
    for k, v in meta.items():
        if k not in doc:
            doc[k] = v
    doc["rows"] = records
    return doc


def _fmt(v, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def markdown(doc: dict) -> str:
    """The summary beside the JSON: the run's header and one table line per row."""
    v = doc.get("versions", {})
    bw = doc.get("copy_bytes_per_s")
    lines = [
        f"# Measured on {doc['gpu']}, {doc['date']}, commit {doc['commit']}",
        "",
        f"torch {v.get('torch')}, triton {v.get('triton')}, CUDA {v.get('cuda')}, driver {v.get('driver')}, "
        f"python {v.get('python')}. Copy (kernel time, median over groups): "
        f"{'-' if bw is None else f'{bw / 1e12:.3f} TB/s'}. Fractions are of the copy in the same (dtype, N) "
        "group, timed the same way; model = tools.roofline's estimate (fraction of its copy bandwidth).",
        "",
        "| op | dir | backend | dtype | N | kernel us | kernel | replay | eager | host us | model | kernels | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        ks = "; ".join(f"{k['name'][:40]} {k['us']:.1f}" for k in (r.get("kernels") or []))
        lines.append(
            f"| {r['op']} | {r['direction']} | {r['backend']} | {r['dtype']} | {r['n']} | {_fmt(r['kernel_us'], 1)} "
            f"| {_fmt(r['kernel_frac'])} | {_fmt(r['replay_frac'])} | {_fmt(r['eager_frac'])} "
            f"| {_fmt(r['host_us'], 1)} | {_fmt(r['model_frac'])} | {ks} | {r.get('status', '')} |"
        )
    for note in doc.get("notes", []):
        lines.append(f"\nnote: {note}")
    if doc.get("ncu"):
        lines += [
            "",
            "## ncu (--clock-control none)",
            "",
            "| row | kernel | DRAM % | occupancy % | instr / element | L2 hit % | top stalls |",
            "|---|---|---|---|---|---|---|",
        ]
        for entry in doc["ncu"]:
            r = entry["row"]
            label = f"{r['op']} {r['direction']} {r['backend']} {r['dtype']} N={r['n']}"
            if not entry.get("kernels"):
                lines.append(f"| {label} | {entry.get('status')} | | | | | |")
            for k in entry.get("kernels") or []:
                stalls = ", ".join(
                    f"{s['metric'].split('stalled_')[-1].split('_per_')[0]} {s['value']:.2f}" for s in k["top_stalls"]
                )
                lines.append(
                    f"| {label} | {k['name'][:50]} | {_fmt(k['dram_throughput_pct'], 1)} "
                    f"| {_fmt(k['achieved_occupancy_pct'], 1)} | {_fmt(k['inst_per_element'], 2)} "
                    f"| {_fmt(k['l2_hit_rate_pct'], 1)} | {stalls} |"
                )
    return "\n".join(lines) + "\n"


def slug(text: str) -> str:
    """A GPU's name as a file-name part: 'NVIDIA H200' -> 'h200', else its lower-case alphanumeric words."""
    m = re.search(r"\b([A-Z]\d{2,4}[A-Za-z]?)\b", text)
    if m:
        return m.group(1).lower()
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def output_stem(date: str, gpu: str, commit: str) -> str:
    return f"{date}-{slug(gpu)}-{commit}"


def write_outputs(doc: dict, out_dirs: list[str], stem: str) -> list[str]:
    """<stem>.json and <stem>.md into every folder (written to a temporary name, then renamed)."""
    paths = []
    for d in out_dirs:
        os.makedirs(d, exist_ok=True)
        for ext, text in ((".json", json.dumps(doc, indent=1) + "\n"), (".md", markdown(doc))):
            path = os.path.join(d, stem + ext)
            with open(path + ".tmp", "w") as fh:
                fh.write(text)
            os.replace(path + ".tmp", path)
            paths.append(path)
    return paths


# ------------------------------------------------------------------------------------------------ the wheel
def unpack_wheel(wheel: str) -> str:
    """The wheel's files in a new temporary folder (removed when the process ends), put first on sys.path."""
    import atexit
    import shutil

    d = tempfile.mkdtemp(prefix="gpu_measure_wheel_")
    atexit.register(shutil.rmtree, d, True)
    with zipfile.ZipFile(wheel) as z:
        z.extractall(d)
    sys.path.insert(0, d)
    return d


# ------------------------------------------------------------------------------------------------ the calls
def make_inputs(dtype_name: str, n: int, device: str, elements: int = ELEMENTS, seed: int = 0) -> dict:
    import torch

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    m = elements // n
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape, scale=1.0, shift=0.0):
        return (shift + scale * torch.randn(*shape, device=device, generator=gen)).to(dtype)

    return {
        "x": rnd(m, n).requires_grad_(True),
        "r": rnd(m, n).requires_grad_(True),
        "w": rnd(n, scale=0.1, shift=1.0).requires_grad_(True),
        "b": rnd(n, scale=0.1).requires_grad_(True),
        "g": rnd(m, n),
        "gs": rnd(m, n),
    }


def _forward(row: Row, t: dict, backend: str):
    """(forward callable -> tuple of outputs, the inputs whose gradients the backward computes, the gradients of
    the outputs)."""
    import torch

    x, r, w, b, g, gs = (t[k] for k in ("x", "r", "w", "b", "g", "gs"))
    if row.backend in PEER_BACKENDS:
        if row.backend == "liger" and row.op == "swiglu":
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction

            # its backward overwrites the tensors it saved (gate and up) with their gradients: copies, not the
            # group's inputs
            a, u = (v.detach().clone().requires_grad_(True) for v in (x, r))
            return (lambda: (LigerSiLUMulFunction.apply(a, u),)), (a, u), (g,)
        if row.backend == "liger":
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction

            return (lambda: (LigerLayerNormFunction.apply(x, w, b, EPS),)), (x, w, b), (g,)
        raise ValueError("quack rows are made by _quack_call")
    import gpuopt_ops as G

    if row.op == "ldr":
        return (lambda: (G.layer_norm_dropout_relu(x, x.shape[-1], w, b, p=P, backend=backend),)), (x, w, b), (g,)
    if row.op == "bias_relu":
        return (lambda: (G.bias_relu(x, b, backend=backend),)), (x, b), (g,)
    if row.op == "dan_ln":
        return (lambda: G.dropout_add_norm(x, r, w, b, p=P, prenorm=True, backend=backend)), (x, r, w, b), (g, gs)
    if row.op == "dan_rms":
        fn = lambda: G.dropout_add_norm(x, r, w, None, norm="rms", p=P, prenorm=True, backend=backend)  # noqa: E731
        return fn, (x, r, w), (g, gs)
    if row.op == "rms_drop":
        return (lambda: (G.norm_dropout(x, w, None, norm="rms", p=P, backend=backend),)), (x, w), (g,)
    if row.op == "bias_gelu":
        return (lambda: (G.bias_act(x, b, act="gelu", backend=backend),)), (x, b), (g,)
    if row.op == "gated_silu":  # gate = x, up = r; no dropout (the model's gated rows)
        return (lambda: (G.gated_act(x, r, act="silu", backend=backend),)), (x, r), (g,)
    if row.op == "gated_silu_packed":  # one (M, 2F) input [x | r], made once a group
        if "xr" not in t:
            t["xr"] = torch.cat([x.detach(), r.detach()], dim=-1).requires_grad_(True)
        xr = t["xr"]
        return (lambda: (G.gated_act(xr, None, act="silu", backend=backend),)), (xr,), (g,)
    if row.op == "copy":
        y = torch.empty_like(x, requires_grad=False)
        return (lambda: (y.copy_(x.detach()),)), (), ()
    raise ValueError(f"unknown op {row.op!r}")


def make_call(row: Row, t: dict, device: str) -> Callable[[], object]:
    """A no-argument callable running one call of the row on the inputs `t`."""
    import torch

    backend = row.backend
    if row.backend == "quack":
        from benchmarks.providers import _quack_runner

        return _quack_runner("ldr", row.direction, device, t["x"], t["w"], t["b"], t["g"])
    fwd, inputs, grads = _forward(row, t, backend)
    if row.direction == "fwd" or row.op == "copy":

        def run():
            with torch.no_grad():
                return fwd()

        return run
    with torch.enable_grad():
        outs = fwd()
    return lambda: torch.autograd.grad(outs, inputs, grads, retain_graph=True)


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


# ------------------------------------------------------------------------------------------------ timing
def _device_events(prof) -> list[tuple[str, float, float]]:
    """(name, start us, duration us) of a profiler session's kernels, memsets and memcpys (not the GPU spans of
    record_function ranges)."""
    import torch

    return [
        (e.name, e.time_range.start, e.time_range.elapsed_us())
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
        and not getattr(e, "is_user_annotation", False)
        and not e.name.startswith("gpu_measure_")
    ]


_MARKER_NAME: list[str] = []


def marker_name() -> str:
    """The profiler's name of torch.cuda._sleep's kernel on this machine, read once from a session of that kernel
    alone (which also pays the profiler's first start); MARKER where that session shows no single kernel."""
    if not _MARKER_NAME:
        import torch
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            torch.cuda._sleep(MARKER_CYCLES)
            torch.cuda.synchronize()
        names = {name for name, _, _ in _device_events(prof)}
        _MARKER_NAME.append(names.pop() if len(names) == 1 else MARKER)
    return _MARKER_NAME[0]


def profile_group(live: list[tuple[int, Callable]], device: str, calls: int = PROFILE_CALLS) -> dict:
    """One profiler session over a group's rows: per row index, (kernel_us, kernels, host_us). A marker kernel
    precedes each row's calls and follows the last; each call runs inside a record_function range."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        for i, fn in live:
            if device == "cuda":
                torch.cuda._sleep(MARKER_CYCLES)
            for _ in range(calls):
                with record_function(f"gpu_measure_row_{i}"):
                    fn()
            _sync(device)
        if device == "cuda":
            torch.cuda._sleep(MARKER_CYCLES)
            torch.cuda.synchronize()
    host: dict[int, list[float]] = {}
    for e in prof.events():
        if e.name.startswith("gpu_measure_row_") and e.device_type == torch.autograd.DeviceType.CPU:
            host.setdefault(int(e.name.rsplit("_", 1)[1]), []).append(e.time_range.elapsed_us())
    out = {i: {"host_us": median(host.get(i, [])), "kernel_us": None, "kernels": None} for i, _ in live}
    if device == "cuda":
        chunks = split_at_markers(_device_events(prof), marker_name())
        if len(chunks) == len(live):
            for (i, _), chunk in zip(live, chunks):
                k_us, kernels = aggregate_kernels(chunk, calls)
                out[i].update(kernel_us=k_us, kernels=kernels)
        else:
            for i, _ in live:
                out[i]["error"] = f"profiler: {len(chunks)} marker-separated chunks for {len(live)} rows"
    return out


def time_eager(fn, device: str) -> float:
    """Microseconds a call, as benchmarks/run.py measures (do_bench median on a GPU; perf_counter on a CPU)."""
    if device == "cuda":
        from benchmarks import run as BR

        med, _, _ = BR.time_gpu(fn, EAGER_WARMUP_MS, EAGER_REP_MS)
        return med[0] * 1e3
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def time_replay(make_fn: Callable[[], Callable], calls: int = REPLAY_CALLS, times: int = REPLAY_TIMES) -> float:
    """Microseconds a call in a CUDA graph of `calls` calls, the median of `times` event-timed replays.

    make_fn builds the call on the capture's side stream: a backward row's forward runs there, and autograd runs
    a backward node on its forward's stream, so the backward's kernels are launched into the capturing stream."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn = make_fn()
        fn()
    s.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(times):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1e3 / calls)
    del graph, fn
    return statistics.median(samples)


# ------------------------------------------------------------------------------------------------ metadata
def _version(module: str) -> Optional[str]:
    try:
        from importlib import metadata as md

        return md.version(module)
    except Exception:  # noqa: BLE001
        return None


def machine_meta(device: str, commit: Optional[str]) -> dict:
    import torch

    versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
    try:
        import triton

        versions["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        versions["triton"] = None
    versions["driver"] = None
    gpu = "CPU"
    machine = {"host": platform.node(), "cpus": os.cpu_count(), "platform": platform.platform()}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        gpu = props.name
        machine.update(sms=props.multi_processor_count, memory_bytes=props.total_memory)
        try:
            q = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20,
            )  # fmt: skip
            versions["driver"] = q.stdout.strip().splitlines()[0] if q.returncode == 0 and q.stdout.strip() else None
        except Exception:  # noqa: BLE001
            pass
    for name, dist in (("gpuopt", "gpuopt"), ("liger_kernel", "liger-kernel"), ("quack", "quack-kernels")):
        versions[name] = _version(dist)
    try:
        import gpuopt_ops
        import gpuopt_ops.build_info as bi

        versions["gpuopt_built_with_torch"] = bi.TORCH_VERSION
        machine["gpuopt_ops"] = os.path.dirname(gpuopt_ops.__file__)
    except Exception:  # noqa: BLE001
        pass
    return {
        "gpu": gpu,
        "commit": commit or git_commit() or "unknown",
        "date": datetime.date.today().isoformat(),
        "versions": versions,
        "machine": machine,
    }


def git_commit() -> Optional[str]:
    try:
        q = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                           timeout=10)  # fmt: skip
        return q.stdout.strip() or None if q.returncode == 0 else None
    except Exception:  # noqa: BLE001
        return None


def peers_importable() -> list[str]:
    out = []
    for backend, module in (("liger", "liger_kernel.ops.layer_norm"), ("quack", "quack.rmsnorm")):
        try:
            __import__(module)
            out.append(backend)
        except Exception:  # noqa: BLE001
            pass
    return out


# ------------------------------------------------------------------------------------------------ compile workers
def child_env(wheel_dir: Optional[str], environ: Optional[dict] = None) -> dict:
    """The environment of this script's child processes: the unpacked wheel first on PYTHONPATH, then the
    inherited PYTHONPATH (benchmarks/gpu_check.sh puts its installed wheel there), the checkout last (for the
    `benchmarks` and `tools` packages: its gpuopt_ops, without a build, must not come first)."""
    env = dict(os.environ if environ is None else environ)
    parts = ([wheel_dir] if wheel_dir else []) + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT) not in parts:
        parts.append(str(ROOT))
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["PYTHONSAFEPATH"] = "1"  # no current folder first on sys.path (the checkout's gpuopt_ops)
    return env


def warm_rows(rows: list[Row], device: str) -> int:
    """Runs each row's call twice (compiling its Triton kernels into the on-disk cache); returns the failures."""
    failures = 0
    key, t = None, None
    for row in rows:
        try:
            if key != (row.dtype, row.n):
                t = None
                t = make_inputs(row.dtype, row.n, device, elements=row.elements)
                key = (row.dtype, row.n)
            fn = make_call(row, t, device)
            fn()
            fn()
            _sync(device)
            print(f"warm {row.label()}", flush=True)
        except Exception as err:  # noqa: BLE001
            failures += 1
            print(f"warm {row.label()} failed: {type(err).__name__}: {err}", flush=True)
    return failures


def run_compile_workers(
    rows: list[Row], workers: int, deadline: float, log_dir: str, env: dict, device: str = "cuda"
) -> list[str]:
    """The Triton rows spread over `workers` processes (`--warm-rows`), waited for until `deadline`
    (time.monotonic); a worker still running then is stopped. Returns notes."""
    notes: list[str] = []
    rows = [r for r in rows if r.backend in ("triton", "liger")]  # quack's compiles stay in its process
    if not rows or workers <= 0:
        return notes
    rows.sort(key=lambda r: -ASSUMPTIONS.variants(r))
    procs = []
    for w in range(min(workers, len(rows))):
        part = rows[w::workers]
        spec = os.path.join(log_dir, f"warm_{w}.json")
        with open(spec, "w") as fh:
            json.dump([asdict(r) for r in part], fh)
        log = open(os.path.join(log_dir, f"warm_{w}.log"), "w")  # noqa: SIM115 (closed below)
        cmd = [sys.executable, "-m", "benchmarks.gpu_measure", "--warm-rows", spec, "--device", device]
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        procs.append((p, log, len(part)))
    for p, log, n_rows in procs:
        try:
            rc = p.wait(timeout=max(0.0, deadline - time.monotonic()))
            if rc != 0:
                notes.append(f"compile worker {p.pid} ({n_rows} rows) exited {rc}: see {log.name}")
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            notes.append(f"compile worker {p.pid} ({n_rows} rows) stopped at the compile deadline: {log.name}")
        log.close()
    return notes


# ------------------------------------------------------------------------------------------------ the run
class Clock:
    """The run's deadline: `budget` seconds from the start, less `reserve` for writing the files."""

    def __init__(self, budget_s: float, reserve_s: float, now: Callable[[], float] = time.monotonic):
        self.now = now
        self.start = now()
        self.deadline = self.start + budget_s - reserve_s

    def left(self) -> float:
        return self.deadline - self.now()

    def elapsed(self) -> float:
        return self.now() - self.start


def fits(estimate_s: float, scale: float, clock: Clock) -> bool:
    """Whether a group estimated at `estimate_s` (times `scale`, how the finished groups compared with their
    estimates, at least 1) fits the time left."""
    return estimate_s * max(1.0, scale) <= clock.left()


def measure(args, plan: list[Row], meta: dict, out_dirs: list[str], stem: str, clock: Clock) -> dict:
    import torch

    device = args.device
    records = {r.key: new_record(r) for r in plan}
    notes: list[str] = []
    meta["notes"] = notes
    meta["plan"] = {
        "budget_s": args.budget,
        "rows": len(plan),
        "estimate_s": round(budget(plan, args.compile_workers)["total"], 1),
        "profile_calls": PROFILE_CALLS,
        "replay_calls": REPLAY_CALLS,
        "replay_times": REPLAY_TIMES,
        "eager_ms": [EAGER_WARMUP_MS, EAGER_REP_MS],
        "p": P,
        "elements": args.elements,
    }

    def save():
        doc = document(meta, list(records.values()))
        return write_outputs(doc, out_dirs, stem)

    if args.compile_workers > 0:
        t0 = time.monotonic()
        cap = min(args.compile_cap, clock.left() - 30)
        log_dir = args.log_dir or tempfile.mkdtemp(prefix="gpu_measure_warm_")
        os.makedirs(log_dir, exist_ok=True)
        env = child_env(args.wheel_dir)
        notes += run_compile_workers(plan, args.compile_workers, time.monotonic() + max(0.0, cap), log_dir, env, device)
        meta["compile_s"] = round(time.monotonic() - t0, 1)
        print(f"compile workers: {meta['compile_s']} s", flush=True)
    if device == "cuda":
        meta["marker_kernel"] = marker_name()
    spent_est, spent_real = 0.0, 0.0
    for (dtype, n), rows in groups_of(plan):
        est = group_seconds(rows)
        scale = spent_real / spent_est if spent_est > 0 else 1.0
        if not fits(est, scale, clock):
            for r in rows:
                records[r.key]["status"] = "skipped"
                records[r.key]["notes"].append(f"budget: group estimate {est:.1f} s x {scale:.2f} > left")
            notes.append(f"group {dtype} N={n} skipped: estimate {est:.1f} s x {scale:.2f} > {clock.left():.1f} s left")
            print(notes[-1], flush=True)
            continue
        g0 = clock.elapsed()
        measure_group(rows, records, dtype, n, device, args, clock)
        finish_group([records[r.key] for r in rows])
        spent_est += est
        spent_real += clock.elapsed() - g0
        print(f"group {dtype} N={n}: {clock.elapsed() - g0:.1f} s (estimated {est:.1f} s)", flush=True)
        save()
        if device == "cuda":
            torch.cuda.empty_cache()
    meta["elapsed_s"] = round(clock.elapsed(), 1)
    paths = save()
    print("wrote " + ", ".join(paths))
    return document(meta, list(records.values()))


def measure_group(rows: list[Row], records: dict, dtype: str, n: int, device: str, args, clock: Clock) -> None:
    t = make_inputs(dtype, n, device, elements=rows[0].elements)
    live: list[tuple[int, Callable]] = []
    for i, row in enumerate(rows):
        rec = records[row.key]
        if clock.left() <= 0:
            rec["status"] = "skipped"
            rec["notes"].append("budget: past the deadline before warm-up")
            continue
        try:
            fn = make_call(row, t, device)
            fn()
            fn()
            _sync(device)
            live.append((i, fn))
            rec["status"] = "measuring"
        except Exception as err:  # noqa: BLE001
            rec["status"] = "failed"
            rec["notes"].append(f"warm-up: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
            print(f"  {row.label()} failed: {rec['notes'][-1]}", flush=True)
    if live and clock.left() > 0:
        try:
            prof = profile_group(live, device)
            for i, _ in live:
                rec = records[rows[i].key]
                rec.update(kernel_us=prof[i]["kernel_us"], kernels=prof[i]["kernels"], host_us=prof[i]["host_us"])
                if prof[i].get("error"):
                    rec["notes"].append(prof[i]["error"])
        except Exception as err:  # noqa: BLE001
            for i, _ in live:
                records[rows[i].key]["notes"].append(f"profile: {type(err).__name__}: {err}")
    for phase in ("eager", "replay"):
        if phase == "replay" and device != "cuda":
            continue
        for i, fn in live:
            rec = records[rows[i].key]
            if clock.left() <= 0:
                rec["notes"].append(f"budget: {phase} not timed")
                continue
            try:
                if phase == "eager":
                    rec["eager_us"] = time_eager(fn, device)
                else:
                    rec["replay_us"] = time_replay(lambda row=rows[i]: make_call(row, t, device))
            except Exception as err:  # noqa: BLE001
                rec["notes"].append(f"{phase}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
                _sync(device)
    for i, _ in live:
        r = records[rows[i].key]
        print(
            f"  {rows[i].label():44s} kernel {_fmt(r['kernel_us'], 1)} us  replay {_fmt(r['replay_us'], 1)} us  "
            f"eager {_fmt(r['eager_us'], 1)} us  host {_fmt(r['host_us'], 1)} us",
            flush=True,
        )
    live.clear()


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


# ------------------------------------------------------------------------------------------------ the model
def model_gpu(name: str):
    """tools.roofline's description of the measured GPU: H200 where the name says so, else H100."""
    from tools import roofline as R

    return R.H200 if "H200" in name.upper() else R.H100


def attach_model(doc: dict, estimate: Callable[[list[dict]], dict]) -> int:
    """Fills each model row's model_frac from `estimate(rows) -> {(model_op, model_direction, backend, dtype, n):
    fraction}`; returns how many rows got one."""
    rows = [r for r in doc["rows"] if r.get("model_op") and r["backend"] in BACKENDS]
    est = estimate(rows)
    filled = 0
    for r in rows:
        v = est.get((r["model_op"], MODEL_DIRECTION[r["direction"]], r["backend"], r["dtype"], r["n"]))
        r["model_frac"] = v
        filled += v is not None
    return filled


def roofline_estimate(gpu, jobs: int) -> Callable[[list[dict]], dict]:
    def estimate(rows: list[dict]) -> dict:
        from tools import roofline as R

        out = {}
        for backend in sorted({r["backend"] for r in rows}):
            sel = [r for r in rows if r["backend"] == backend]
            got = R.gpuopt_rows(
                backends=(backend,),
                dtypes=tuple(sorted({r["dtype"] for r in sel})),
                ns=tuple(sorted({r["n"] for r in sel})),
                ops=tuple(sorted({r["model_op"] for r in sel})),
                gpu=gpu,
                jobs=jobs,
            )
            out.update({(g.op, g.direction, g.backend, g.dtype, g.N): round(g.estimate, 4) for g in got})
        return out

    return estimate


# ------------------------------------------------------------------------------------------------ command line
def _csv_list(text: str, allowed, kind: str, ap) -> tuple:
    vals = tuple(s for s in text.split(",") if s)
    for v in vals:
        if v not in allowed:
            ap.error(f"unknown {kind} {v!r}; choose from {tuple(allowed)}")
    return vals


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_measure",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--dry-run", action="store_true", help="print the plan and its time budget; measure nothing")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the whole run (default 300)")
    ap.add_argument("--ops", default=",".join(DEFAULT_OPS), help=f"comma list of {tuple(OPS)} (default: all but "
                    "gated_silu_packed)")  # fmt: skip
    ap.add_argument("--directions", default=",".join(DIRECTIONS))
    ap.add_argument("--backends", default=None, help="comma list of cuda,triton (default both; --device cpu: cpu)")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--ns", default=",".join(map(str, NS)))
    ap.add_argument(
        "--gated-ns",
        default=None,
        help="comma list of F for every gated op (default: GATED_NS, " + "; ".join(
            f"{op} {','.join(map(str, ns))}" for op, ns in GATED_NS.items()) + ")",
    )  # fmt: skip
    ap.add_argument("--no-peers", action="store_true", help="leave out the liger and quack LayerNorm rows")
    ap.add_argument("--wheel", default=None, help="the gpuopt wheel, unpacked and put first on sys.path")
    ap.add_argument(
        "--out-dir",
        action="append",
        default=None,
        help="folder for <date>-<gpu>-<commit>.json/.md (repeatable; default docs/measurements)",
    )
    ap.add_argument("--commit", default=None, help="the commit of the measured build (default: git of the checkout)")
    ap.add_argument(
        "--compile-workers",
        type=int,
        default=COMPILE_WORKERS,
        help="processes compiling the Triton rows before measuring (0: compile in-process)",
    )
    ap.add_argument("--log-dir", default=None, help="the compile workers' logs (default: a temporary folder)")
    ap.add_argument("--compile-cap", type=float, default=150.0, help="seconds the compile workers may take at most")
    ap.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cuda",
        help="cpu: a smoke run of the same loop on the C++ CPU kernels (no kernel or replay times)",
    )
    ap.add_argument("--elements", type=int, default=ELEMENTS, help="M x N of every row (default 2^26)")
    ap.add_argument("--ncu", action="store_true", help="the ncu counters of six kernels instead of the rows")
    ap.add_argument(
        "--attach-model",
        metavar="FILE",
        default=None,
        help="fill model_frac of a measurement file from tools.roofline (no GPU needed)",
    )
    ap.add_argument("--model-jobs", type=int, default=max(1, min(8, os.cpu_count() or 1)))
    ap.add_argument("--warm-rows", default=None, help=argparse.SUPPRESS)  # a compile worker's rows (JSON)
    ap.add_argument("--ncu-target", type=int, default=None, help=argparse.SUPPRESS)  # inside ncu
    ap.add_argument("--wheel-dir", default=None, help=argparse.SUPPRESS)  # fmt: skip
    a = ap.parse_args(argv)
    a.ops = _csv_list(a.ops, OPS, "op", ap)
    a.directions = _csv_list(a.directions, DIRECTIONS, "direction", ap)
    allowed = BACKENDS if a.device == "cuda" else ("cpu", "triton")
    a.backends = _csv_list(a.backends or ",".join(BACKENDS if a.device == "cuda" else ("cpu",)), allowed,
                           "backend", ap)  # fmt: skip
    a.dtypes = _csv_list(a.dtypes, DTYPES, "dtype", ap)
    try:
        a.ns = tuple(int(s) for s in a.ns.split(",") if s)
    except ValueError:
        ap.error(f"--ns: comma list of integers, got {a.ns!r}")
    for n in a.ns:
        if not 0 < n <= a.elements:
            ap.error(f"--ns: N = {n} must be in 1 .. --elements ({a.elements})")
    if a.gated_ns is not None:
        try:
            fs = tuple(int(s) for s in a.gated_ns.split(",") if s)
        except ValueError:
            ap.error(f"--gated-ns: comma list of integers, got {a.gated_ns!r}")
        for n in fs:
            if not 0 < n <= a.elements:
                ap.error(f"--gated-ns: F = {n} must be in 1 .. --elements ({a.elements})")
        a.gated_ns = {op: fs for op in GATED_OPS}
    a.out_dir = a.out_dir or [str(ROOT / "docs" / "measurements")]
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.wheel:
        args.wheel_dir = unpack_wheel(args.wheel)
    elif args.wheel_dir:
        sys.path.insert(0, args.wheel_dir)
    if args.warm_rows:
        with open(args.warm_rows) as fh:
            rows = [Row(**r) for r in json.load(fh)]
        warm_rows(rows, args.device)
        return 0  # failures are printed: the measuring process meets them again and records them
    if args.ncu_target is not None:
        return ncu_target(args.ncu_target)
    if args.attach_model:
        with open(args.attach_model) as fh:
            doc = json.load(fh)
        gpu = model_gpu(doc["gpu"])
        filled = attach_model(doc, roofline_estimate(gpu, args.model_jobs))
        doc["model"] = {"gpu": gpu.name, "source": "tools.roofline.gpuopt_rows", "rows": filled}
        stem = os.path.splitext(args.attach_model)[0]
        write_outputs(doc, [os.path.dirname(os.path.abspath(args.attach_model))], os.path.basename(stem))
        print(f"model ({gpu.name}) attached to {filled} rows of {args.attach_model}")
        return 0
    if args.dry_run:
        peers = [] if args.no_peers or "bf16" not in args.dtypes else list(PEER_BACKENDS)
        plan = build_plan(
            args.ops, args.directions, args.backends, args.dtypes, args.ns, peers, args.elements, args.gated_ns
        )
        print(plan_text(plan, args.budget, args.compile_workers))
        if peers:
            print("(the liger and quack rows run only where those packages import)")
        return 0
    clock = Clock(args.budget, ASSUMPTIONS.write_s)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_measure: no CUDA device (use --dry-run, or --device cpu for a smoke run)", file=sys.stderr)
        return 2
    meta = machine_meta(args.device, args.commit)
    stem = output_stem(meta["date"], meta["gpu"], meta["commit"])
    if args.ncu:
        run_ncu(args, meta, args.out_dir, stem)
        return 0
    peers = [] if (args.no_peers or args.device != "cuda") else peers_importable()
    plan = build_plan(
        args.ops, args.directions, args.backends, args.dtypes, args.ns, peers, args.elements, args.gated_ns
    )
    b = budget(plan, args.compile_workers)
    print(f"gpu_measure: {len(plan)} rows on {meta['gpu']}, estimated {b['total']:.0f} s, budget {args.budget:.0f} s",
          flush=True)  # fmt: skip
    doc = measure(args, plan, meta, args.out_dir, stem, clock)
    done = sum(r["status"] == "measured" for r in doc["rows"])
    print(f"{done} of {len(doc['rows'])} rows measured in {clock.elapsed():.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
