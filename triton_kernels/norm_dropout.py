"""Launch helpers of the norm-rows Triton kernels (norm_dropout_forward.py, norm_dropout_backward.py): LayerNorm ->
Dropout -> ReLU (layer_norm_dropout_relu) and norm_dropout, forward and backward.

The kernels serve both ops through two constexprs: RMS (RMSNorm: rstd = 1 / sqrt(mean(x^2) + eps),
xhat = x * rstd, the mean output not written; the looped forward keeps a running sum of squares; the backward has
no c2 term) and RELU (the ReLU after the dropout; without it out = keep ? y * scale : 0, dropped elements selected
to zero). layer_norm_dropout_relu launches RMS=False, RELU=True: its code is that of the kernels without the flags.

Plain-Python planners and launchers: no torch.library here (the registrations live in
gpuopt_ops/triton_ops.py). The math is that of csrc/fused_math.h, the dropout RNG that of docs/DESIGN.md:

- Philox4x32-10 through ``tl.philox(seed, c0, c1, c2, c3)`` with uint32 counters; tl.philox splits the 64-bit
  seed into the key (seed & 0xffffffff, seed >> 32). The seed is loaded inside the kernel from the int64 seed
  tensor (no host sync). Element idx (int64 linear index in the contiguous (M, N) view) belongs to group
  g = idx >> 3, counter (g lo32, g hi32, 0, 0), and takes the 16-bit lane k = idx & 7 of the four output words
  (even k: low half of word k >> 1, odd k: high half). keep <=> u >= t, t = round(p * 65536) computed on the
  host, kept values scaled by 65536 / (65536 - t) (computed in the kernel, in the accumulation dtype);
  t = 65536 gives exact zeros through a select.
- Shard map: a 4-element seed [seed, base, period, jump] (a shard of a larger tensor; base, period and jump
  multiples of N) numbers row r's element c from row_start(r) + c, row_start(r) = r*N + base + ((r*N) // period) *
  jump, the element's index in the whole tensor (addressing stays r * N). MAPPED (seed.numel() == 4) is a
  constexpr: a 1-element seed compiles the kernels without it; a mapped launch loads the map once per program where
  it loads the seed (rows.row_load_map) and maps each row's start once per tile (rows.row_map_index). Row starts
  stay multiples of 8 when N is, so the fast path below serves mapped launches too.
- Fast RNG path (N % 8 == 0, so a tile's groups never straddle rows): one Philox call per 8 elements, lanes
  interleaved with tl.join + tl.reshape into element order. Its Philox is _philox: tl.philox's rounds and
  constants, bit for bit, with each 32 x 32 -> 64-bit product from one widening multiply. The persistent kernels
  load the seed once per program and derive each tile's from it (row_tile_seed), so that ptxas neither keeps the
  round keys live across the loop nor waits for a seed load per tile. Generic path (any N): one call per element, the
  lane picked with selects. DROPOUT=False (p = 0) does no RNG work at all.
- Statistics and accumulation in fp32 (fp64 for fp64 x). eps is passed as an fp32 pair (hi + lo) so the fp64
  kernels see eps to ~48 bits instead of fp32's 24 (Triton passes Python floats as fp32).
- Exact arithmetic where the C++ kernels are exact: mean and variance multiply the sums by a correctly rounded
  1/N (tl.div_rn, the CPU fp32 kernels' 1.0f / float(N), CUDA's A(1) / A(N)); rstd = 1 / sqrt_rn with IEEE
  division; Chan's merge divides with tl.div_rn. Triton's fp32 `/` (approximate div.full.f32) is not used.
  Bit-identical across backends: the dropout masks and scale. Only close (summation order): the statistics
  and everything computed from them, and the column sums (docs/DESIGN.md, "Triton arithmetic").

Tuning (chosen from N on the host; no autotune, which the interpreter would only slow down). The rule is a
fixed number of elements per thread, num_warps = tile / (32 x per_thread) clamped to 1..16, with per_thread
16 in the forward and 8 in the backward (halved for fp64). Checked with ptxas for sm_90 (compiled without a
GPU with the specialization of a real launch: `python -m tools.triton_resources`, the static gate of the
tests): no configuration spills. Measured on an H200 once (the wheel of f5132bd: docs/RESULTS.md and
docs/measurements/). Every launch runs under x's device (device_guard).

- Row chunks (single-block kernels): N = 3 x 2^k (768, 1536, 3072, 6144) is three chunks of N / 3 columns, so no
  lane runs Philox and the math on padding (one padded BLOCK_N = 1024 at N = 768 wasted 25 %); BLOCK_M then grows
  until every chunk still gives each thread a 4-element vector (2 for fp64). In the forward, 12288 is three
  chunks of 4096 and N = 2^k >= 1024 (not fp64) four chunks of N / 4. Other N: one chunk of next_power_of_2(N).
- Persistent grids: the single-block kernels and the backward chunk kernel run G = min(row tiles, SMs x resident
  programs per SM) programs, program p taking row tiles p, p + G, ... The resident count comes from the compiled
  kernel itself (common.programs_per_sm: on a GPU kernel.warmup for the device with 16-byte-aligned pointers, then
  its n_regs, shared memory and warps; tools/triton_resources.py passes the same facts from its sm_90 compile), so
  the grid is one full wave. 8 programs on the interpreter.
- Forward, single-block path when N <= 8192, or N = 12288 (three chunks of 4096) or 16384 (four chunks of 4096,
  32 elements a thread at 16 warps; where that compiled kernel spills registers, as triton 3.6's bf16 one does,
  it runs without holding the weight and bias, and where that spills too, the looped path: wide_fallback,
  rows.plan_rows_forward; fp64: N <= 4096):
  BLOCK_M = clamp(4096 // next_power_of_2(N), 1, 64) rows per tile. Rows of N = 2^k >= 1024 (not fp64) are four
  chunks of N / 4, so the tile's warps lie along the rows (one warp per row
  at N = 1024) and each thread holds 32 elements of its row: the row's reductions and the per-tile work are
  spread over more elements. Without padded columns (EVEN_N) the column mask is constant and the deviations
  need no select. Per program: the dropout scale, 1/N and eps once; with several rows per tile (BLOCK_M > 1) or
  16 warps (one resident program per SM anyway) the weight and bias are loaded and converted once and held
  across the loop (other long rows load them per tile: holding them would cost a resident program). Per tile:
  every chunk of x is loaded before the first reduction, statistics are exact two-pass (mean, then sum of
  squared deviations) from registers: x is read once.
- Forward, looped path for other rows (and fp64 past 4096): one row per program, chunks of 4096 columns (2048
  for fp64), 8 warps. Pass 1 merges the per-chunk (count, mean, M2) with Chan's formula (exact per chunk, no
  E[x^2] - E[x]^2 cancellation); pass 2 re-reads x and writes the output: two reads of x.
- Backward, single-block path when N <= 8192 (2048 for fp64): BLOCK_M = clamp(2048 // next_power_of_2(N), 1,
  64) rows per tile (N = 2^k >= 1024, not fp64: one row per tile at 16 elements per thread, N / 512 warps);
  per tile all loads (x, grad_out, mean, rstd, weight, bias of every chunk) are issued before
  the reductions, xhat, dy and dxhat are computed once; c1 = mean(dxhat * xhat), c2 = mean(dxhat), dx; dgamma /
  dbeta accumulate element-wise in [BLOCK_M, BLOCK_N] register tiles, reduced over rows once at the end into
  the program's partial row. The weight and bias are reloaded per tile (L1 hits): held across the loop they
  would cost ~10-20 registers, a second resident program at N = 4096. The seed is read once per program and
  each tile's derived from it (row_tile_seed): a loop-invariant seed lets ptxas hoist Philox's round keys and keep
  them live (~30 registers).
  ``sum_partials_kernel`` reduces the G partial rows of dgamma and dbeta in one launch, in a fixed order
  (deterministic: no float atomics; the bits depend on (shape, dtype, device, Triton version), never on
  timing).
- Backward, wide path (nd_bwd_wide_kernel) for N = 12288 and 16384 (not fp64): one row a tile in 4096-column
  chunks at 16 warps (2048 at 8 warps for fp32 x). The raw x and grad_out of every chunk are loaded first and
  held as loaded (16-bit data two to a register, row_hold), grad_out selected by the keep and ReLU bits in pass
  1, which adds the row sums' per-thread parts; pass 2 converts them again and reloads the weight. Where the
  compiled kernel spills (16384, except RMSNorm-dropout in 16 bits), plan_rows_backward plans the looped
  kernels instead (wide_backward_fallback).
- Backward, looped path: kernel A computes c1, c2 of one row per program (1024-column chunks, 4 warps);
  kernel B runs a (1024-column chunk x row group) grid, tiles of 2 rows, computing dx and the dgamma/dbeta
  partials with its chunk's weight and bias loaded once; then the same reduction. x and grad_out are read twice.

All indexing is int64 (row * N), grids are (tiles,) or (chunks, groups) with groups <= 65535, so M > 65535 and
numel > 2^31 are fine.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import plans
from .common import INTERPRETED, acc_dtype, device_guard, launch_directly, num_warps_for, planned, zero_sums
from .norm_dropout_backward import (  # noqa: F401  (the kernels: re-exported here)
    nd_bwd_chunk_kernel,
    nd_bwd_fused_kernel,
    nd_bwd_row_coef_kernel,
    nd_bwd_wide_kernel,
)
from .norm_dropout_forward import nd_fwd_fused_kernel, nd_fwd_looped_kernel  # noqa: F401
from .rows import (  # noqa: F401  (RowTiling, dropout_threshold, eps_pair: re-exported here)
    RowsBackwardPlan,
    RowTiling,
    dropout_threshold,
    eps_pair,
    plan_rows_backward,
    run_rows_backward,
    seed_mapped,
)


# ------------------------------------------------------------------------------------------- launch plans
def _forward_args(x, weight, bias, seed, out, mean, rstd, p: float, eps: float, rms: bool) -> tuple:
    """(M, N, the threshold, the forward kernels' arguments) of a launch_forward call."""
    n = int(x.shape[-1])
    t = dropout_threshold(p)
    w = weight if weight is not None else x  # never read when HAS_W is False
    b = bias if bias is not None else x
    mu = rstd if rms else mean  # never written for RMSNorm
    m = x.numel() // n
    return m, n, t, (x, w, b, seed, out, mu, rstd, m, n, *eps_pair(eps), t)


def plan_forward(
    x, weight, bias, seed, out, mean, rstd, p: float, eps: float, *, rms: bool = False, relu: bool = True,
    sm_count: Optional[int] = None, facts=None, limits: Optional[plans.RowLimits] = None,
) -> plans.LaunchPlan:  # fmt: skip
    """The forward's launch (launch_forward's arguments): the single-block kernel, persistent over SMs x the
    resident programs per SM of its compiled kernel (common.programs_per_sm), 8 programs on the interpreter, or
    the looped one (rows.plan_rows_forward). Knobs: sm_count (default: the device's, DEFAULT_SM_COUNT for meta
    tensors), `facts` (replaces the compiled-kernel query, as tools/triton_resources.py does), limits (default
    plans.ROW_LIMITS)."""
    _, _, t, args = _forward_args(x, weight, bias, seed, out, mean, rstd, p, eps, rms)
    flags = dict(
        HAS_W=weight is not None,
        HAS_B=bias is not None,
        DROPOUT=t != 0,
        RMS=bool(rms),
        RELU=bool(relu),
        MAPPED=seed_mapped(seed),
    )
    knobs = dict(sm_count=sm_count, facts=facts, limits=limits)
    return plans.row_forward_plan(nd_fwd_fused_kernel, nd_fwd_looped_kernel, x, args, flags, **knobs)


def _backward_kwargs(cfg: RowTiling, n: int, x, has_w: bool, has_b: bool, t: int, rms, relu, mapped, limits):
    """(cfg, the kernels' constexprs and num_warps, the row-coefficient launch of the looped path) of a tiling."""
    kwargs = dict(
        HAS_W=has_w,
        HAS_B=has_b,
        DROPOUT=t != 0,
        FAST_RNG=cfg.fast_rng,
        IS_FP64=x.dtype == torch.float64,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        RTNE_BF16=INTERPRETED,
        RMS=bool(rms),
        RELU=bool(relu),
        MAPPED=mapped,
        num_warps=cfg.num_warps,
    )
    if plans.is_wide_backward(cfg, n, limits):  # nd_bwd_wide_kernel
        kwargs.update(plans.wide_kwargs(cfg, x.dtype))
    coef_kwargs = {k: v for k, v in kwargs.items() if k not in ("BLOCK_M", "VEC", "OPAQUE")}
    coef_kwargs["num_warps"] = num_warps_for(cfg.block_n, 8)
    # nd_bwd_row_coef_kernel(*head, c1, c2, M, N, threshold)
    return cfg, kwargs, (nd_bwd_row_coef_kernel, range(7), True, coef_kwargs)


def _backward_head(grad_out, x, weight, bias, mean, rstd, seed, rms: bool) -> tuple:
    """The backward kernels' leading arguments (absent parameters stand in by x: never read)."""
    w = weight if weight is not None else x
    b = bias if bias is not None else x
    mu = rstd if rms else mean  # never read for RMSNorm
    return grad_out, x, w, b, mu, rstd, seed


def plan_backward(
    grad_out, x, weight, bias, mean, rstd, seed, grad_x, grad_w, grad_b, p: float, *, rms: bool = False,
    relu: bool = True, sm_count: Optional[int] = None, facts=None, limits: Optional[plans.RowLimits] = None,
) -> RowsBackwardPlan:  # fmt: skip
    """The backward's launches (launch_backward's arguments; rows.plan_rows_backward): G, and with it the bits of
    dgamma / dbeta, is fixed by (shape, dtype, device): SMs x the resident programs per SM of the compiled
    persistent kernel, 8 on the interpreter. Knobs as in plan_forward."""
    limits = plans.row_limits(limits)
    m, n, has_w, has_b, t = plans.backward_facts(x, weight, bias, p)
    acc = acc_dtype(x.dtype)
    head = _backward_head(grad_out, x, weight, bias, mean, rstd, seed, rms)
    flags = (x, has_w, has_b, t, rms, relu, seed_mapped(seed), limits)
    cfg = plans.backward_config(n, x.dtype, limits, sums=int(has_w) + int(has_b))
    looped = plans.wide_backward_fallback(cfg, n, x.dtype, limits)
    cfg, kwargs, coef = _backward_kwargs(cfg, n, *flags)
    fused = nd_bwd_wide_kernel if plans.is_wide_backward(cfg, n, limits) else nd_bwd_fused_kernel
    looped_kwargs = _backward_kwargs(looped, n, *flags) if looped is not None else None
    knobs = dict(sm_count=sm_count, facts=facts, looped=looped_kwargs, holds=plans.wide_holds(cfg, n, limits))
    return plan_rows_backward(
        fused, nd_bwd_chunk_kernel, coef, cfg, m, n, x.device, acc, head, (grad_x,), t, has_w, has_b, kwargs, **knobs
    )


# ----------------------------------------------------------------------------------------------- launchers
def launch_forward(
    x, weight, bias, seed, out, mean, rstd, p: float, eps: float, *, rms: bool = False, relu: bool = True,
    wrap=launch_directly, plan: Optional[plans.LaunchPlan] = None,
) -> None:  # fmt: skip
    """Runs the forward on contiguous x (M, N) view into the preallocated out, mean, rstd, under x's device.

    rms / relu: norm_dropout's flags (RMSNorm instead of LayerNorm, then mean is the (0,) tensor and never
    written; the ReLU after the dropout); the defaults are layer_norm_dropout_relu.

    `wrap` is applied to each kernel before launching (torch.library.wrap_triton inside a triton_op). `plan`:
    plan_forward's for these arguments; by default plan_forward's without knobs, kept per call key
    (common.planned)."""
    m, n, t, args = _forward_args(x, weight, bias, seed, out, mean, rstd, p, eps, rms)
    if m == 0:
        return
    if plan is None:  # keyed by this module's kernel first: a copy of the module with other kernels plans its own
        flags = (weight is None, bias is None, t, bool(rms), bool(relu))
        key = plans.plan_key(nd_fwd_fused_kernel, m, n, (x, *args[1:3], out, rstd), flags, seed, x.device)
        make = lambda: plan_forward(x, weight, bias, seed, out, mean, rstd, p, eps, rms=rms, relu=relu)  # noqa: E731
        plan = planned(m, key, make)
    with device_guard(x.device):
        wrap(plan.kernel)[plan.grid](*args, **plan.kwargs)


def launch_backward(
    grad_out, x, weight, bias, mean, rstd, seed, grad_x, grad_w, grad_b, p: float, *, rms: bool = False,
    relu: bool = True, wrap=launch_directly, plan: Optional[RowsBackwardPlan] = None,
) -> None:  # fmt: skip
    """Runs the backward on contiguous inputs into the uninitialised grad_x and (when weight/bias exist)
    grad_w/grad_b, under x's device. rms / relu as in launch_forward (for RMSNorm mean is never read).

    The dgamma/dbeta partials go to one buffer of two (G, N) sets in the accumulation dtype, reduced in a fixed
    order by one stage-2 launch (plan_backward). `plan`: plan_backward's for these arguments; by default
    plan_backward's without knobs, kept per call key (common.planned)."""
    m, n, has_w, has_b, t = plans.backward_facts(x, weight, bias, p)
    if m == 0:
        zero_sums(grad_w, grad_b)
        return
    head = _backward_head(grad_out, x, weight, bias, mean, rstd, seed, rms)
    if plan is None:
        flags = (has_w, has_b, t, bool(rms), bool(relu))
        key = plans.plan_key(nd_bwd_fused_kernel, m, n, (grad_out, *head[1:4], rstd, grad_x), flags, seed, x.device)
        args = (grad_out, x, weight, bias, mean, rstd, seed, grad_x, grad_w, grad_b, p)
        plan = planned(m, key, lambda: plan_backward(*args, rms=rms, relu=relu))
    acc = acc_dtype(x.dtype)
    grads = (grad_w if has_w else None, grad_b if has_b else None)
    run_rows_backward(plan, head, (grad_x,), *grads, m, n, t, x.device, acc, wrap=wrap)
