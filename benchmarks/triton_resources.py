"""Compile-time resource table of the Triton kernels for sm_90 (H100/H200), made without a GPU:
`python -m benchmarks.triton_resources [--markdown | --summary | --json] [--quick] [--sm-count 132]`.

How: the project's own launchers (gpuopt_ops.triton_kernels ... launch_forward / launch_backward) run on *meta*
tensors with `wrap=` replaced by a hook that, instead of launching, compiles the launch with Triton's toolchain
for GPUTarget("cuda", 90, 32) (bundled ptxas; no device needed). The hook builds the signature, constexprs and
the specialization attributes (pointer 16-byte alignment, integer divisibility by 16, == 1) with Triton's own
binder and JITFunction._pack_args, i.e. exactly as a real launch does (a meta tensor's data_ptr() is 0, and
torch's CUDA allocations are 512-byte aligned, so "16-byte aligned" is what a launch on fresh tensors gets).

Recorded per compiled variant: registers per thread and spill bytes from `ptxas -v` (Triton runs ptxas with -v;
the log is captured), shared memory from the kernel metadata, num_warps, the grid the launcher chose, and the
blocks per SM those registers/warps/shared memory allow (benchmarks.cuda_resources.occupancy: 65536 registers
and 64 warps per SM, 32 blocks per SM, 228 KiB shared per SM). All figures are compile-time facts; none is a
measured speed.

Gate (exit status 1): any variant that spills or needs more than 227 KiB of shared memory per block.
Needs the triton package with its NVIDIA backend (ships with Linux CUDA builds of torch); TRITON_INTERPRET must
not be set when triton is imported (the script clears it; a process that already imported the kernels
interpreted cannot use this module).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import tempfile
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Tuple

os.environ.pop("TRITON_INTERPRET", None)
# A private cache: a cache hit would skip ptxas, and its -v log is where registers and spills come from.
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="gpuopt-triton-resources-"))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from benchmarks.cuda_resources import SM90, occupancy  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
SHARED_LIMIT = SM90.shared_per_block  # 227 KiB per block on sm_90
DEFAULT_SM_COUNT = 132  # H100 SXM / H200
NS = (768, 1024, 2048, 4096, 8192, 16384)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ROWS = 16384  # rows of the meta launches (only the grids depend on it)
_DTYPE_NAME = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


def _kernels():
    import gpuopt_ops.triton_ops  # noqa: F401  (makes gpuopt_ops.triton_kernels importable from a source tree)
    from gpuopt_ops.triton_kernels import bias_relu as BR
    from gpuopt_ops.triton_kernels import layer_norm_dropout_relu as L

    if L.INTERPRETED:
        raise RuntimeError("benchmarks.triton_resources: the Triton kernels were imported with TRITON_INTERPRET=1 "
                           "in this process; run the script in a fresh process without it")
    return L, BR


@dataclass
class Variant:
    kernel: str
    num_warps: int
    constexprs: str
    regs: int
    spill_stores: int
    spill_loads: int
    shared: int
    blocks_per_sm: int
    limited_by: str


@dataclass
class Row:
    op: str
    dtype: str
    n: int
    kernel: str
    grid: str
    num_warps: int
    regs: int
    spills: int  # spill stores + loads, bytes
    shared: int
    blocks_per_sm: int
    limited_by: str
    programs_per_sm: float  # the launcher's grid / SM count (the grid's first axis times the others)


_PTXAS_RE = re.compile(r"Used (\d+) registers")
_SPILL_RE = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


class Compiler:
    """Compiles launches for sm_90 instead of running them; one compile per distinct specialization."""

    def __init__(self):
        from triton.compiler import make_backend
        from triton.runtime.jit import create_function_from_signature

        self.backend = make_backend(TARGET)
        self._binders = {}
        self._make_binder = create_function_from_signature
        self.cache: Dict[Tuple, Variant] = {}
        self.launches: List[Tuple[Variant, Tuple[int, ...]]] = []

    def _binder(self, kernel):
        if kernel not in self._binders:
            self._binders[kernel] = self._make_binder(kernel.signature, kernel.params, self.backend)
        return self._binders[kernel]

    def compile(self, kernel, args, kwargs) -> Variant:
        kwargs = dict(kwargs)
        kwargs.setdefault("debug", False)
        bound, specialization, options = self._binder(kernel)(*args, **kwargs)
        key = (kernel.__name__, repr(specialization), repr(sorted(options.items())))
        if key in self.cache:
            return self.cache[key]
        opts, signature, constexprs, attrs = kernel._pack_args(self.backend, kwargs, bound, specialization, options)
        from triton import knobs

        log = io.StringIO()
        old = knobs.nvidia.dump_ptxas_log
        knobs.nvidia.dump_ptxas_log = True
        try:
            with contextlib.redirect_stdout(log):
                ck = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=TARGET,
                                    options=opts.__dict__)
        finally:
            knobs.nvidia.dump_ptxas_log = old
        text = log.getvalue()
        regs = _PTXAS_RE.findall(text)
        spills = _SPILL_RE.findall(text)
        if not regs or not spills:
            raise RuntimeError(f"no ptxas -v figures for {kernel.__name__} (cached compile?):\n{text}")
        shared = int(ck.metadata.shared)
        num_warps = int(ck.metadata.num_warps)
        occ = occupancy(int(regs[-1]), 32 * num_warps, static_shared=shared)
        consts = ",".join(f"{kernel.arg_names[k[0]]}={v}" for k, v in sorted(constexprs.items())
                          if kernel.arg_names[k[0]].startswith("BLOCK"))
        v = Variant(kernel.__name__, num_warps, consts, int(regs[-1]), int(spills[-1][0]), int(spills[-1][1]),
                    shared, occ.blocks_per_sm, "+".join(occ.limited_by))
        self.cache[key] = v
        return v

    def wrap(self, kernel):
        compiler = self

        class _Launch:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    v = compiler.compile(kernel, args, kwargs)
                    g = grid(kwargs) if callable(grid) else tuple(grid)
                    compiler.launches.append((v, tuple(int(d) for d in g)))
                return launch

        return _Launch()


def _meta(shape, dtype):
    return torch.empty(shape, dtype=dtype, device="meta")


def _call_launcher(fn, *args, _sm_count: int, **kwargs):
    return fn(*args, sm_count=_sm_count, **kwargs)  # tiling and grids: fixed rules on (N, dtype, SM count)


def launches(compiler: Compiler, op: str, dtype: torch.dtype, n: int, sm_count: int, m: int = ROWS):
    """Runs one launcher on meta tensors; returns [(Variant, grid)] of the kernels it launched."""
    L, BR = _kernels()
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    x = _meta((m, n), dtype)
    w = _meta((n,), dtype)
    mean, rstd = _meta((m,), acc), _meta((m,), acc)
    seed = _meta((1,), torch.int64)
    start = len(compiler.launches)
    if op == "ldr_fwd":
        _call_launcher(L.launch_forward, x, w, w, seed, _meta((m, n), dtype), mean, rstd, 0.1, 1e-5,
                       wrap=compiler.wrap, _sm_count=sm_count)
    elif op == "ldr_bwd":
        _call_launcher(L.launch_backward, _meta((m, n), dtype), x, w, w, mean, rstd, seed, _meta((m, n), dtype),
                       _meta((n,), dtype), _meta((n,), dtype), 0.1, wrap=compiler.wrap, _sm_count=sm_count)
    elif op == "bias_relu_fwd":
        _call_launcher(BR.launch_forward, x, w, _meta((m, n), dtype), wrap=compiler.wrap, _sm_count=sm_count)
    elif op == "bias_relu_bwd":
        _call_launcher(BR.launch_backward, _meta((m, n), dtype), x, _meta((m, n), dtype), _meta((n,), acc),
                       wrap=compiler.wrap, _sm_count=sm_count)
    else:
        raise ValueError(op)
    return compiler.launches[start:]


OPS = ("ldr_fwd", "ldr_bwd", "bias_relu_fwd", "bias_relu_bwd")


def table(ns=NS, dtypes=DTYPES, ops=OPS, sm_count: int = DEFAULT_SM_COUNT, compiler: Optional[Compiler] = None,
          m: int = ROWS) -> List[Row]:
    compiler = compiler or Compiler()
    rows = []
    for op in ops:
        for dtype in dtypes:
            for n in ns:
                for v, grid in launches(compiler, op, dtype, n, sm_count, m):
                    programs = 1
                    for d in grid:
                        programs *= d
                    rows.append(Row(op, _DTYPE_NAME[dtype], n, f"{v.kernel}[{v.constexprs}]",
                                    "x".join(map(str, grid)), v.num_warps, v.regs, v.spill_stores + v.spill_loads,
                                    v.shared, v.blocks_per_sm, v.limited_by, round(programs / sm_count, 2)))
    return rows


def failures(rows: List[Row]) -> List[str]:
    bad = []
    for r in rows:
        if r.spills:
            bad.append(f"{r.op} {r.dtype} N={r.n} {r.kernel}: {r.spills} bytes of spills")
        if r.shared > SHARED_LIMIT:
            bad.append(f"{r.op} {r.dtype} N={r.n} {r.kernel}: shared {r.shared} B > {SHARED_LIMIT} B")
        if r.blocks_per_sm < 1:
            bad.append(f"{r.op} {r.dtype} N={r.n} {r.kernel}: does not fit an SM ({r.limited_by})")
    return bad


def markdown(rows: List[Row], sm_count: int) -> str:
    out = [f"Triton {triton.__version__}, torch {torch.__version__}, target sm_90, M = {ROWS} rows, "
           f"SM count {sm_count}; registers/spills from ptxas -v, blocks/SM from registers, warps and shared "
           "memory (65536 regs, 64 warps, 32 blocks, 228 KiB per SM). Compile-time facts, not timings.", "",
           "| op | dtype | N | kernel [tile] | grid | warps | regs | spill B | shared B | blocks/SM (limit) "
           "| programs/SM |",
           "|---|---|---:|---|---|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        out.append(f"| {r.op} | {r.dtype} | {r.n} | {r.kernel} | {r.grid} | {r.num_warps} | {r.regs} | {r.spills} "
                   f"| {r.shared} | {r.blocks_per_sm} ({r.limited_by}) | {r.programs_per_sm} |")
    variants = {(r.kernel, r.dtype, r.n, r.num_warps, r.regs) for r in rows}
    out.append("")
    out.append(f"{len(rows)} launches, {len(variants)} distinct (kernel, dtype, N) compiles; max registers "
               f"{max(r.regs for r in rows)}, spilling launches {sum(1 for r in rows if r.spills)}, max shared "
               f"{max(r.shared for r in rows)} B.")
    return "\n".join(out)


def summary_markdown(rows: List[Row], sm_count: int) -> str:
    """One line per (op, N, kernel): registers as fp16 / bf16 / fp32, the worst spill and shared memory."""
    groups: Dict[Tuple[str, int, str], Dict[str, Row]] = {}
    for r in rows:
        groups.setdefault((r.op, r.n, r.kernel.split("[")[0]), {})[r.dtype] = r
    out = [f"Triton {triton.__version__}, sm_90, M = {ROWS}, {sm_count} SMs. regs, blocks/SM and programs/SM as "
           "fp16 / bf16 / fp32.", "",
           "| op | N | kernel | warps | regs | spill B | shared B (max) | blocks/SM | programs/SM |",
           "|---|---:|---|---:|---|---:|---:|---|---|"]

    def trio(d, f):
        return " / ".join(str(f(d[k])) if k in d else "-" for k in ("fp16", "bf16", "fp32"))

    for (op, n, kernel), d in groups.items():
        out.append(f"| {op} | {n} | {kernel} | {trio(d, lambda r: r.num_warps)} | {trio(d, lambda r: r.regs)} "
                   f"| {max(r.spills for r in d.values())} | {max(r.shared for r in d.values())} "
                   f"| {trio(d, lambda r: r.blocks_per_sm)} | {trio(d, lambda r: r.programs_per_sm)} |")
    out.append("")
    out.append(f"max registers {max(r.regs for r in rows)}, spilling launches {sum(1 for r in rows if r.spills)}, "
               f"max shared {max(r.shared for r in rows)} B (limit {SHARED_LIMIT} B).")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    fmt = ap.add_mutually_exclusive_group()
    fmt.add_argument("--markdown", action="store_true", help="markdown table (default: plain text)")
    fmt.add_argument("--json", action="store_true", help="JSON rows")
    fmt.add_argument("--summary", action="store_true", help="markdown, one line per (op, N, kernel)")
    ap.add_argument("--sm-count", type=int, default=DEFAULT_SM_COUNT, help="SMs of the target GPU (132: H100/H200)")
    ap.add_argument("--quick", action="store_true", help="N in {1024, 8192} only")
    args = ap.parse_args(argv)
    ns = (1024, 8192) if args.quick else NS
    rows = table(ns=ns, sm_count=args.sm_count)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
    elif args.summary:
        print(summary_markdown(rows, args.sm_count))
    elif args.markdown:
        print(markdown(rows, args.sm_count))
    else:
        for r in rows:
            print(f"{r.op:14s} {r.dtype} N={r.n:<6d} {r.kernel:55s} grid={r.grid:>10s} w={r.num_warps:<2d} "
                  f"regs={r.regs:<3d} spill={r.spills:<4d} smem={r.shared:<6d} blocks/SM={r.blocks_per_sm} "
                  f"({r.limited_by}) programs/SM={r.programs_per_sm}")
    bad = failures(rows)
    for b in bad:
        print("FAIL:", b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
