"""Launch plans of the Triton ops: what a launcher decides before it launches, as frozen, keyword-built values.

Each op module plans for itself (`plan_forward` / `plan_backward` beside its `launch_forward` / `launch_backward`)
from the call's static facts (shape, dtypes, device, flags, p's threshold) and returns a plan; the launcher takes
that plan (`plan=`), or builds the default one, kept per call key (common.cached_plan). The planning knobs (the SM
count, a `facts` hook standing in for the compiled kernels, row limits) belong to the planners only: the compile
gate, the performance model and the tests build their plan with them and pass it; a product call never sets them.

Here: `LaunchPlan` (one kernel, its grid and constexprs) and what the row-normalization ops
(layer_norm_dropout_relu, norm_dropout, dropout_add_norm) share to tile their rows: `RowLimits`, the longest rows of
their single-block kernels, and the tilings `forward_config` / `backward_config` with the wide-row fallbacks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch
import triton

from .common import INTERPRETED, num_warps_for
from .rows import RowTiling, dropout_threshold, plan_rows_forward, row_chunks, row_fused_config, seed_mapped


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    """One launch: `kernel` on `grid` with `kwargs` (its constexprs and num_warps)."""

    kernel: object
    grid: tuple
    kwargs: dict


@dataclass(frozen=True, kw_only=True)
class RowLimits:
    """The longest rows the row-normalization ops' single-block kernels take (longer ones: the looped kernels).
    A frozen value: part of every kept plan's key, so that a plan made under other limits (tests lower them to
    reach the looped kernels with short rows) is never reused."""

    # Forward: 16 warps x 32 threads x 32 elements a thread (four 4096-column chunks at N = 16384).
    fwd_max_fused_n: int = 16384
    # fp64 values take two registers each: the registers a thread holds at 16384 fp32 columns hold 4096 fp64 ones
    # at 8 elements a thread (the forward's fp64 per_thread).
    fwd_max_fused_n_fp64: int = 4096
    # Past this, a row takes the single-block forward only when it splits into whole chunks (N = 3 x 2^k or 2^k):
    # a padded chunk of next_power_of_2(N) would waste up to half the lanes and registers (past 8192: 12288, 16384).
    fwd_max_padded_n: int = 8192
    # The backward holds x, grad_out, xhat, dy, dxhat and the dgamma / dbeta tiles together: at 8 elements a thread
    # and 16 warps a row of 8192 columns is the longest that fits (the wide kernels hold less: wide_bwd_n).
    bwd_max_fused_n: int = 8192
    # fp64: 4 elements a thread at 16 warps, half the fp32 row for the same registers.
    bwd_max_fused_n_fp64: int = 2048
    # Rows the wide single-block backwards take (not fp64; backward_config), where the compiled kernel does not
    # spill (else the looped kernels: wide_backward_fallback). Empty: the looped kernels there.
    wide_bwd_n: tuple = (12288, 16384)

    def capped(self, max_fused_n: int) -> RowLimits:
        """These limits with every single-block row limit max_fused_n (fp32 and fp64 alike) and no wide backward:
        the looped kernels past max_fused_n columns, in chunks of at most next_power_of_2(max_fused_n)."""
        return dataclasses.replace(
            self,
            fwd_max_fused_n=max_fused_n,
            fwd_max_fused_n_fp64=max_fused_n,
            bwd_max_fused_n=max_fused_n,
            bwd_max_fused_n_fp64=max_fused_n,
            wide_bwd_n=(),
        )


# The limits the product plans with (the planners read it at every call: tests replace it to reach the looped
# kernels through the ops).
ROW_LIMITS = RowLimits()

# Registers a thread of the wide backward may give the row it holds and its dgamma / dbeta accumulators, by
# num_warps (sm_90 compiles, triton 3.8): at 16 warps 72 (16-bit LayerNorm at 12288) and 64 (16-bit RMSNorm-dropout
# at 16384) fit, 96 (16-bit LayerNorm at 16384) spills; at 8 warps 168 and 192 (12288: an fp32 sum, fp32 x) fit,
# 224 and 256 (16384) spill, and 192 at 16384 (fp32 RMSNorm-dropout) spills 88 bytes, which the compiled kernel's
# facts catch. Past them backward_config plans the looped kernels at once, compiling no kernel known to spill.
WIDE_BWD_REGS = {16: 80, 8: 192}


def row_limits(limits: Optional[RowLimits]) -> RowLimits:
    """limits, or where None the product's (ROW_LIMITS as it is now)."""
    return limits if limits is not None else ROW_LIMITS


def plan_key(kernel, m: int, n: int, tensors: tuple, flags: tuple, seed, device) -> tuple:
    """The key a row-normalization launcher keeps its default plan under (common.planned): its module's kernel
    first (a copy of the module with other kernels plans its own), (M, N), the dtypes of `tensors` (the kernels'
    arguments, stand-ins included), the call's `flags` (absent inputs, p's threshold, rms / relu), whether the
    seed is mapped, the device and the row limits."""
    return (kernel, m, n, *(t.dtype for t in tensors), *flags, seed_mapped(seed), device, row_limits(None))


