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
still leaves what it measured. --dry-run prints the plan with each row's estimate from ASSUMPTIONS
(benchmarks/measure_plan.py).

The gpuopt wheel: --wheel unpacks it into a temporary folder put first on sys.path (so the checkout's gpuopt_ops,
which has no compiled extension, does not shadow it); without --wheel, gpuopt_ops is imported as installed
(benchmarks/gpu_check.sh installs the wheel into its own folder first). Nothing is installed. The file's name
carries --commit (gpu_check.sh: GPU_CHECK_COMMIT), else the checkout's git commit, else "unknown".

The code: this file runs the groups and reads the command line; benchmarks/measure_plan.py holds the rows, the
constants and the estimate, measure_calls.py the calls and their timing, measure_results.py the records and the
files, measure_machine.py the wheel, the metadata and the compile workers, measure_ncu.py the --ncu step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable

from benchmarks.measure_calls import make_call, make_inputs, marker_name, profile_group, sync, time_eager, time_replay
from benchmarks.measure_machine import (
    child_env,
    machine_meta,
    peers_importable,
    run_compile_workers,
    unpack_wheel,
    warm_rows,
)
from benchmarks.measure_ncu import ncu_target, run_ncu
from benchmarks.measure_plan import (
    ASSUMPTIONS,
    BACKENDS,
    BUDGET_S,
    COMPILE_WORKERS,
    DEFAULT_OPS,
    DIRECTIONS,
    DTYPES,
    EAGER_REP_MS,
    EAGER_WARMUP_MS,
    ELEMENTS,
    GATED_NS,
    GATED_OPS,
    MODEL_DIRECTION,
    NS,
    OPS,
    PEER_BACKENDS,
    PROFILE_CALLS,
    REPLAY_CALLS,
    REPLAY_TIMES,
    ROOT,
    P,
    Row,
    budget,
    build_plan,
    group_seconds,
    groups_of,
    plan_text,
)
from benchmarks.measure_results import cell, document, finish_group, new_record, output_stem, write_outputs


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
            sync(device)
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
                sync(device)
    for i, _ in live:
        r = records[rows[i].key]
        print(
            f"  {rows[i].label():44s} kernel {cell(r['kernel_us'], 1)} us  replay {cell(r['replay_us'], 1)} us  "
            f"eager {cell(r['eager_us'], 1)} us  host {cell(r['host_us'], 1)} us",
            flush=True,
        )
    live.clear()


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
