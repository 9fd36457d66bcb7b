"""What the Triton kernels of every op share: dtype conversions, the interpreter switch, device facts, grid sizing
and the stage-2 column sum.

Pure ``@triton.jit`` code and plain-Python launch helpers; no torch.library here.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import numpy as np
import torch
import triton
import triton.language as tl


# ----------------------------------------------------------------------------------------------- jit helpers
@triton.jit
def to_acc(x, IS_FP64: tl.constexpr):
    if IS_FP64:
        y = x.to(tl.float64)
    else:
        y = x.to(tl.float32)
    return y


@triton.jit
def to_out(v, PTR, RTNE_BF16: tl.constexpr):
    """v converted to PTR's element type. RTNE_BF16 (set under the interpreter, whose fp32 -> bf16 cast
    truncates) rounds to nearest even through the bits, as the GPU's cvt.rn.bf16.f32 and torch do."""
    dst: tl.constexpr = PTR.dtype.element_ty
    if RTNE_BF16 and dst == tl.bfloat16:
        v32 = v.to(tl.float32)
        bits = v32.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded = tl.where(v32 != v32, 0x7FC0, rounded)  # NaN stays a (quiet) NaN
        r = rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        r = v.to(dst)
    return r


@triton.jit
def sum_partials_kernel(P, OUT, G, N, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, RTNE_BF16: tl.constexpr):
    """OUT[j] = sum over g = 0 .. G-1 of P[g, j], in a fixed order (deterministic), cast to OUT's dtype.

    Stage 2 of the column reductions: one program per BLOCK_N columns (many programs), each adding its columns
    of BLOCK_G partial rows at a time element-wise into a [BLOCK_G, BLOCK_N] tile, reduced over rows once."""
    col0 = tl.program_id(0) * BLOCK_N
    cols = col0 + tl.arange(0, BLOCK_N)
    cmask = cols < N
    gs = tl.arange(0, BLOCK_G)
    acc = tl.zeros([BLOCK_G, BLOCK_N], dtype=P.dtype.element_ty)
    for g0 in range(0, G, BLOCK_G):
        gg = (g0 + gs).to(tl.int64)
        m = (gg < G)[:, None] & cmask[None, :]
        acc += tl.load(P + gg[:, None] * N + cols[None, :], mask=m, other=0.0)
    tl.store(OUT + cols, to_out(tl.sum(acc, axis=0), OUT, RTNE_BF16), mask=cmask)


# ------------------------------------------------------------------------------------------- launch helpers
def is_interpreted(kernel) -> bool:
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover
        return False
    return isinstance(kernel, InterpretedFunction)


# True when TRITON_INTERPRET=1 was set as this module was imported: the kernels then run on CPU tensors.
INTERPRETED = is_interpreted(sum_partials_kernel)


