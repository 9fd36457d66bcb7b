"""Inputs of the performance model (tools.roofline) for two peers' LayerNorm kernels, to calibrate the model
against their published H100 measurements: `python -m tools.roofline_peers [--estimate]` prints every case.

The peers, and where each input comes from:

  Liger-Kernel (github.com/linkedin/Liger-Kernel), Triton, liger_kernel/ops/layer_norm.py.
    The published rows (PUBLISHED) were added to benchmark/data/all_benchmark_data.csv by commit 6a2c491
    "Layernorm enhancement (#815)", committed 2025-07-18; the rows carry the timestamp 2025-07-17 and
    liger_version 0.6.0, the version number of the source tree then. The same commit rewrote the kernels those
    rows measure: the
    forward computes in fp32, and the backward went from sm_count programs with per-program dW/dB partials
    summed by torch (the code of the 0.6.0 wheel) to one program per row that atomically adds into dW/dB
    (zeroed by torch.zeros). The first release with that code is liger-kernel 0.6.1 (0.6.2 ships the same
    layer_norm.py; the only change after 6a2c491 moves num_warps into a dict, the same launch on CUDA), so the
    calibration needs `pip install --no-deps liger-kernel==0.6.1` (LIGER_MEASURED).
    liger_layer_norm() works with whichever version is installed: it runs the real host functions
    (layer_norm_forward / layer_norm_backward) on fake CUDA tensors (torch FakeTensorMode; no GPU), with each
    `kernel[grid](...)` replaced by a recorder and torch.cuda.get_device_properties reporting `sm_count` SMs,
    logs the torch ops the host code runs (torch.zeros of dW/dB in 0.6.1, the .sum(0) of the partials in
    0.6.0) and compiles every recorded launch for sm_90 with tools.triton_resources.compile_cubin (Triton's own
    binder and bundled ptxas, the specialization a launch on fresh tensors gets).

  PyTorch nn.LayerNorm (the CSV's "huggingface" provider), aten/src/ATen/native/cuda/layer_norm_kernel.cu.
    The SASS is the installed wheel's: the sm_90 cubin of torch/lib/libtorch_cuda.so that holds
    vectorized_layer_norm_kernel, extracted once into build/roofline-cache/torch-<version>-.../ (a few seconds;
    the cache key has the library's size and mtime). Which kernels run, and their launch shapes, are mirrored from
    the host code of that file (launch_vectorized_layer_norm_kernel, LayerNormKernelImplInternal,
    LayerNormBackwardKernelImplInternal, LaunchGammaBetaBackwardCUDAKernel / ConfigureAndLaunch...) as they
    read in the source with the `rms_norm` template parameter (read from a 2026 copy of the file: the exact
    v2.14.1 file was not at hand; the wheel's symbols have the same kernels and template parameters): for a
    contiguous input with weight and bias (16-byte aligned, as fresh allocations are):
      forward   N % 4 == 0 and N <= 2**24: vectorized_layer_norm_kernel, grid (M), block (32, 4), dynamic
                shared 4 * 3 / 2 * sizeof(float) = 24 B; else RowwiseMomentsCUDAKernel (grid M, 512 threads)
                and LayerNormForwardCUDAKernel (grid M, 256 threads).
      backward  dX: layer_norm_grad_input_kernel_vectorized (N % 4 == 0; else layer_norm_grad_input_kernel),
                grid (M), 128 threads, dynamic shared (128 / 32) * 4 = 16 B. dgamma/dbeta, M <= 65536:
                GammaBetaBackwardCUDAKernelTemplate<T, float, 32, by, rows, false, aligned, false> with
                (by, rows) = (1, 8) for M < 64, (8, 64) for M < 128, (16, 128) for M < 256, else (32, 256); grid
                (ceil(N / 32), 1), block (32, by), dynamic shared (32 + 1) * by * 4 * 2; partial_reduction is
                true only when by == 1. (M > 65536 with N / 32 < SMs / 2 takes a partial-sums path: not
                mirrored here; it raises.)
    Modelled (trip counts mapped to the SASS): fp32; forward for any N; backward for N % 4 == 0 with the aligned
    GammaBeta grid (M % rows == 0, N % 32 == 0). Other cases raise ToolError.
    The measurements were taken in July 2025 with the torch of that time (the CSV does not record its version);
    the model reads the kernels of the installed wheel (torch.__version__), see torch_version().

  The published numbers: PUBLISHED, from the CSV (median ms, M = 4096, fp32, "NVIDIA H100 80GB HBM3" = H100
  SXM, 3.35 TB/s), as a fraction of peak: bytes / time / 3.35e12 with bytes = 2 * M * N * 4 (forward) or
  3 * M * N * 4 (backward). Only N >= 4096: smaller tensors fit in the 50 MB L2. verify_published() checks the
  table against a copy of the CSV.

Bytes of a launch (KernelLaunch.bytes): the DRAM bytes it moves by its design: every tensor read or written,
re-reads of row data included (torch's kernels read each row twice: a statistics pass and an output pass), but
each parameter vector (weight, bias, dW/dB targets of atomics) once: every program re-reads them, from L1/L2.
The second pass of torch's forward is declared as re-read bytes (KernelLaunch.reread_bytes, one row per block):
the model serves it from L2 as far as the rows in flight fit there. Atomics (Liger 0.6.1's dW/dB) are not in
`bytes`: the model counts them from the SASS. `l2_rereads=True` (a sensitivity check, not the calibration) adds
the per-program re-reads of the parameter vectors to `bytes` and `read_bytes`.
`harness=True` adds what the benchmark times besides the op: in backward mode, `y.backward(dy)` accumulates
weight.grad and bias.grad (`grad += new`, one add of N elements each; x.grad is reset to None, so dX is taken
without a copy).

Trip counts (KernelLaunch.trips) are callables that find each loop of the SASS by its structure (global loads,
stores, atomics and their widths in the loop's own instructions) and raise ToolError when the code has a
structure these functions were not written for.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import math
import os
import re
import shutil
import sys
import tempfile
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union
from unittest import mock

import torch

from tools import cuda_resources as CR
from tools import sass as S
from tools.cuda_resources import ToolError
from tools.roofline import H100, KernelLaunch, OpaqueLaunch, compiled_triton_launch, estimate

Launch = Union[KernelLaunch, OpaqueLaunch]

ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = ROOT / "build" / "roofline-cache"
SM_COUNT = 132  # H100 SXM
PEAK_BW = 3.35e12  # H100 SXM HBM3, bytes / s
M_ROWS = 4096  # the benchmark's M
EPS = 1e-6  # the benchmark's eps
LIGER_MEASURED = ("0.6.1", "0.6.2")  # releases with the layer_norm.py of commit 6a2c491 (the measured code)
LIGER_INSTALL = "pip install --no-deps liger-kernel==0.6.1"
ACC = 4  # torch's mean / rstd are float for fp32, fp16 and bf16 inputs

_ELEM = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}
_MANGLED_T = {torch.float32: "f", torch.float16: "N3c104HalfE", torch.bfloat16: "N3c108BFloat16E"}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _elem(dtype: torch.dtype) -> int:
    if dtype not in _ELEM:
        raise ToolError(f"dtype {dtype}: only float32, float16 and bfloat16 are modelled")
    return _ELEM[dtype]


# ----------------------------------------------------------------------------------------------------------------
# Loop structure: what a loop's own instructions move
@dataclass(frozen=True)
class LoopShape:
    """The global memory operations of a loop's own instructions, by width."""

    loads: int  # LDG of any width
    wide_loads: int  # LDG.128
    stores: int
    wide_stores: int  # STG.128
    atomics: int
    barrier: bool  # BAR.SYNC in the body
    reentry: bool  # closed by an unconditional BRA and holds an EXIT: a jump back from out-of-line code (the
    # slow path of a warp-collective taken only by a divergent warp, see tools.sass.loops), not a source loop

    @property
    def global_ops(self) -> int:
        return self.loads + self.stores + self.atomics