def backward_facts(rows, weight, bias, p: float) -> tuple[int, int, bool, bool, int]:
    """(M, N, whether weight and bias exist, p's threshold) of a row-normalization backward over `rows` (x, or
    dropout_add_norm's sum) viewed as (M, N): what its planner and its launcher start from."""
    n = int(rows.shape[-1])
    return rows.numel() // n, n, weight is not None, bias is not None, dropout_threshold(p)


def forward_config(n: int, dtype: torch.dtype, limits: Optional[RowLimits] = None) -> RowTiling:
    """Forward tiling: 16 elements per thread; 8 for fp64 (values take two registers) and for N % 8 != 0 (one
    Philox call per element keeps its four words live)."""
    limits = row_limits(limits)
    fp64 = dtype == torch.float64
    per_thread = 8 if fp64 or n % 8 != 0 else 16
    max_fused_n = limits.fwd_max_fused_n_fp64 if fp64 else limits.fwd_max_fused_n
    padded_ok = n <= limits.fwd_max_padded_n or n == triton.next_power_of_2(n) or row_chunks(n)[0] == 3
    # past 8192: rows of three chunks (12288) and of four 4096-column chunks (16384: 32 elements a thread at 16
    # warps, where 32 warps would cap the registers at 64); where that compiled kernel spills (triton 3.6's
    # bf16 LayerNorm-dropout-ReLU: 24 bytes) it runs without holding the parameters, else the looped kernel
    # (wide_fallback, plan_rows_forward)
    if n <= max_fused_n and padded_ok:
        return row_fused_config(
            n,
            fp64,
            rows_elems=4096,  # a tile of ~4096 elements: several short rows per program
            per_thread=per_thread,
            chunk_per_thread=4 if fp64 else 8,  # 3-chunk rows: one warp per row at N = 768
            wide_chunk_per_thread=4 if fp64 else 8,
            quarters=not fp64,  # N = 2^k >= 1024: four chunks, the row's warps along it
        )
    # the looped forward: a program a row in steps of 4096 columns (2048 fp64: the same registers), at most the
    # longest single-block row (tests shrink the limits to reach it with short rows)
    block_n = 2048 if fp64 else 4096
    block_n = max(8, min(block_n, triton.next_power_of_2(max_fused_n)))
    return RowTiling(
        fused=False, block_m=1, block_n=block_n, num_warps=num_warps_for(block_n, per_thread), fast_rng=n % 8 == 0
    )


def wide_fallback(
    cfg: RowTiling, n: int, dtype: torch.dtype, limits: Optional[RowLimits] = None
) -> Optional[RowTiling]:
    """The looped forward's config where cfg is the single-block kernel over four chunks past 8192 columns (32
    elements a thread): plan_rows_forward plans it instead where that compiled kernel spills registers."""
    if cfg.fused and cfg.chunks == 4 and n > 8192:
        return forward_config(n, dtype, row_limits(limits).capped(8192))
    return None


