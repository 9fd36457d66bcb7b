"""What the Triton kernels of every op share: dtype conversions, the interpreter switch, device facts, grid sizing
and the stage-2 column sum.

Pure ``@triton.jit`` code and plain-Python launch helpers; no torch.library here.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
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
def sum_partials_kernel(
    P,  # (G, N) partial rows in the accumulation dtype (fp32; fp64 for fp64 data); with TWO a second set at P + SLAB
    OUT,  # (N,) the first sum in its own dtype (dgamma, or the one sum: dbeta, or bias_act's grad_bias)
    OUT2,  # (N,) the second sum (dbeta) with TWO; otherwise OUT again, never written
    G,
    N,
    SLAB,
    STEP,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TWO: tl.constexpr,
    EVEN_N: tl.constexpr,
    RTNE_BF16: tl.constexpr,
):
    """OUT[j] = sum over g = 0 .. G-1 of P[g * N + j], in a fixed order (deterministic), cast to OUT's dtype; with
    TWO also OUT2[j] from the (G, N) partial rows at P + SLAB (dgamma and dbeta share one launch).

    Stage 2 of the column reductions: grid (column blocks, 1 or 2), each program adding its columns of BLOCK_G
    partial rows at a time element-wise into a [BLOCK_G, BLOCK_N] tile (every load of a step issued before its
    adds), reduced over rows once: the order depends only on G and BLOCK_G (sum_partials_config)."""
    col0 = tl.program_id(0) * BLOCK_N
    which = tl.program_id(1)
    cols = col0 + tl.arange(0, BLOCK_N)
    cmask = cols < N
    gs = tl.arange(0, BLOCK_G)
    src = P + which.to(tl.int64) * SLAB
    ptrs = src + gs[:, None].to(tl.int64) * N + cols[None, :]
    acc = tl.zeros([BLOCK_G, BLOCK_N], dtype=P.dtype.element_ty)
    # whole steps without a row mask (and without a column mask when BLOCK_N divides N): no zero-filled registers,
    # so every load of a step is issued before its adds; then the last, partial step
    full = G - G % BLOCK_G
    for _ in range(0, full, BLOCK_G):
        if EVEN_N:
            acc += tl.load(ptrs)
        else:
            acc += tl.load(ptrs, mask=cmask[None, :], other=0.0)
        ptrs += STEP  # BLOCK_G * N, from the host (an int64 argument when it needs one)
    if full < G:
        acc += tl.load(ptrs, mask=((full + gs) < G)[:, None] & cmask[None, :], other=0.0)
    total = tl.sum(acc, axis=0)
    # two masked stores rather than a branch on `which`: a branch hides from torch.compile's analysis which
    # pointers are written (it then copies P before each launch)
    tl.store(OUT + cols, to_out(total, OUT, RTNE_BF16), mask=cmask & (which == 0))
    if TWO:
        tl.store(OUT2 + cols, to_out(total, OUT2, RTNE_BF16), mask=cmask & (which == 1))


# ------------------------------------------------------------------------------------------- launch helpers
def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The accumulation dtype of data in `dtype` (DESIGN 3): fp64 for fp64, else fp32 (the partial sums' buffers)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


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


@dataclass(frozen=True)
class KernelFacts:
    """What a compiled kernel uses per program: registers per thread, static shared memory (bytes), warps; and
    the spills of its registers to local memory (0 where unknown)."""

    regs: int
    shared: int
    num_warps: int
    spills: int = 0


# One SM of sm_90 (H100/H200): 65536 registers allocated per warp in units of 256 (8 per thread), 64 warps,
# 32 blocks, 228 KiB of shared memory with 1 KiB reserved per block, allocated in units of 128 B.
# tools/triton_resources.py computes blocks/SM with tools.cuda_resources.occupancy and checks that it agrees.
SM_REGS, SM_WARPS, SM_BLOCKS = 65536, 64, 32
SM_SHARED, SM_SHARED_RESERVED, SM_SHARED_UNIT = 228 * 1024, 1024, 128


def resident_programs_per_sm(facts: KernelFacts) -> int:
    """Programs of a kernel with these facts that one SM holds at once (at least 1)."""
    regs = -(-max(1, facts.regs) // 8) * 8
    shared = -(-(facts.shared + SM_SHARED_RESERVED) // SM_SHARED_UNIT) * SM_SHARED_UNIT
    by_regs = SM_REGS // (regs * 32 * facts.num_warps)
    return max(1, min(SM_BLOCKS, SM_WARPS // facts.num_warps, by_regs, SM_SHARED // shared))


_FACTS: dict = {}


def _concrete(v):
    """A symbolic int or float (a launch traced under torch.compile with dynamic shapes, or by torch.export) as
    the value it has in the example being traced (its hint), read without adding a guard; other values as given.
    Raises LookupError for a symbol without a hint (an unbacked size): then no compiled kernel can be asked."""
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        hint = v.node.hint
        if hint is None:
            raise LookupError("a symbolic size without a hint")
        return hint
    return v


def _spec(v):
    """What of an argument the compiled code depends on: a tensor's dtype, an int's specialization (== 1,
    divisible by 16, 32 or 64 bits), a float's type, a constexpr's value. Symbolic values by their hints."""
    v = _concrete(v)
    if isinstance(v, torch.Tensor):
        return v.dtype
    if isinstance(v, bool) or not isinstance(v, int):
        return v if not isinstance(v, float) else float
    return (v == 1, v % 16 == 0, -(2**31) <= v < 2**31)


def compiled_facts(kernel, device: torch.device, args, kwargs) -> Optional[KernelFacts]:
    """The facts of `kernel` compiled for `device` as a launch with these arguments on fresh tensors compiles it
    (every pointer 16-byte aligned): kernel.warmup(...) on the tensors' dtypes, then the loaded kernel's n_regs
    and its metadata's shared memory. Cached per (kernel, device, specialization); fixed by the device and the
    Triton version, never by timing or by the actual pointers. None where no compiled kernel can be asked
    (meta or fake tensors without a GPU, the interpreter)."""
    if INTERPRETED or device.type != "cuda" or not torch.cuda.is_available():
        return None
    idx = device.index if device.index is not None else torch.cuda.current_device()
    try:
        key = (kernel, idx, tuple(_spec(a) for a in args), tuple(sorted((k, _spec(v)) for k, v in kwargs.items())))
    except LookupError:
        return None
    if key not in _FACTS:
        # warmup mocks dtypes as tensors; symbolic sizes (dynamic-shape tracing) by their hints
        dtypes = [a.dtype if isinstance(a, torch.Tensor) else _concrete(a) for a in args]
        kwargs = {k: _concrete(v) for k, v in kwargs.items()}
        try:
            with torch.cuda.device(idx):
                ck = kernel.warmup(*dtypes, grid=(1,), **kwargs)
                ck._init_handles()
            spills = int(getattr(ck, "n_spills", 0) or 0)
            _FACTS[key] = KernelFacts(int(ck.n_regs), int(ck.metadata.shared), int(ck.metadata.num_warps), spills)
        except Exception as err:  # noqa: BLE001  (a Triton without these hooks: plan as without a GPU)
            warnings.warn(
                f"gpuopt: could not read the compiled facts of {getattr(kernel, '__name__', kernel)} "
                f"({type(err).__name__}: {err}); its persistent grid is planned for {PLANNING_REGS} registers a "
                "thread instead (results are the same; the grid may not be one full wave)",
                RuntimeWarning,
                stacklevel=2,
            )
            _FACTS[key] = None
    return _FACTS[key]


# Registers per thread assumed when no compiled kernel can be asked (meta or fake tensors without a GPU, e.g.
# planning under torch.compile's tracing or the tests): nothing runs then, so only the printed grid depends on it.
PLANNING_REGS = 128


def kernel_facts(kernel, device: torch.device, args, kwargs, facts=None) -> Optional[KernelFacts]:
    """The compiled facts of `kernel` launched with (args, kwargs): `facts(kernel, args, kwargs)` when given
    (tools/triton_resources.py passes the sm_90 compile), else compiled_facts on the device (None without one)."""
    return facts(kernel, args, kwargs) if facts is not None else compiled_facts(kernel, device, args, kwargs)


def resident_programs(got: Optional[KernelFacts], num_warps: int) -> int:
    """Resident programs per SM of a kernel with these compiled facts, or, where there are none (no compiled
    kernel to ask), of PLANNING_REGS registers and no shared memory at num_warps."""
    return resident_programs_per_sm(got if got is not None else KernelFacts(PLANNING_REGS, 0, num_warps))


def programs_per_sm(kernel, device: torch.device, args, kwargs, facts=None) -> int:
    """Resident programs per SM of a persistent kernel launched with (args, kwargs), from its compiled facts
    (kernel_facts; resident_programs)."""
    return resident_programs(kernel_facts(kernel, device, args, kwargs, facts), int(kwargs.get("num_warps", 4)))


def persistent_programs(num_tiles: int, device: torch.device, per_sm: int, sms: Optional[int] = None) -> int:
    """Programs of a persistent grid: SMs x per_sm on CUDA and meta tensors (sms defaults to
    device_sm_count(device)), INTERPRETER_ROW_GROUPS on the interpreter (CPU), at most num_tiles."""
    if device.type == "cpu":
        cap = INTERPRETER_ROW_GROUPS
    else:
        cap = (sms if sms is not None else device_sm_count(device)) * per_sm
    return max(1, min(num_tiles, cap))


def column_groups(col_tiles: int, resident: int, sms: int) -> int:
    """Row groups of a (column tiles x groups) grid of programs that each walk every G-th row tile of their column
    tile, for `resident` slots (SMs x resident programs per SM): the most groups up to resident // col_tiles whose
    grid fills its waves over `sms` SMs to >= 97 % (col_tiles x groups close to a multiple of the SMs: no SM left
    with one program fewer than the others); else the fewest above that, up to two waves, whose grid fills its
    waves of `resident` programs to >= 97 % (N = 12288 in 256-column tiles: 48 x 5 = 240 programs leave 24 of
    264 slots idle, 48 x 11 = 528 are two full waves); else resident // col_tiles."""
    top = max(1, resident // col_tiles)
    for g in range(top, 0, -1):
        total = col_tiles * g
        if total / (-(-total // sms) * sms) >= 0.97:
            return g
    for g in range(top + 1, 2 * resident // col_tiles + 1):
        total = col_tiles * g
        if total / (-(-total // resident) * resident) >= 0.97:
            return g
    return top


def launch_directly(kernel):
    """The default `wrap` of the launchers: launch the kernel itself (torch.library.wrap_triton inside a
    triton_op instead)."""
    return kernel


# Stage 2 spreads its columns over at most this many programs (two per SM of an H100 / H200: whole waves), and
# each step of a program loads a [BLOCK_G, BLOCK_N] tile of this many bytes.
SUM_PARTIALS_PROGRAMS = 264
SUM_PARTIALS_TILE_BYTES = 32 * 1024


def sum_partials_config(groups: int, n: int, sets: int = 1, elem_bytes: int = 4):
    """Stage 2 tiling: BLOCK_N = max(16, next_pow2(cdiv(sets x N, SUM_PARTIALS_PROGRAMS))) columns per program
    (sets x cdiv(N, BLOCK_N) <= 264 programs: 96 at N = 768, 128 at 1024, 256 at 2048 .. 16384, both outputs), and
    BLOCK_G = min(next_pow2(G), 32 KB / (BLOCK_N x element bytes)) partial rows per step, 8 warps: every thread
    issues its 32 loads (16 for fp64) before adding them, so each SM keeps 32 KB in flight. Fixed by (G, N,
    sets, dtype), never by the device: a fixed summation order."""
    block_n = max(16, triton.next_power_of_2(-(-(sets * n) // SUM_PARTIALS_PROGRAMS)))
    block_n = min(block_n, triton.next_power_of_2(n))
    block_g = max(1, min(triton.next_power_of_2(groups), SUM_PARTIALS_TILE_BYTES // (block_n * elem_bytes)))
    return block_g, block_n, 8


def partial_slab(groups: int, n: int) -> int:
    """Elements between the (G, N) partial-row sets of one buffer: G x N rounded up to 4, so that every set
    starts 16-byte aligned (the alignment the compiled kernels' facts assume)."""
    return -(-(groups * n) // 4) * 4


def sum_partials_plan(groups: int, n: int, sets: int = 1, elem_bytes: int = 4) -> tuple:
    """(grid, the scalar arguments after the pointers, the constexprs and num_warps) of stage 2 for (G, N, sets,
    element bytes): fixed by them alone (sum_partials_config), so a launch plan keeps it."""
    block_g, block_n, warps = sum_partials_config(groups, n, sets, elem_bytes)
    kwargs = dict(
        BLOCK_G=block_g, BLOCK_N=block_n, TWO=sets == 2, EVEN_N=n % block_n == 0, RTNE_BF16=INTERPRETED, num_warps=warps
    )
    return (triton.cdiv(n, block_n), sets), (groups, n, partial_slab(groups, n), block_g * n), kwargs


def run_sum_partials(partial, outs, stage2: tuple, *, wrap=launch_directly) -> None:
    """The stage-2 launch of a plan from sum_partials_plan, under the caller's device guard."""
    grid, scalars, kwargs = stage2
    wrap(sum_partials_kernel)[grid](partial, outs[0], outs[-1], *scalars, **kwargs)


def launch_sum_partials(partial, outs, groups: int, n: int, *, wrap=launch_directly) -> None:
    """outs[k][j] = sum over the G partial rows of set k of `partial` (sets partial_slab(G, N) elements apart) at
    column j, in a fixed order, for the one or two outputs in `outs`: one launch, grid (column blocks,
    len(outs))."""
    with device_guard(outs[0].device):
        run_sum_partials(partial, outs, sum_partials_plan(groups, n, len(outs), partial.element_size()), wrap=wrap)


# ---------------------------------------------------------------------------------------------- launch plans
# What a launcher decides before its launches (tiling, the compiled kernels' facts and with them the persistent
# grids, the row groups G, stage 2's tiling, the partial buffer's size) is its op's plan (plan_forward /
# plan_backward of the op's module), fixed by the call's key: the launcher's static arguments (shape as (M, N),
# dtypes, device, flags, p's threshold, the row limits). A launcher given no plan keeps the default one per key, so
# that a repeated call runs no planning, no compiled-kernel query and no device-property lookup: it allocates its
# buffer and launches. Strides need no place in the key: the launchers take contiguous tensors (the ops make them
# so), so (M, N) fixes them. Not kept: plans built with knobs (the compile gate, the performance model and the
# tests pass those themselves) and plans for symbolic sizes (tracing with dynamic shapes).
PLAN_CACHE_SIZE = 4096
_PLANS: dict = {}
PLAN_STATS = {"hits": 0, "misses": 0}


def planned(m, key, make):
    """A launcher's default plan: kept per key (cached_plan) where M = m is a plain int, else make() every time
    (a symbolic M: the plan of the example being traced is not that of every size)."""
    return cached_plan(key, make) if type(m) is int else make()


def zero_sums(*sums) -> None:
    """Zeroes the column sums that exist (a backward over no rows: sums over nothing)."""
    for g in sums:
        if g is not None:
            g.zero_()


def cached_plan(key, make):
    """The plan of `key`: kept from an earlier call, else make() (then kept; the store is emptied when it holds
    PLAN_CACHE_SIZE plans)."""
    plan = _PLANS.get(key)
    if plan is None:
        PLAN_STATS["misses"] += 1
        plan = make()
        if len(_PLANS) >= PLAN_CACHE_SIZE:
            _PLANS.clear()
        _PLANS[key] = plan
    else:
        PLAN_STATS["hits"] += 1
    return plan


def clear_plans() -> None:
    """Forgets every kept launch plan (and the compiled-kernel facts and SM counts behind them)."""
    _PLANS.clear()
    _FACTS.clear()
    _SM_COUNT.clear()