def loop_shape(lp) -> LoopShape:
    def count(base: str, wide: bool = False) -> int:
        return sum(1 for i in lp.own if i.base == base and (not wide or ".128" in i.opcode))

    back = [i for i in lp.body if i.addr == lp.tail]
    unconditional = bool(back) and back[0].pred is None
    return LoopShape(
        loads=count("LDG"),
        wide_loads=count("LDG", True),
        stores=count("STG"),
        wide_stores=count("STG", True),
        atomics=sum(1 for i in lp.own if i.base in ("RED", "REDG", "ATOM", "ATOMG")),
        barrier=any(i.base == "BAR" for i in lp.body),
        reentry=unconditional and any(i.base == "EXIT" for i in lp.body),
    )


def _unexpected(kernel: str, lps: list, why: str) -> ToolError:
    shapes = "; ".join(f"loop {lp.index} [{lp.head:#x}, {lp.tail:#x}] {loop_shape(lp)}" for lp in lps)
    return ToolError(f"{kernel}: unexpected loop structure ({why}); the loops: {shapes}")


def _per_thread(items: int, threads: int) -> list[int]:
    """Items each thread of a block handles in `for (i = tid; i < items; i += threads)`."""
    return [_cdiv(items - t, threads) if t < items else 0 for t in range(threads)]


def _unrolled(items: int, threads: int, u: int) -> tuple[float, float]:
    """(remainder trips, main trips), averaged over the threads, of a loop nvcc unrolled by u: it runs count % u
    single iterations first, then count // u unrolled ones (the count of each thread from _per_thread)."""
    counts = _per_thread(items, threads)
    return sum(c % u for c in counts) / threads, sum(c // u for c in counts) / threads


# ----------------------------------------------------------------------------------------------------------------
# PyTorch: the cubin of the installed wheel
def torch_version() -> str:
    return torch.__version__


def torch_cubin() -> Path:
    """The sm_90 cubin of the installed libtorch_cuda.so that holds the LayerNorm kernels (extracted once)."""
    so = Path(torch.__file__).resolve().parent / "lib" / "libtorch_cuda.so"
    if not so.is_file():
        raise ToolError(f"{so} not found: the installed torch ({torch.__version__}) is not a CUDA build")
    st = so.stat()
    out = CACHE_DIR / f"torch-{torch.__version__}-{st.st_size}-{st.st_mtime_ns}" / "layer_norm_kernel.sm_90.cubin"
    if out.is_file():
        return out
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE_DIR, prefix="extract-") as tmp:
        found = S.extract_cubins(so, "sm_90", "vectorized_layer_norm_kernel", tmp)
        if len(found) != 1:
            raise ToolError(f"{len(found)} sm_90 cubins of {so} hold vectorized_layer_norm_kernel (expected 1)")
        out.parent.mkdir(parents=True, exist_ok=True)
        part = out.with_suffix(".part")
        shutil.copyfile(found[0], part)
        os.replace(part, out)
    return out