def interpreter_index_compat() -> bool:
    """Lets the interpreter use runtime loop bounds (`range(pid, num_tiles, G)`) with NumPy >= 2.5.

    Interpreted scalars are 1-element 1-D arrays, and some Triton interpreters (3.6) convert them for range()
    with int(array), which NumPy 2.5 refuses ("only 0-dimensional arrays can be converted to Python scalars");
    newer interpreters (3.8) squeeze first. Only when this NumPy refuses the conversion (checked, not assumed
    from versions) wrap the interpreter's tensor patch so that __index__ squeezes. Returns whether it did."""
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            int(np.array([1]))
        return False
    except TypeError:
        pass
    from triton.runtime import interpreter as _interp

    orig = getattr(_interp, "_patch_lang_tensor", None)
    if orig is None or getattr(orig, "_gpuopt_index_compat", False):
        return False

    def patch_lang_tensor(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch_lang_tensor._gpuopt_index_compat = True
    _interp._patch_lang_tensor = patch_lang_tensor
    return True


if INTERPRETED:
    interpreter_index_compat()


def num_warps_for(tile: int, per_thread: int = 16) -> int:
    """Warps for a tile of `tile` elements at `per_thread` elements per thread (1 .. 16 warps)."""
    return max(1, min(16, tile // (32 * per_thread)))


# SMs assumed when the device cannot be asked (meta/fake tensors, the compile table, no GPU): H100 SXM / H200.
DEFAULT_SM_COUNT = 132
# Programs of the row-group reductions under the interpreter (CPU tensors): few, or the interpreter crawls.
INTERPRETER_ROW_GROUPS = 8
_SM_COUNT = {}


def device_sm_count(device: torch.device) -> int:
    """Multiprocessors of `device`: torch.cuda.get_device_properties on a CUDA machine, else DEFAULT_SM_COUNT."""
    if device.type == "cuda" and torch.cuda.is_available():
        idx = device.index if device.index is not None else torch.cuda.current_device()
        if idx not in _SM_COUNT:
            _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
        return _SM_COUNT[idx]
    return DEFAULT_SM_COUNT


def device_guard(device: torch.device):
    """Makes x's device current for the launches (Triton launches on the current device and its stream): a
    torch.cuda.device guard for CUDA tensors, a no-op otherwise (CPU, meta)."""
    if device.type == "cuda":
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def resident_programs_per_sm(num_warps: int, regs_per_thread: int) -> int:
    """Blocks of num_warps warps at regs_per_thread registers that an sm_90 SM holds at once: 65536 registers
    (allocated per thread in units of 8), 64 warps, 32 blocks per SM."""
    regs = -(-regs_per_thread // 8) * 8
    return max(1, min(32, 64 // num_warps, 65536 // (regs * 32 * num_warps)))


# Register budget (per thread) the persistent grids are sized for. the Triton static gate compiles every
# variant for sm_90 and checks that the real registers never need fewer programs per SM than this budget gives,
# so the grid is one full wave: every program resident at once, no tail wave.
# Measured (python -m tools.triton_resources, triton 3.6 and 3.8): 16-bit inputs at <= 8 elements per thread take
# <= 73 registers (budget 80); fp32 inputs (up to 97) and 16 elements per thread (up to 128) are budgeted at 128.
def persistent_regs(elems_per_thread: int, elem_bytes: int) -> int:
    return 80 if elems_per_thread <= 8 and elem_bytes <= 2 else 128


def num_row_groups(num_tiles: int, device: torch.device, programs_per_sm: int = 2, sms: Optional[int] = None) -> int:
    """Programs of a row-group reduction (one partial row each): SMs x programs_per_sm on CUDA and meta tensors
    (sms defaults to device_sm_count(device)), INTERPRETER_ROW_GROUPS on the interpreter (CPU), at most num_tiles."""
    if device.type == "cpu":
        cap = INTERPRETER_ROW_GROUPS
    else:
        cap = (sms if sms is not None else device_sm_count(device)) * programs_per_sm
    return max(1, min(num_tiles, cap))


def launch_directly(kernel):
    """The default `wrap` of the launchers: launch the kernel itself (torch.library.wrap_triton inside a
    triton_op instead)."""
    return kernel


def sum_partials_config(groups: int, n: int):
    """Stage 2 tiling: BLOCK_N = 32 columns per program (cdiv(N, 32) programs: 24 at N = 768, 512 at 16384),
    BLOCK_G = min(next_pow2(G), 64) partial rows per step, 4 warps. Fixed by (G, N): a fixed summation order."""
    block_n = min(32, triton.next_power_of_2(n))
    block_g = max(1, min(triton.next_power_of_2(groups), 64))
    return block_g, block_n, 4


def launch_sum_partials(partial, out, groups: int, n: int, *, wrap=launch_directly) -> None:
    """out[j] = sum over the G partial rows of partial[:, j] (fixed order), many programs over column blocks."""
    block_g, block_n, warps = sum_partials_config(groups, n)
    grid = (triton.cdiv(n, block_n),)
    with device_guard(out.device):
        wrap(sum_partials_kernel)[grid](
            partial, out, groups, n, BLOCK_G=block_g, BLOCK_N=block_n, RTNE_BF16=INTERPRETED, num_warps=warps
        )
