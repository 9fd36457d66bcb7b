"""benchmarks/gpu_measure.py's plan: the rows, their order, the constants of the run and the dry run's time
estimate (ASSUMPTIONS). The method is in gpu_measure's docstring."""

from __future__ import annotations

import json
import math
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