@functools.cache
def cubin_resources(code: Path) -> dict[str, tuple[int, int]]:
    """{function: (registers, static shared bytes)} of a bare cubin, from `cuobjdump --dump-resource-usage` (whose
    output for a bare cubin has no per-ELF headers, which tools.cuda_resources.parse_resource_usage expects)."""
    text = CR._run([CR.find_cuobjdump(), "--dump-resource-usage", str(code)]).stdout
    out: dict[str, tuple[int, int]] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"\s*Function (\S+):\s*$", line)
        if m:
            name = m.group(1)
            continue
        regs, shared = re.search(r"\bREG:(\d+)", line), re.search(r"\bSHARED:(\d+)", line)
        if name and regs and shared:
            out[name] = (int(regs.group(1)), int(shared.group(1)))
            name = None
    if not out:
        raise ToolError(f"cuobjdump --dump-resource-usage printed no functions for {code}")
    return out


def _torch_symbol(code: Path, fragment: str) -> str:
    names = [n for n in cubin_resources(code) if fragment in n]
    if len(names) != 1:
        raise ToolError(f"{len(names)} functions of {code} contain {fragment!r} (expected 1): {names[:4]}")
    return names[0]


def _torch_kernel(
    code: Path, name: str, template: str, grid: tuple[int, ...], block: tuple[int, ...], **kw
) -> KernelLaunch:
    symbol = _torch_symbol(code, f"{len(name)}{name}I{template}E")
    regs, shared = cubin_resources(code)[symbol]
    grid = tuple(grid) + (1,) * (3 - len(grid))
    block = tuple(block) + (1,) * (3 - len(block))
    return KernelLaunch(code, symbol, grid, block, regs=regs, shared=shared, label=f"torch {name}", **kw)