def backward_config(
    n: int,
    dtype: torch.dtype,
    limits: Optional[RowLimits] = None,
    *,
    held: Optional[torch.dtype] = None,
    sums: int = 0,
) -> RowTiling:
    """Backward tiling: 8 elements per thread (4 for fp64) up to 16 warps: x, grad_out, xhat, dy, dxhat and the
    dgamma/dbeta accumulator tiles are live together. Rows of N = 2^k >= 1024 (not fp64) take one row per tile
    at 16 elements per thread (N / 512 warps: 2 at 1024 .. 16 at 8192), so that a thread holds 16 elements of
    its row and the row's reductions, address math and Philox keys are spread over twice as many elements (more
    programs, so more partial rows G, which stage 2 reads back). N in limits.wide_bwd_n (12288, 16384; not fp64):
    the wide kernels (wide_backward_config)."""
    limits = row_limits(limits)
    fp64 = dtype == torch.float64
    if not fp64 and n in limits.wide_bwd_n:
        wide = wide_backward_config(n, dtype, held, sums)
        if wide is not None:
            return wide
    max_fused_n = limits.bwd_max_fused_n_fp64 if fp64 else limits.bwd_max_fused_n
    if n <= max_fused_n:
        if not fp64 and n >= 1024 and n == triton.next_power_of_2(n):
            return RowTiling(fused=True, block_m=1, block_n=n, num_warps=num_warps_for(n, 16), fast_rng=True)
        return row_fused_config(
            n,
            fp64,
            rows_elems=2048,  # half the forward's tile: five operands live per element
            per_thread=4 if fp64 else 8,
            chunk_per_thread=4 if fp64 else 8,  # 3-chunk rows: one warp per row at N = 768
            wide_chunk_per_thread=2 if fp64 else 4,  # chunks spanning several warps: fewer registers
        )
    # the looped backward: 1024-column chunks (the chunk kernel loads its chunk's weight and bias once), tiles of
    # 2048 elements as the single-block backward's (2 rows at 1024 columns)
    block_n = max(8, min(1024, triton.next_power_of_2(max_fused_n)))
    block_m = max(1, min(16, 2048 // block_n))
    warps = num_warps_for(block_m * block_n, 4 if fp64 else 8)
    return RowTiling(fused=False, block_m=block_m, block_n=block_n, num_warps=warps, fast_rng=n % 8 == 0)


def wide_backward_config(n: int, dtype: torch.dtype, held: Optional[torch.dtype], sums: int) -> Optional[RowTiling]:
    """The wide kernels' tiling (one row a tile, holding the raw row): 4096-column chunks at 16 warps (128
    registers) where every operand they hold is 16-bit, else (held: the widest of them, default dtype; fp32 x, or
    dropout_add_norm's fp32 sum) 2048-column chunks at 8 warps (255 registers). None where the row as held (x's
    and held's bytes an element) and the `sums` accumulators (dgamma, dbeta) would take more of a thread's
    registers than WIDE_BWD_REGS allows: the looped kernels are planned at once, without compiling a kernel known
    to spill; where the compiled kernel spills all the same, plan_rows_backward takes wide_backward_fallback's
    looped kernels."""
    held = held or dtype
    wide = RowTiling(fused=True, block_m=1, block_n=4096, num_warps=16, fast_rng=True, chunks=n // 4096)
    if held.itemsize != 2:
        wide = RowTiling(fused=True, block_m=1, block_n=2048, num_warps=8, fast_rng=True, chunks=n // 2048)
    elems = n // (32 * wide.num_warps)  # of the row, a thread
    if elems * ((dtype.itemsize + held.itemsize) / 4 + sums) <= WIDE_BWD_REGS[wide.num_warps]:
        return wide
    return None


def wide_kwargs(cfg: RowTiling, dtype: torch.dtype) -> dict:
    """The wide backward kernels' own constexprs: VEC, the elements a thread holds side by side (a 16-byte vector,
    or fewer where the chunk gives a thread fewer), OPAQUE (row_hold's asm, off under the interpreter) and HOLD,
    the chunks of x (dropout_add_norm: of the sum) held across the row sums: all of them (wide_holds: fewer)."""
    per_thread = cfg.block_n // (32 * cfg.num_warps)
    return dict(VEC=max(1, min(16 // dtype.itemsize, per_thread)), OPAQUE=not INTERPRETED, HOLD=cfg.chunks)


def wide_holds(cfg: RowTiling, n: int, limits: Optional[RowLimits] = None) -> tuple:
    """The HOLD values plan_rows_backward tries, in turn, where the compiled wide kernel holding its whole row
    spills: one chunk fewer at a time, down to half the row (the rest read again in pass 2, from L2 in the
    performance model, at half the cost of a DRAM read: re-reading half of x estimates 0.85-0.88 in the kinds
    measured, against 0.5-0.7 for the looped kernels). Empty where cfg is not the wide kernels' plan."""
    if not is_wide_backward(cfg, n, limits):
        return ()
    return tuple(range(cfg.chunks - 1, (cfg.chunks + 1) // 2 - 1, -1))


def is_wide_backward(cfg: RowTiling, n: int, limits: Optional[RowLimits] = None) -> bool:
    """Whether cfg, from backward_config under these limits, is the wide kernels' plan (single-block past
    bwd_max_fused_n)."""
    return cfg.fused and n > row_limits(limits).bwd_max_fused_n


def wide_backward_fallback(
    cfg: RowTiling, n: int, dtype: torch.dtype, limits: Optional[RowLimits] = None
) -> Optional[RowTiling]:
    """The looped backward's config where cfg is the wide kernel's (past 8192 columns: N = 12288 and 16384):
    plan_rows_backward plans it instead where that compiled kernel spills registers."""
    if is_wide_backward(cfg, n, limits):
        limits = row_limits(limits)
        return backward_config(n, dtype, limits.capped(limits.bwd_max_fused_n))
    return None


def row_forward_plan(fused_kernel, looped_kernel, x, args, flags: dict, *, sm_count, facts, limits) -> LaunchPlan:
    """The forward launch of a row-normalization op on x viewed as (M, N): its kernels' arguments `args`, the
    constexprs the call fixes (`flags`: HAS_*, RMS, RELU, DROPOUT, MAPPED), tiled by forward_config under limits,
    the single-block kernel persistent over SMs x the resident programs per SM of its compiled kernel, or the
    looped one (rows.plan_rows_forward; sm_count and facts as there)."""
    n = int(x.shape[-1])
    m = x.numel() // n
    cfg = forward_config(n, x.dtype, limits)
    kwargs = dict(
        flags,
        FAST_RNG=cfg.fast_rng,
        IS_FP64=x.dtype == torch.float64,
        BLOCK_N=cfg.block_n,
        RTNE_BF16=INTERPRETED,
        num_warps=cfg.num_warps,
    )
    kernel, grid, kwargs = plan_rows_forward(
        fused_kernel,
        looped_kernel,
        cfg,
        m,
        n,
        x.device,
        args,
        kwargs,
        sm_count=sm_count,
        facts=facts,
        looped_cfg=wide_fallback(cfg, n, x.dtype, limits),
    )
    return LaunchPlan(kernel=kernel, grid=grid, kwargs=kwargs)