# Trip counts of torch's kernels (T = the element type, 4-element vectors, per thread of the block)
def _trips_vectorized_forward(n: int, threads: int, warps_y: int) -> Callable[[list], dict[int, float]]:
    """vectorized_layer_norm_kernel: compute_stats' loop over the row's vectors (unrolled by 4: a remainder loop
    with one 16-byte load, a main loop with four), the inter-warp reduction loop (barriers; log2(blockDim.y)
    passes), and the output loop in four variants by which of gamma / beta is given, each unrolled by 4: the one
    that runs (both given) has the most loads per store (x, 4 gamma and 4 beta values per vector)."""

    def trips(lps: list) -> dict[int, float]:
        rem, main = _unrolled(n // 4, threads, 4)
        shapes = {lp.index: loop_shape(lp) for lp in lps}
        out: dict[int, float] = {}
        stats = [lp for lp in lps if shapes[lp.index].wide_loads and not shapes[lp.index].stores]
        outs = [lp for lp in lps if shapes[lp.index].stores]
        sync = [lp for lp in lps if not shapes[lp.index].global_ops and shapes[lp.index].barrier]
        if len(stats) != 2 or len(sync) != 1 or len(outs) < 2 or len(stats) + len(sync) + len(outs) != len(lps):
            raise _unexpected("vectorized_layer_norm_kernel", lps, "want 2 statistics loops, 1 reduction, output")
        small, big = sorted(stats, key=lambda lp: shapes[lp.index].wide_loads)
        if shapes[big.index].wide_loads != 4 * shapes[small.index].wide_loads:
            raise _unexpected("vectorized_layer_norm_kernel", lps, "statistics loop not unrolled by 4")
        out[small.index], out[big.index] = rem, main
        out[sync[0].index] = math.log2(warps_y)
        ratio = {lp.index: shapes[lp.index].loads / shapes[lp.index].stores for lp in outs}
        top = max(ratio.values())
        both = sorted((lp for lp in outs if ratio[lp.index] == top), key=lambda lp: shapes[lp.index].stores)
        if len(both) != 2 or shapes[both[1].index].stores != 4 * shapes[both[0].index].stores:
            raise _unexpected("vectorized_layer_norm_kernel", lps, "no remainder + main output loop pair")
        for lp in outs:
            out[lp.index] = 0.0  # the variants without gamma or beta
        out[both[0].index], out[both[1].index] = rem, main
        return out

    return trips


def _trips_grad_input_vectorized(n: int, threads: int) -> Callable[[list], dict[int, float]]:
    """layer_norm_grad_input_kernel_vectorized: two passes over the row's vectors (not unrolled), each in a
    variant with gamma (three 16-byte loads: gamma, X, dY) and one without (two), then scalar tail loops (none
    run: the kernel is used only when N % 4 == 0). The second pass stores dX (one 16-byte store). Loops that jump
    back from the warp-collective slow paths of BlockReduceSum run at most once."""

    def trips(lps: list) -> dict[int, float]:
        per_thread = sum(_per_thread(n // 4, threads)) / threads
        out: dict[int, float] = {}
        first = second = 0
        for lp in lps:
            s = loop_shape(lp)
            if s.reentry and not s.global_ops:
                out[lp.index] = 1.0
            elif s.wide_loads == 3 and s.loads == 3 and s.stores == 0:
                out[lp.index], first = per_thread, first + 1
            elif s.wide_loads == 3 and s.loads == 3 and s.wide_stores == 1 and s.stores == 1:
                out[lp.index], second = per_thread, second + 1
            elif s.global_ops and not s.atomics:
                out[lp.index] = 0.0  # without gamma, or a scalar tail
            else:
                raise _unexpected("layer_norm_grad_input_kernel_vectorized", lps, f"loop {lp.index}")
        if first != 1 or second != 1:
            raise _unexpected("layer_norm_grad_input_kernel_vectorized", lps, "want one loop per pass with gamma")
        return out

    return trips


def _trips_gamma_beta(m: int, rows_per_block: int, grid_y: int) -> Callable[[list], dict[int, float]]:
    """GammaBetaBackwardCUDAKernelTemplate: the loop over the block's row tiles (M_start += rows * gridDim.y;
    the tile's rows unrolled: loads of dY and X per row, plus mean and rstd) holds every global load. After it,
    the transposed reduction loop (i = warp_id; i < 32; i += warps) runs once per warp, in three variants by which
    of dgamma / dbeta is given: the one that runs stores both (two stores); the others do not run. Loops that jump
    back from the warp-collective slow paths run at most once."""

    def trips(lps: list) -> dict[int, float]:
        out: dict[int, float] = {}
        data = [lp for lp in lps if loop_shape(lp).loads]
        if len(data) != 1 or data[0].depth != 0:
            raise _unexpected("GammaBetaBackwardCUDAKernelTemplate", lps, "want one loop with the loads")
        out[data[0].index] = _cdiv(m, rows_per_block * grid_y)
        running = 0
        for lp in lps:
            if lp.index in out:
                continue
            s = loop_shape(lp)
            if s.reentry and not s.loads:
                out[lp.index] = 1.0
            elif not s.loads and not s.atomics:
                out[lp.index] = 1.0 if s.stores == 2 else 0.0
                running += s.stores == 2
            else:
                raise _unexpected("GammaBetaBackwardCUDAKernelTemplate", lps, f"loop {lp.index}")
        if running != 1:
            raise _unexpected("GammaBetaBackwardCUDAKernelTemplate", lps, "want one reduction loop storing both")
        return out

    return trips


def _trips_strided(kernel: str, n: int, threads: int, loads_of_running: int) -> Callable[[list], dict[int, float]]:
    """RowwiseMomentsCUDAKernel / LayerNormForwardCUDAKernel (the forward path for N % 4 != 0): loops
    `for (j = tid; j < N; j += blockDim.x)`, not unrolled; of the variants (by which of gamma / beta is given) the
    one with `loads_of_running` loads runs; other data loops do not; re-entry loops run at most once."""

    def trips(lps: list) -> dict[int, float]:
        per_thread = sum(_per_thread(n, threads)) / threads
        out: dict[int, float] = {}
        running = 0
        for lp in lps:
            s = loop_shape(lp)
            if s.reentry:
                out[lp.index] = 1.0
            elif s.loads == loads_of_running:
                out[lp.index], running = per_thread, running + 1
            elif s.global_ops:
                out[lp.index] = 0.0
            else:
                out[lp.index] = 1.0
        if running < 1:
            raise _unexpected(kernel, lps, f"no loop with {loads_of_running} loads")
        return out

    return trips


@dataclass(frozen=True)
class LayerNormCase:
    """The LayerNorm call a peer model reads (torch_layer_norm, liger_layer_norm): an (M, N) input of `dtype` with
    weight and bias, forward or backward; l2_rereads: the parameters' re-reads by each program counted as DRAM
    bytes; harness: the benchmark harness's gradient accumulation after a backward (the published measurements
    time it)."""

    N: int
    M: int = M_ROWS
    dtype: torch.dtype = torch.float32
    direction: str = "forward"
    l2_rereads: bool = False
    harness: bool = False


def torch_layer_norm(case: LayerNormCase) -> list[Launch]:
    """The launches nn.LayerNorm (weight and bias, contiguous input, fresh aligned tensors) makes on sm_90 for the
    case, with the kernels of the installed torch wheel; see the module docstring. Modelled: fp32 (the loop
    structures of the fp16 / bf16 instantiations, with 8-byte vectors, are not mapped); in backward, N % 4 == 0 (the
    vectorized dX kernel) and the aligned GammaBeta grid (M % rows == 0, N % 32 == 0)."""
    N, M, dtype, direction, l2_rereads = case.N, case.M, case.dtype, case.direction, case.l2_rereads
    if dtype != torch.float32:
        raise ToolError(f"torch_layer_norm models fp32 only (got {dtype})")
    e, t, code = _elem(dtype), _MANGLED_T[dtype], torch_cubin()
    if direction == "forward":
        return _torch_layer_norm_forward(code, t, N, M, e, l2_rereads)
    if direction != "backward":
        raise ValueError(direction)
    return _torch_layer_norm_backward(code, t, N, M, e, l2_rereads, case.harness)


def _torch_layer_norm_forward(code, t: str, N: int, M: int, e: int, l2_rereads: bool) -> list[Launch]:
    """nn.LayerNorm's forward: the vectorized kernel (N % 4 == 0), else row moments, then the output."""
    mn = M * N
    vectorized = N % 4 == 0 and N <= 1 << 24
    out: list[Launch] = []
    if vectorized:
        block = (32, 4)  # (warp size, num_threads() / warp size), num_threads() = 128
        params = 2 * N * e * (M if l2_rereads else 1)
        out.append(
            _torch_kernel(
                code,
                "vectorized_layer_norm_kernel",
                f"{t}fLb0",
                (M,),
                block,
                elements=mn,
                bytes=3 * mn * e + params + 2 * M * ACC,  # x read twice (statistics, output), y written
                read_bytes=2 * mn * e + params,
                reread_bytes=mn * e,  # the output pass re-reads the row the statistics pass read
                reuse_unit_bytes=N * e,
                dynamic_shared=block[1] * 3 // 2 * ACC,
                trips=_trips_vectorized_forward(N, block[0] * block[1], block[1]),
            )
        )
        return out
    out.append(
        _torch_kernel(
            code,
            "RowwiseMomentsCUDAKernel",
            f"{t}fLb0",
            (M,),
            (512,),  # cuda_utils::kCUDABlockReduceNumThreads
            elements=mn,
            bytes=mn * e + 2 * M * ACC,
            read_bytes=mn * e,
            trips=_trips_strided("RowwiseMomentsCUDAKernel", N, 512, 1),
        )
    )
    params = 2 * N * e * (M if l2_rereads else 1)
    out.append(
        _torch_kernel(
            code,
            "LayerNormForwardCUDAKernel",
            f"{t}fLb0",
            (M,),
            (256,),  # kCUDANumThreads
            elements=mn,
            bytes=2 * mn * e + params + 2 * M * ACC,
            read_bytes=mn * e + params + 2 * M * ACC,
            trips=_trips_strided("LayerNormForwardCUDAKernel", N, 256, 5),  # x, mean, rstd, gamma, beta
        )
    )
    return out


def _torch_layer_norm_backward(code, t: str, N: int, M: int, e: int, l2_rereads: bool, harness: bool) -> list[Launch]:
    """nn.LayerNorm's backward: the vectorized dX kernel, then GammaBeta (aligned grid), then the harness's
    gradient accumulation where asked."""
    mn = M * N
    out: list[Launch] = []
    by, rows = (1, 8) if M < 64 else (8, 64) if M < 128 else (16, 128) if M < 256 else (32, 256)
    aligned = M % rows == 0 and N % 32 == 0
    if N % 4 or not aligned:
        raise ToolError(
            f"backward M={M} N={N}: only N % 4 == 0 with M % {rows} == 0 and N % 32 == 0 is modelled (the scalar dX "
            "kernel and the unaligned GammaBeta variant have loop structures not mapped here)"
        )
    # dX: two passes over x and dY per row (sums, then dX), gamma read in both
    gamma = 2 * N * e * (M if l2_rereads else 1)
    name = "layer_norm_grad_input_kernel_vectorized"
    out.append(
        _torch_kernel(
            code,
            name,
            f"{t}fLb0",
            (M,),
            (128,),
            elements=mn,
            bytes=5 * mn * e + gamma + 2 * M * ACC,
            read_bytes=4 * mn * e + gamma + 2 * M * ACC,
            dynamic_shared=(128 // 32) * ACC,
            trips=_trips_grad_input_vectorized(N, 128),
        )
    )
    if M > 64 * 1024 and N // 32 < SM_COUNT // 2:
        raise ToolError("M > 65536 with small N takes GammaBeta's partial-sums path: not mirrored")
    partial = by == 1
    grid_x = _cdiv(N, 32)
    stats = 2 * M * ACC * (grid_x if l2_rereads else 1)  # mean and rstd, read by every column of blocks
    out.append(
        _torch_kernel(
            code,
            "GammaBetaBackwardCUDAKernelTemplate",
            f"{t}fLj32ELj{by}ELj{rows}ELb{int(partial)}ELb{int(aligned)}ELb0",
            (grid_x, 1),
            (32, by),
            elements=mn,
            bytes=2 * mn * e + stats + 2 * N * e,  # dY and x again, dgamma and dbeta written
            read_bytes=2 * mn * e + stats,
            dynamic_shared=(32 + 1) * by * ACC * 2,
            trips=_trips_gamma_beta(M, rows, 1),
        )
    )
    if harness:
        out += _accumulate_grads(N, e)
    return out


def _accumulate_grads(n: int, e: int) -> list[OpaqueLaunch]:
    return [
        OpaqueLaunch(f"benchmark harness: autograd {p}.grad += d{p} ({n} elements)", 3 * n * e)
        for p in ("weight", "bias")
    ]


# ----------------------------------------------------------------------------------------------------------------
# Liger-Kernel: its host code on fake CUDA tensors, its kernels compiled for sm_90
def liger_version() -> str:
    try:
        return importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        raise ToolError(f"liger-kernel is not installed: {LIGER_INSTALL}") from None


def _liger_module():
    try:
        import liger_kernel.ops.layer_norm as LN
    except ImportError as exc:
        raise ToolError(f"liger_kernel is not importable ({exc}): {LIGER_INSTALL}") from None
    return LN


@dataclass
class _Recorded:
    kernel: object  # the JITFunction
    grid: tuple[int, ...]
    args: tuple
    kwargs: dict


@dataclass
class _HostOp:
    name: str
    read: int
    written: int
    shape: tuple[int, ...]


class _Recorder:
    """Stands in for `kernel` in `kernel[grid](*args, **kwargs)`: records the launch."""

    def __init__(self, kernel, log: list):
        self.kernel, self.log = kernel, log

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            g = grid(kwargs) if callable(grid) else grid
            self.log.append(_Recorded(self.kernel, tuple(int(d) for d in g), args, kwargs))

        return launch


_NO_KERNEL = frozenset("empty empty_strided view _unsafe_view as_strided alias detach t expand".split())
_FILL = frozenset("zeros zero_ fill_ ones full".split())
_ELEMENTWISE_OR_REDUCE = frozenset("sum add add_ copy_ _to_copy clone mul".split())


def _nbytes(x) -> int:
    return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else 0


@contextlib.contextmanager
def _host_ops(log: list) -> Iterator[None]:
    """Logs the aten ops run inside (each is a kernel launch on a real device, except allocations and views)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if func.namespace == "prim" or name in _NO_KERNEL:
                return result
            outs = [x for x in tree_leaves(result) if isinstance(x, torch.Tensor)]
            written = sum(_nbytes(x) for x in outs)
            if name in _FILL:
                read = 0
            elif name in _ELEMENTWISE_OR_REDUCE:
                read = sum(_nbytes(x) for x in tree_leaves((args, kwargs or {})) if isinstance(x, torch.Tensor))
            else:
                raise ToolError(f"liger host code ran aten.{name}: no byte rule for it in tools.roofline_peers")
            log.append(_HostOp(name, read, written, tuple(outs[0].shape) if outs else ()))
            return result

    with Mode():
        yield


def _to_meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device="meta")
    return x


def _run_liger_host(
    N: int, M: int, dtype: torch.dtype, direction: str, sm_count: int
) -> list[Union[_Recorded, _HostOp]]:
    """Runs Liger's host function for `direction` on fake CUDA tensors; returns, in order, the kernel launches it
    made (their tensors as meta tensors) and the torch ops it ran."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    LN = _liger_module()
    events: list[Union[_Recorded, _HostOp]] = []
    props = types.SimpleNamespace(multi_processor_count=sm_count, name="H100 (model)")
    patches = [
        mock.patch.object(LN, name, _Recorder(getattr(LN, name), events))
        for name in ("_layer_norm_forward_kernel", "_layer_norm_backward_kernel")
    ]
    patches.append(mock.patch.object(torch.cuda, "get_device_properties", lambda *a, **k: props))
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        stack.enter_context(FakeTensorMode())
        dev = "cuda"
        x = torch.empty((M, N), dtype=dtype, device=dev)
        w = torch.empty((N,), dtype=dtype, device=dev)
        b = torch.empty((N,), dtype=dtype, device=dev)
        if direction == "forward":
            with _host_ops(events):
                LN.layer_norm_forward(x, w, b, EPS)
        elif direction == "backward":
            _, _, mean, rstd, _, _ = LN.layer_norm_forward(x, w, b, EPS)  # the saved statistics' dtype
            events.clear()
            dy = torch.empty((M, N), dtype=dtype, device=dev)
            with _host_ops(events):
                LN.layer_norm_backward(dy, x, w, b, mean, rstd)
        else:
            raise ValueError(direction)
    return [
        _Recorded(r.kernel, r.grid, tuple(_to_meta(a) for a in r.args), {k: _to_meta(v) for k, v in r.kwargs.items()})
        if isinstance(r, _Recorded)
        else r
        for r in events
    ]


def _trips_liger(kernel: str, rows_per_program: Optional[float]) -> Callable[[list], dict[int, float]]:
    """Liger's kernels hold a whole row in registers (BLOCK_SIZE = next_power_of_2(N)): no loop, except the row
    loop of the 0.6.0 backward (rows_per_program rows per program), which holds every global load."""

    def trips(lps: list) -> dict[int, float]:
        if rows_per_program is None:
            if lps:
                raise _unexpected(kernel, lps, "a whole-row Triton kernel without loops was expected")
            return {}
        data = [lp for lp in lps if loop_shape(lp).loads]
        if len(data) != 1 or data[0].depth != 0:
            raise _unexpected(kernel, lps, "want one row loop with the loads")
        return {lp.index: (rows_per_program if lp is data[0] else 1.0) for lp in lps}

    return trips


def _liger_launch(info, ev: _Recorded, version: str, **terms) -> KernelLaunch:
    """The launch of one recorded Liger kernel, compiled for sm_90 (`info`: compile_cubin's), labelled with the
    version, the kernel's name, its warps and its spills."""
    spills = f", {info.spills} B of spills" if info.spills else ""
    label = f"liger {version} {ev.kernel.__name__} num_warps={info.num_warps}{spills}"
    return compiled_triton_launch(info, ev.grid, label=label, **terms)


def liger_layer_norm(case: LayerNormCase, sm_count: int = SM_COUNT) -> list[Launch]:
    """The launches Liger-Kernel's LayerNorm (the installed version, see liger_version()) makes for the case, on an
    `sm_count`-SM GPU, each Triton kernel compiled for sm_90; host torch ops as OpaqueLaunch."""
    from tools.triton_resources import compile_cubin  # sets Triton's cache and interpreter flags on import

    N, M, dtype, direction, l2_rereads = case.N, case.M, case.dtype, case.direction, case.l2_rereads
    e = _elem(dtype)
    mn = M * N
    version = liger_version()
    out: list[Launch] = []
    for ev in _run_liger_host(N, M, dtype, direction, sm_count):
        if isinstance(ev, _HostOp):
            out.append(OpaqueLaunch(f"liger {version} host: aten.{ev.name} -> {list(ev.shape)}", ev.read + ev.written))
            continue
        info = compile_cubin(ev.kernel, ev.grid, ev.args, ev.kwargs)
        named = dict(zip(ev.kernel.arg_names, ev.args))
        named.update(ev.kwargs)
        programs = math.prod(ev.grid)
        name = ev.kernel.__name__
        stat_bytes = named["Mean_ptr"].element_size()
        if name == "_layer_norm_forward_kernel":
            params = 2 * N * e * (programs if l2_rereads else 1)
            nbytes, read = 2 * mn * e + params + 2 * M * stat_bytes, mn * e + params
            trips = _trips_liger(name, None)
        elif name == "_layer_norm_backward_kernel":
            w = N * e * (programs if l2_rereads else 1)
            stats = 2 * M * stat_bytes
            if "rows_per_program" not in named:  # 0.6.1: one row per program, atomics into dW, dB
                grad = 4 * N * e  # dW and dB read and written once; the model counts the atomics from the SASS
                trips = _trips_liger(name, None)
            else:  # 0.6.0: rows_per_program rows per program, per-program partials of dW and dB
                grad = 2 * programs * N * e
                trips = _trips_liger(name, M / programs)
            nbytes, read = 3 * mn * e + w + stats + grad, 2 * mn * e + w + stats
        else:
            raise ToolError(f"liger's host code launched an unknown kernel {name}")
        out.append(_liger_launch(info, ev, version, elements=mn, bytes=nbytes, read_bytes=read, trips=trips))
    if direction == "backward" and case.harness:
        out += _accumulate_grads(N, e)
    return out


# Liger-Kernel's SwiGLU (liger_kernel/ops/swiglu.py, LigerSiLUMulFunction: the peer of gpuopt's gated_act_silu
# rows), on two (M, F) tensors: one program a row holding the whole row (BLOCK_SIZE = next_power_of_2(F), warps by
# its calculate_settings), the activation in fp32; the backward recomputes silu(a) and writes da, db into a and b
# (in place: its memory, not its traffic, differs from gpuopt's). No host op launches a kernel (torch.empty_like).
def _liger_swiglu_module():
    try:
        import liger_kernel.ops.swiglu as SW
    except ImportError as exc:
        raise ToolError(f"liger_kernel's SwiGLU is not importable ({exc}): {LIGER_INSTALL}") from None
    return SW


def _run_liger_swiglu_host(F: int, M: int, dtype: torch.dtype, direction: str) -> list[_Recorded]:
    """Runs swiglu_forward (or swiglu_backward) on fake CUDA tensors; returns its kernel launches (meta tensors)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    SW = _liger_swiglu_module()
    events: list = []
    with contextlib.ExitStack() as stack:
        for name in ("_swiglu_forward_kernel", "_swiglu_backward_kernel"):
            stack.enter_context(mock.patch.object(SW, name, _Recorder(getattr(SW, name), events)))
        stack.enter_context(FakeTensorMode())
        a = torch.empty((M, F), dtype=dtype, device="cuda")
        b = torch.empty((M, F), dtype=dtype, device="cuda")
        if direction == "forward":
            SW.swiglu_forward(a, b)
        elif direction == "backward":
            SW.swiglu_backward(a, b, torch.empty((M, F), dtype=dtype, device="cuda"))
        else:
            raise ValueError(direction)
    return [
        _Recorded(r.kernel, r.grid, tuple(_to_meta(x) for x in r.args), {k: _to_meta(v) for k, v in r.kwargs.items()})
        for r in events
    ]


def liger_swiglu(F: int, M: int, dtype: torch.dtype = torch.bfloat16, direction: str = "forward") -> list[Launch]:
    """The launches Liger-Kernel's SwiGLU (the installed version) makes for two contiguous (M, F) tensors, each
    Triton kernel compiled for sm_90. Bytes: a, b read and c written (forward); dc, a, b read and da, db written
    over a and b (backward): gpuopt's gated_act bytes."""
    from tools.triton_resources import compile_cubin  # sets Triton's cache and interpreter flags on import

    e = _elem(dtype)
    mn = M * F
    version = liger_version()
    out: list[Launch] = []
    for ev in _run_liger_swiglu_host(F, M, dtype, direction):
        name = ev.kernel.__name__
        if name == "_swiglu_forward_kernel":
            nbytes, read = 3 * mn * e, 2 * mn * e
        elif name == "_swiglu_backward_kernel":
            nbytes, read = 5 * mn * e, 3 * mn * e
        else:
            raise ToolError(f"liger's SwiGLU host code launched an unknown kernel {name}")
        info = compile_cubin(ev.kernel, ev.grid, ev.args, ev.kwargs)
        trips = _trips_liger(name, None)
        out.append(_liger_launch(info, ev, version, elements=mn, bytes=nbytes, read_bytes=read, trips=trips))
    if len(out) != 1:
        raise ToolError(f"liger's SwiGLU {direction} made {len(out)} launches, one was expected")
    return out


# ----------------------------------------------------------------------------------------------------------------
# The published measurements
_CSV = "linkedin/Liger-Kernel benchmark/data/all_benchmark_data.csv (added by commit 6a2c491, #815)"
_NS = (4096, 8192, 16384)  # the CSV's N (hidden size) points
# (provider in the CSV, mode) -> the median ms (y_value_50) at each N of _NS, from the rows "layer_norm,<provider>,
# <mode>,speed,ms,N,hidden size,<N>,...,{"M": 4096, "dtype": "torch.float32", "eps": 1e-06},NVIDIA H100 80GB HBM3,
# 2025-07-17 ...,0.6.0"
_MS_AT_NS = {
    ("liger", "forward"): (0.05104000121355057, 0.0947519987821579, 0.18476800620555878),
    ("huggingface", "forward"): (0.06617599725723267, 0.15267199277877808, 0.3067840039730072),
    ("liger", "backward"): (0.16630400717258453, 0.31279999017715454, 0.5776320099830627),
    ("huggingface", "backward"): (0.17881600558757782, 0.33369600772857666, 0.6424000263214111),
}
_MS = {(provider, mode, n): ms for (provider, mode), row in _MS_AT_NS.items() for n, ms in zip(_NS, row)}
_KERNEL = {"liger": "liger", "huggingface": "torch"}


def published_bytes(direction: str, n: int, m: int = M_ROWS) -> int:
    return (2 if direction == "forward" else 3) * m * n * 4


PUBLISHED: list[dict] = [
    {
        "kernel": _KERNEL[provider],
        "shape": (M_ROWS, n),
        "gpu": "H100 SXM",
        "direction": mode,
        "published": published_bytes(mode, n) / (ms * 1e-3) / PEAK_BW,
        "ms": ms,
        "source": f"{_CSV}: layer_norm,{provider},{mode},speed,ms,N={n}, median; M=4096 fp32 eps=1e-6, "
        "NVIDIA H100 80GB HBM3, 2025-07-17",
    }
    for (provider, mode, n), ms in _MS.items()
]


def verify_published(csv_path: Union[str, os.PathLike]) -> list[str]:
    """Differences between PUBLISHED and a copy of the CSV (empty when every row matches)."""
    import csv
    import json

    found = {}
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            if row["kernel_name"] != "layer_norm" or row["metric_name"] != "speed" or "H100" not in row["gpu_name"]:
                continue
            cfg = json.loads(row["extra_benchmark_config_str"])
            if cfg.get("M") != M_ROWS or cfg.get("dtype") != "torch.float32":
                continue
            found[(row["kernel_provider"], row["kernel_operation_mode"], int(row["x_value"]))] = float(
                row["y_value_50"]
            )
    bad = []
    for key, ms in _MS.items():
        if key not in found:
            bad.append(f"{key}: not in the CSV")
        elif abs(found[key] - ms) > 1e-12:
            bad.append(f"{key}: CSV {found[key]} ms, PUBLISHED {ms} ms")
    return bad


def calibration_launches(l2_rereads: bool = False) -> list[tuple[dict, list[Launch]]]:
    """Each PUBLISHED row with the launches of its kernel (benchmark harness included). Needs the Liger version
    that was measured (LIGER_MEASURED)."""
    if liger_version() not in LIGER_MEASURED:
        raise ToolError(
            f"liger-kernel {liger_version()} is installed; the published rows measured the code of "
            f"{' / '.join(LIGER_MEASURED)}: {LIGER_INSTALL}"
        )
    out = []
    for row in PUBLISHED:
        m, n = row["shape"]
        fn = liger_layer_norm if row["kernel"] == "liger" else torch_layer_norm
        out.append((row, fn(LayerNormCase(n, m, torch.float32, row["direction"], l2_rereads, harness=True))))
    return out


# ----------------------------------------------------------------------------------------------------------------
# Printout
def describe_launch(launch: Launch) -> str:
    if isinstance(launch, OpaqueLaunch):
        return f"  opaque  {launch.label}: {launch.bytes} B"
    from tools.roofline import functions_of

    fn = functions_of(launch.code, [launch.function])[launch.function]
    lps = S.loops(fn)
    trips = launch.trips(lps) if callable(launch.trips) else dict(launch.trips or {})
    lines = [
        f"  kernel  {launch.label}",
        f"          {launch.function}",
        f"          grid {launch.grid} block {launch.block} regs {launch.regs} shared {launch.shared} "
        f"dynamic_shared {launch.dynamic_shared}",
        f"          bytes {launch.bytes} read_bytes {launch.read_bytes} elements {launch.elements}",
    ]
    if not lps:
        lines.append("          no loops")
    for lp in lps:
        s = loop_shape(lp)
        kind = "re-entry" if s.reentry else ("barrier" if s.barrier and not s.global_ops else "")
        lines.append(
            f"          loop {lp.index:2d} [{lp.head:#06x}, {lp.tail:#06x}] depth {lp.depth} own {len(lp.own):3d}: "
            f"LDG {s.loads} ({s.wide_loads} x128) STG {s.stores} ({s.wide_stores} x128) atomics {s.atomics} "
            f"{kind:8s} -> trips {trips[lp.index]:g}"
        )
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.roofline_peers", description=__doc__.splitlines()[0])
    ap.add_argument("--estimate", action="store_true", help="also the model's estimate (tools.roofline, H100)")
    ap.add_argument("--l2-rereads", action="store_true", help="count per-program re-reads of parameters in bytes")
    ap.add_argument("--csv", help="check PUBLISHED against this copy of all_benchmark_data.csv")
    args = ap.parse_args(argv)
    try:
        if args.csv:
            bad = verify_published(args.csv)
            print("PUBLISHED matches the CSV" if not bad else "\n".join(bad))
        print(f"torch {torch_version()} (SASS: {torch_cubin()}), liger-kernel {liger_version()}")
        for row, launches in calibration_launches(args.l2_rereads):
            m, n = row["shape"]
            print(
                f"\n{row['kernel']} {row['direction']} M={m} N={n}: published {row['published']:.3f} of peak "
                f"({row['ms']:.4f} ms)"
            )
            for launch in launches:
                print(describe_launch(launch))
            if args.estimate:
                est = estimate(launches, published_bytes(row["direction"], n, m), m * n, H100)
                t = est.time()
                print(
                    f"  model: {t * 1e3:.4f} ms = {published_bytes(row['direction'], n, m) / t / PEAK_BW:.3f} "
                    f"of peak (published {row['published']:.3f})"
                )
    except ToolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
