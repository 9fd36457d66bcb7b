"""Triton kernels of dropout -> add -> LayerNorm / RMSNorm (forward and backward) and their launch helpers.

Pure ``@triton.jit`` code plus plain-Python launchers: no torch.library here (the registrations live in
gpuopt_ops/triton_ops.py). The contract is docs/DESIGN.md (`dropout_add_norm`):

- s = dropout_p(x) + residual in the accumulation dtype (fp32; fp64 for fp64 x), stored as `sum` in dtype S (fp32
  with residual_in_fp32 for 16-bit x, else x's dtype); the norm reads s as stored (rounded to S, converted back).
  The keep bit of element idx is the Philox lane of docs/DESIGN.md section 2, bit for bit the one
  layer_norm_dropout_relu uses at idx (the helpers of rows.py: the fast 8-lane Philox when N % 8 == 0, one call
  per element otherwise, none when p = 0), under a 4-element seed's shard map as there (each row's first index
  mapped: rows.row_map_index); dropped values are selected to exact zeros, kept ones multiplied by
  65536 / (65536 - t).
- LayerNorm: mean, then the centred squares (two passes over registers, or Chan's merge of per-chunk statistics
  on the looped path); RMSNorm: rstd = 1 / sqrt(mean(s^2) + eps), xhat = s * rstd. 1/N correctly rounded, IEEE
  sqrt and division, as layer_norm_dropout_relu. out = xhat * weight + bias (each optional) in x's dtype.
- Backward: xhat recomputed from the stored sum and mean / rstd; dxhat = grad_out * weight; c1 = mean(dxhat *
  xhat), c2 = mean(dxhat) (LayerNorm only); dS = rstd * (dxhat - xhat * c1 - c2) + grad_sum; grad_residual = dS in
  S, grad_x = keep ? dS * scale : 0 in x's dtype; dgamma / dbeta partials accumulate grad_out * xhat and grad_out
  element-wise and go through the one stage-2 launch of common.launch_sum_partials (deterministic, no atomics).

Tiling: exactly that of layer_norm_dropout_relu (plans.forward_config / plans.backward_config, read at every launch
by this module's own planners): the single-block kernels take rows of N = 3 x 2^k as three chunks of N / 3 and
(forward) N = 2^k >= 1024 as four chunks, without padded lanes; they are persistent, SMs x the resident programs per
SM of the compiled kernel (common.programs_per_sm), 8 programs on the interpreter. Every load of a tile (x and the
residual of every chunk in the forward; the sum, grad_out and, later, grad_sum in the backward) is issued before its
first reduction, so a row is read from DRAM once; the backward at N = 12288 and 16384 is dan_bwd_wide_kernel, which
holds the raw sum and grad_out across the row sums (layer_norm_dropout_relu's wide path; 2048-column chunks at 8
warps where the sum or x is fp32), and runs only where that compiled kernel does not spill (else looped, see
plans.wide_backward_fallback). Longer rows take the looped kernels: the forward writes the sum in pass 1 (with the
row's statistics) and re-reads it in pass 2; the backward computes c1, c2 per row and then runs a (column chunk x
row group) grid for grad_x, grad_residual and the partials.

All indexing is int64 (row * N).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from . import plans
from .common import (
    INTERPRETED,
    acc_dtype,
    device_guard,
    launch_directly,
    num_warps_for,
    planned,
    to_acc,
    to_out,
    zero_sums,
)
from .norm_dropout_backward import (
    bwd_accumulate,
    bwd_chunk_setup,
    bwd_chunk_tile,
    bwd_coef_start,
    bwd_fused_setup,
    bwd_load_rng,
    bwd_load_tiles,
    bwd_row_coefs,
    bwd_store_partials,
    bwd_tile_rng,
    bwd_tile_rows,
    bwd_tile_stats,
    bwd_wide_row,
    bwd_wide_row_state,
    bwd_wide_setup,
)
from .norm_dropout_forward import (
    fwd_looped_start,
    fwd_store_stats,
)
from .rows import (
    RowsBackwardPlan,
    RowTiling,
    dropout_threshold,
    eps_pair,
    plan_rows_backward,
    row_centred,
    row_dropout_scale,
    row_eps,
    row_fused_setup,
    row_held_chunk,
    row_held_params,
    row_hold,
    row_inv_n,
    row_keep_tile,
    row_load_chunk_param,
    row_load_map,
    row_load_param,
    row_load_param_tile,
    row_load_raw_chunks,
    row_load_seed,
    row_map_index,
    row_merge_stats,
    row_moments,
    row_param_tiles,
    row_raw_chunk,
    row_rsqrt,
    row_thread_sums,
    row_tile_rng,
    row_tile_rows,
    run_rows_backward,
    seed_mapped,
)


# ----------------------------------------------------------------------------------------------- jit helpers
@triton.jit
def _sum_chunk(
    X, R, SUM, offs, mask, drop, col0, cols,
    HAS_R: tl.constexpr, DROPOUT: tl.constexpr, FAST_RNG: tl.constexpr, IS_FP64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, RTNE_BF16: tl.constexpr,
):  # fmt: skip
    """s = dropout(x) + residual of the chunk at offs + col0, stored at SUM; returns s as stored (rounded to SUM's
    dtype), in the accumulation dtype. Dropped elements are selected to zero before the add (p = 1: s = residual).
    drop: the dropout's (seed, the rows' first indices, threshold, scale)."""
    seed, base, threshold, scale = drop
    x = to_acc(tl.load(X + offs + col0, mask=mask, other=0.0), IS_FP64)
    if HAS_R:
        r = to_acc(tl.load(R + offs + col0, mask=mask, other=0.0), IS_FP64)
    if DROPOUT:
        keep = row_keep_tile(seed, base, col0, cols, threshold, BLOCK_M, BLOCK_N, FAST_RNG)
        # the product, then the select: the select keeps the compiler from fusing x * scale + residual into one
        # FMA, so the sum is rounded as the other backends round it
        x = tl.where(keep, x * scale, 0.0)
    if HAS_R:
        x = x + r
    stored = to_out(x, SUM, RTNE_BF16)
    tl.store(SUM + offs + col0, stored, mask=mask)
    return to_acc(stored, IS_FP64)


@triton.jit
def _out_chunk(OUT, offs, mask, d, rstd, w, b, col0, HAS_W: tl.constexpr, HAS_B: tl.constexpr, RTNE_BF16: tl.constexpr):
    """out = d * rstd * w + b of one chunk (d: the deviations from the mean, or s for RMSNorm) at OUT + offs + col0."""
    y = d * rstd[:, None]
    if HAS_W:
        y = y * w.to(y.dtype)
    if HAS_B:
        y = y + b.to(y.dtype)
    tl.store(OUT + offs + col0, to_out(y, OUT, RTNE_BF16), mask=mask)


@triton.jit
def _xhat_dxhat(s, g, mean, rstd, w, HAS_W: tl.constexpr, RMS: tl.constexpr):
    """xhat of a chunk from its stored sum s, and dxhat = grad_out * weight."""
    if RMS:
        xhat = s * rstd[:, None]
    else:
        xhat = (s - mean[:, None]) * rstd[:, None]
    if HAS_W:
        dxhat = g * w.to(xhat.dtype)
    else:
        dxhat = g
    return xhat, dxhat


@triton.jit
def _grad_chunk(
    DX, DRES, GS, offs, mask, xhat, dxhat, rstd, c1, c2, seed, base, col0, cols, threshold, scale,
    HAS_GS: tl.constexpr, HAS_R: tl.constexpr, RMS: tl.constexpr, DROPOUT: tl.constexpr, FAST_RNG: tl.constexpr,
    IS_FP64: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, RTNE_BF16: tl.constexpr,
):  # fmt: skip
    """dS = rstd * (dxhat - xhat * c1 - c2) + grad_sum of one chunk; stores grad_residual = dS and
    grad_x = keep ? dS * scale : 0."""
    if RMS:
        ds = rstd[:, None] * (dxhat - xhat * c1[:, None])
    else:
        ds = rstd[:, None] * (dxhat - xhat * c1[:, None] - c2[:, None])
    if HAS_GS:
        ds = ds + to_acc(tl.load(GS + offs + col0, mask=mask, other=0.0), IS_FP64)
    if HAS_R:
        tl.store(DRES + offs + col0, to_out(ds, DRES, RTNE_BF16), mask=mask)
    if DROPOUT:
        keep = row_keep_tile(seed, base, col0, cols, threshold, BLOCK_M, BLOCK_N, FAST_RNG)
        ds = tl.where(keep, ds, 0.0) * scale  # select first: a dropped inf gives 0, never 0 * inf
    tl.store(DX + offs + col0, to_out(ds, DX, RTNE_BF16), mask=mask)


# -------------------------------------------------------------------------------------------------- forward
@triton.jit
def dan_fwd_fused_kernel(
    X, R,  # (M, N) x; (M, N) residual in S (x's dtype, or fp32 with residual_in_fp32), X without HAS_R: never read
    W, B,  # (N,) weight and bias, one dtype: x's or fp32; X where absent, never read
    SEED,  # (1,) int64 seed, or (4,) with the shard map (MAPPED); read only with DROPOUT
    OUT, SUM,  # (M, N) out in x's dtype; (M, N) the sum s in S, kept in registers as stored
    MEAN, RSTD,  # (M,) mean (RSTD for RMS, never written) and rstd, fp32 (fp64 for fp64 x)
    M, N, eps_hi, eps_lo, threshold,
    HAS_R: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, RMS: tl.constexpr, DROPOUT: tl.constexpr,
    FAST_RNG: tl.constexpr, IS_FP64: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CHUNKS: tl.constexpr, HOIST_PARAMS: tl.constexpr, EVEN_N: tl.constexpr, RTNE_BF16: tl.constexpr,
    MAPPED: tl.constexpr,
):  # fmt: skip
    """s = (keep ? x * scale : 0) + r, stored in S and used as stored; out = xhat * w + b, xhat = (s - mean) * rstd,
    rstd = 1 / sqrt(mean((s - mean)^2) + eps); RMS: xhat = s * rstd, rstd = 1 / sqrt(mean(s^2) + eps).

    Single-block forward, persistent: program p takes row tiles p, p + G, ... of BLOCK_M whole rows, one chunk
    of BLOCK_N >= N columns or CHUNKS = 3 or 4 chunks of N / CHUNKS. Per tile: every chunk's x and residual are
    loaded and the sum stored before the first reduction; the statistics come from the registers, so x, the
    residual and the sum each cross DRAM once. The weight and bias are held across the loop with HOIST_PARAMS."""
    scale, inv_n, eps, cols, cmask = row_fused_setup(N, eps_hi, eps_lo, threshold, IS_FP64, BLOCK_N, EVEN_N)
    seed0 = row_load_seed(SEED, DROPOUT)
    mbase, period, jump = row_load_map(SEED, DROPOUT, MAPPED)
    if HOIST_PARAMS:
        ws, bs = row_held_params(W, B, cols, cmask, HAS_W, HAS_B, IS_FP64, CHUNKS, BLOCK_N)
    num_tiles = tl.cdiv(M, BLOCK_M)
    for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        rows, row_mask, mask, base = row_tile_rows(tile, cmask, M, N, BLOCK_M)
        seed, rng = row_tile_rng(seed0, tile, threshold, base, mbase, period, jump, MAPPED)
        offs = base[:, None] + cols[None, :]
        ss = ()
        for c in tl.static_range(CHUNKS):
            drop = (seed, rng, threshold, scale)
            s_c = _sum_chunk(
                X,
                R,
                SUM,
                offs,
                mask,
                drop,
                c * BLOCK_N,
                cols,
                HAS_R,
                DROPOUT,
                FAST_RNG,
                IS_FP64,
                BLOCK_M,
                BLOCK_N,
                RTNE_BF16,
            )
            ss = ss + (s_c,)
        mean, ds, rstd = row_moments(ss, mask, inv_n, eps, RMS, EVEN_N, IS_FP64, CHUNKS)
        if not HOIST_PARAMS:
            ws, bs = row_param_tiles(W, B, cols, cmask, HAS_W, HAS_B, CHUNKS, BLOCK_M, BLOCK_N)
        fwd_store_stats(MEAN, RSTD, rows, row_mask, mean, rstd, RMS)
        for c in tl.static_range(CHUNKS):
            _out_chunk(OUT, offs, mask, ds[c], rstd, ws[c], bs[c], c * BLOCK_N, HAS_W, HAS_B, RTNE_BF16)


@triton.jit
def dan_fwd_looped_kernel(
    X, R,  # (M, N) x; (M, N) residual in S (x's dtype, or fp32 with residual_in_fp32), X without HAS_R: never read
    W, B,  # (N,) weight and bias, one dtype: x's or fp32; X where absent, never read
    SEED,  # (1,) int64 seed, or (4,) with the shard map (MAPPED); read only with DROPOUT
    OUT, SUM,  # (M, N) out in x's dtype; (M, N) the sum s in S, written in pass 1 and read back in pass 2
    MEAN, RSTD,  # (M,) mean (RSTD for RMS, never written) and rstd, fp32 (fp64 for fp64 x)
    M, N, eps_hi, eps_lo, threshold,
    HAS_R: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, RMS: tl.constexpr, DROPOUT: tl.constexpr,
    FAST_RNG: tl.constexpr, IS_FP64: tl.constexpr, BLOCK_N: tl.constexpr, RTNE_BF16: tl.constexpr,
    MAPPED: tl.constexpr,
):  # fmt: skip
    """s = (keep ? x * scale : 0) + r, stored in S and used as stored; out = xhat * w + b, xhat = (s - mean) * rstd,
    rstd = 1 / sqrt(mean((s - mean)^2) + eps); RMS: xhat = s * rstd, rstd = 1 / sqrt(mean(s^2) + eps).

    Looped forward for long rows: one row per program in BLOCK_N-column chunks. Pass 1 stores the sum and
    merges the chunks' statistics (Chan's formula for LayerNorm, the sum of squares for RMSNorm); pass 2 re-reads
    the stored sum (the same threads' own stores) and writes the output."""
    scale = row_dropout_scale(threshold, IS_FP64)
    seed = row_load_seed(SEED, DROPOUT)
    mbase, period, jump = row_load_map(SEED, DROPOUT, MAPPED)
    rows = tl.program_id(0).to(tl.int64) + tl.arange(0, 1).to(tl.int64)  # [1]: the helpers work on [rows, cols]
    base = rows * N
    rng = row_map_index(base, mbase, period, jump, MAPPED)  # each row's first dropout index
    cols, mean, m2 = fwd_looped_start(BLOCK_N, IS_FP64)
    for col0 in range(0, N, BLOCK_N):
        cmask = (col0 + cols) < N
        offs = base[:, None] + cols[None, :]
        mask = cmask[None, :]
        drop = (seed, rng, threshold, scale)
        s = _sum_chunk(
            X, R, SUM, offs, mask, drop, col0, cols, HAS_R, DROPOUT, FAST_RNG, IS_FP64, 1, BLOCK_N, RTNE_BF16
        )
        mean, m2 = row_merge_stats(mean, m2, s, mask, col0, N, BLOCK_N, RMS, IS_FP64)
    rstd = row_rsqrt(m2 * row_inv_n(N, IS_FP64) + row_eps(eps_hi, eps_lo, IS_FP64), IS_FP64)
    if not RMS:
        tl.store(MEAN + rows, mean)
    tl.store(RSTD + rows, rstd)
    tl.debug_barrier()  # pass 1's sum stores before pass 2 reads them back
    for col0 in range(0, N, BLOCK_N):
        cmask = (col0 + cols) < N
        offs = base[:, None] + cols[None, :]
        mask = cmask[None, :]
        s = to_acc(tl.load(SUM + offs + col0, mask=mask, other=0.0), IS_FP64)
        w = row_load_param_tile(W, col0, cols, cmask, HAS_W, 1)
        b = row_load_param_tile(B, col0, cols, cmask, HAS_B, 1)
        _out_chunk(OUT, offs, mask, row_centred(s, mean, mask, RMS, False), rstd, w, b, col0, HAS_W, HAS_B, RTNE_BF16)


# ------------------------------------------------------------------------------------------------- backward
@triton.jit
def dan_bwd_fused_kernel(
    DY, GS, S,  # (M, N) grad_out in x's dtype; (M, N) grad_sum and the saved sum s in S (GS: S without HAS_GS)
    W,  # (N,) weight, x's dtype or fp32; S without HAS_W, never read
    MEAN, RSTD,  # (M,) mean (RSTD for RMS, never read) and rstd, fp32 (fp64 for fp64 x)
    SEED,  # (1,) int64 seed, or (4,) with the shard map (MAPPED); read only with DROPOUT
    DX, DRES,  # (M, N) grad_x in x's dtype; (M, N) grad_residual in S (DX without HAS_R, never written)
    PDW,  # (G, N) dgamma partial rows, fp32 (fp64 for fp64 x), G the grid's programs; not written without HAS_W
    PDB,  # (G, N) dbeta partial rows, the set after PDW's (PDW's where there is no weight); written with HAS_B
    M, N, threshold,
    HAS_GS: tl.constexpr, HAS_R: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, RMS: tl.constexpr,
    DROPOUT: tl.constexpr, FAST_RNG: tl.constexpr, IS_FP64: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr, RTNE_BF16: tl.constexpr,
    MAPPED: tl.constexpr,
):  # fmt: skip
    """dS = rstd * (dxhat - xhat * c1 - c2) + grad_sum, c1 = mean(dxhat * xhat), c2 = mean(dxhat) (RMS: no c2 term),
    dxhat = dy * w, xhat = (s - mean) * rstd (RMS: s * rstd) of the stored sum s; grad_residual = dS, grad_x =
    (keep ? dS : 0) * scale, the keep bits drawn again; PDW[g] = sum(dy * xhat), PDB[g] = sum(dy) over program g's rows.

    Single-block backward, persistent over row tiles (1 chunk of BLOCK_N >= N columns or 3 chunks of N / 3, as
    tuples under tl.static_range): the sum and grad_out of every chunk are loaded before the reductions (c1, c2),
    xhat and dxhat computed once; grad_sum is read as each chunk's dS is formed. dgamma / dbeta accumulate
    element-wise in [BLOCK_M, BLOCK_N] register tiles, reduced over the rows once at the end into the program's
    partial row. The tile's steps are layer_norm_dropout_relu's fused backward's helpers (bwd_*)."""
    scale, inv_n, pid, cols, cmask, acc = bwd_fused_setup(N, threshold, IS_FP64, CHUNKS, BLOCK_M, BLOCK_N)
    seed0, mbase, period, jump = bwd_load_rng(SEED, DROPOUT, MAPPED)
    for tile in range(pid, tl.cdiv(M, BLOCK_M), tl.num_programs(0)):
        rows, row_mask, offs, mask = bwd_tile_rows(tile, 0, cols, cmask, M, N, BLOCK_M)
        seed, rng = bwd_tile_rng(seed0, tile, threshold, rows, N, mbase, period, jump, MAPPED)
        mean, rstd = bwd_tile_stats(MEAN, RSTD, rows, row_mask, acc[0], RMS)
        ss, gs = bwd_load_tiles(S, DY, offs, mask, CHUNKS, BLOCK_N, IS_FP64)
        # per tile (L1 hits), as ldr's; chunk 0's xhat and dxhat before the other chunks' weights are loaded
        w = row_load_param_tile(W, 0, cols, cmask, HAS_W, BLOCK_M)
        xhat, dxhat = _xhat_dxhat(ss[0], gs[0], mean, rstd, w, HAS_W, RMS)
        xhats = (xhat,)
        dxhats = (dxhat,)
        ws = ()
        for c in tl.static_range(1, CHUNKS):
            ws = ws + (row_load_param_tile(W, c * BLOCK_N, cols, cmask, HAS_W, BLOCK_M),)
        for c in tl.static_range(1, CHUNKS):
            xhat, dxhat = _xhat_dxhat(ss[c], gs[c], mean, rstd, ws[c - 1], HAS_W, RMS)
            xhats = xhats + (xhat,)
            dxhats = dxhats + (dxhat,)
        c1, c2 = bwd_row_coefs(dxhats, xhats, inv_n, CHUNKS, RMS)
        for c in tl.static_range(CHUNKS):
            _grad_chunk(
                DX, DRES, GS, offs, mask, xhats[c], dxhats[c], rstd, c1, c2, seed, rng, c * BLOCK_N, cols, threshold,
                scale, HAS_GS, HAS_R, RMS, DROPOUT, FAST_RNG, IS_FP64, BLOCK_M, BLOCK_N, RTNE_BF16,
            )  # fmt: skip
            if c == 0:
                acc = bwd_accumulate(acc, gs, xhats, HAS_W, HAS_B, 0, 1, CHUNKS)
        acc = bwd_accumulate(acc, gs, xhats, HAS_W, HAS_B, 1, CHUNKS, CHUNKS)
    bwd_store_partials(PDW, PDB, pid.to(tl.int64) * N, cols, cmask, acc, HAS_W, HAS_B, CHUNKS, BLOCK_N)


@triton.jit
def dan_bwd_wide_kernel(
    DY, GS, S, W,  # (M, N) grad_out in x's dtype; grad_sum, sum s in S (GS: S without HAS_GS); (N,) weight (or S)
    MEAN, RSTD, SEED,  # (M,) fp32 mean (RSTD for RMS) and rstd; (1,) int64 seed, or (4,) with the shard map (MAPPED)
    DX, DRES, PDW, PDB, M, N, threshold,  # (M, N) grad_x, grad_residual in S (DX without HAS_R); (G, N) fp32 partials
    HAS_GS: tl.constexpr, HAS_R: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, RMS: tl.constexpr,
    DROPOUT: tl.constexpr, FAST_RNG: tl.constexpr, IS_FP64: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr, RTNE_BF16: tl.constexpr, VEC: tl.constexpr, OPAQUE: tl.constexpr,
    HOLD: tl.constexpr, MAPPED: tl.constexpr,
):  # fmt: skip
    """dS = rstd * (dxhat - xhat * c1 - c2) + grad_sum, grad_x = (keep ? dS : 0) * scale: dan_bwd_fused_kernel's (fp32).
    Single-block backward of the widest rows (N = CHUNKS x BLOCK_N, 12288 and 16384; not fp64), persistent, one
    row a tile, as layer_norm_dropout_relu's nd_bwd_wide_kernel: every chunk of the sum and grad_out is loaded
    first and held raw (row_hold) across the row sums, which add per-thread parts chunk by chunk (row_thread_sums);
    after them each chunk's xhat and grad_out are converted again, the weight reloaded (its own cache modifier, so
    not merged with the first load), and dS, grad_residual, grad_x (the keep bits drawn here) and the dgamma /
    dbeta accumulators follow. VEC: the elements a thread holds side by side. HOLD: the chunks of the sum held, as
    in nd_bwd_wide_kernel (grad_out is always held)."""
    UPFRONT: tl.constexpr = HOLD == CHUNKS
    scale, inv_n, pid, cols, dw, db = bwd_wide_setup(N, threshold, CHUNKS, BLOCK_N)
    seed0, mbase, period, jump = bwd_load_rng(SEED, DROPOUT, MAPPED)
    for row in range(pid, M, tl.num_programs(0)):
        rows, offs, base = bwd_wide_row(row, N, cols)
        seed, rng, mean, rstd = bwd_wide_row_state(
            MEAN, RSTD, rows, base, seed0, row, threshold, mbase, period, jump, RMS, MAPPED
        )
        sr, gr = row_load_raw_chunks(S, DY, offs, CHUNKS, BLOCK_N, UPFRONT)
        s1 = tl.zeros([BLOCK_N // VEC], dtype=tl.float32)
        s2 = tl.zeros([BLOCK_N // VEC], dtype=tl.float32)
        sh = ()
        gh = ()
        for c in tl.static_range(CHUNKS):
            s_c = row_raw_chunk(S, offs, sr, c, BLOCK_N, UPFRONT)
            g_c = row_raw_chunk(DY, offs, gr, c, BLOCK_N, UPFRONT)
            w = row_load_chunk_param(W, c * BLOCK_N, cols, HAS_W, "")
            xhat, dxhat = _xhat_dxhat(s_c.to(tl.float32), g_c.to(tl.float32), mean, rstd, w, HAS_W, RMS)
            s1 += row_thread_sums(dxhat * xhat, BLOCK_N, VEC)
            s2 += row_thread_sums(dxhat, BLOCK_N, VEC)
            if c >= CHUNKS - HOLD:
                sh = sh + (row_hold(s_c, OPAQUE),)
            gh = gh + (row_hold(g_c, OPAQUE),)
        c1 = tl.sum(s1, axis=0) * inv_n
        c2 = tl.sum(s2, axis=0) * inv_n
        ndw = ()
        ndb = ()
        for c in tl.static_range(CHUNKS):
            w = row_load_chunk_param(W, c * BLOCK_N, cols, HAS_W, ".ca")  # not merged with pass 1's load
            g = gh[c].to(tl.float32)
            s_c = row_held_chunk(S, offs, sh, c, CHUNKS, HOLD, BLOCK_N)
            xhat, dxhat = _xhat_dxhat(s_c.to(tl.float32), g, mean, rstd, w, HAS_W, RMS)
            if RMS:
                ds = rstd[:, None] * (dxhat - xhat * c1[:, None])
            else:
                ds = rstd[:, None] * (dxhat - xhat * c1[:, None] - c2[:, None])
            if HAS_GS:
                ds = ds + tl.load(GS + offs + c * BLOCK_N).to(tl.float32)
            if HAS_R:
                tl.store(DRES + offs + c * BLOCK_N, to_out(ds, DRES, RTNE_BF16))
            if DROPOUT:
                keep = row_keep_tile(seed, rng, c * BLOCK_N, cols, threshold, 1, BLOCK_N, FAST_RNG)
                ds = tl.where(keep, ds, 0.0) * scale  # select first: a dropped inf gives 0, never 0 * inf
            tl.store(DX + offs + c * BLOCK_N, to_out(ds, DX, RTNE_BF16))
            ndw = ndw + (dw[c] + g * xhat,)
            ndb = ndb + (db[c] + g,)
        dw = ndw
        db = ndb
    prow = pid.to(tl.int64) * N
    for c in tl.static_range(CHUNKS):
        if HAS_W:
            tl.store(PDW + prow + c * BLOCK_N + cols, tl.sum(dw[c], axis=0))
        if HAS_B:
            tl.store(PDB + prow + c * BLOCK_N + cols, tl.sum(db[c], axis=0))


@triton.jit
def dan_bwd_row_coef_kernel(
    DY, S, W,  # (M, N) grad_out in x's dtype; (M, N) the saved sum s in S; (N,) weight (S without HAS_W, never read)
    MEAN, RSTD,  # (M,) mean (RSTD for RMS, never read) and rstd, fp32 (fp64 for fp64 x)
    C1, C2, M, N,  # (M,) c1 and c2 of each row, fp32 (fp64 for fp64 x)
    HAS_W: tl.constexpr, RMS: tl.constexpr, IS_FP64: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Looped backward, kernel A: c1 = mean(dxhat * xhat), c2 = mean(dxhat) of one row per program, dxhat = dy * w,
    xhat = (s - mean) * rstd (RMS: s * rstd; c2 is written but not used)."""
    rows = tl.program_id(0).to(tl.int64) + tl.arange(0, 1).to(tl.int64)
    row_mask = rows < M
    mean, rstd, cols, s1, s2 = bwd_coef_start(MEAN, RSTD, rows, row_mask, RMS, IS_FP64, BLOCK_N)
    for col0 in range(0, N, BLOCK_N):
        cmask, offs, mask = bwd_chunk_tile(rows, row_mask, col0, cols, N)
        ss, gs = bwd_load_tiles(S, DY, offs, mask, 1, BLOCK_N, IS_FP64)
        w = row_load_param_tile(W, col0, cols, cmask, HAS_W, 1)
        xhat, dxhat = _xhat_dxhat(ss[0], gs[0], mean, rstd, w, HAS_W, RMS)
        s1 += tl.sum(dxhat * xhat, axis=1)
        s2 += tl.sum(dxhat, axis=1)
    inv_n = row_inv_n(N, IS_FP64)
    tl.store(C1 + rows, s1 * inv_n, mask=row_mask)
    tl.store(C2 + rows, s2 * inv_n, mask=row_mask)


@triton.jit
def dan_bwd_chunk_kernel(
    DY, GS, S,  # (M, N) grad_out in x's dtype; (M, N) grad_sum and the saved sum s in S (GS: S without HAS_GS)
    W, MEAN, RSTD,  # (N,) weight (x's dtype or fp32; S if absent); (M,) mean (or RSTD for RMS) and rstd, fp32/fp64
    SEED,  # (1,) int64 seed, or (4,) with the shard map (MAPPED); read only with DROPOUT
    C1, C2,  # (M,) c1 and c2 of each row (dan_bwd_row_coef_kernel), fp32 (fp64 for fp64 x)
    DX, DRES,  # (M, N) grad_x in x's dtype; (M, N) grad_residual in S (DX without HAS_R, never written)
    PDW, PDB,  # (G, N) dgamma, dbeta partials, fp32 (fp64 for fp64 x), G the row groups; PDB = PDW when one is written
    M, N, threshold,
    HAS_GS: tl.constexpr, HAS_R: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, RMS: tl.constexpr,
    DROPOUT: tl.constexpr, FAST_RNG: tl.constexpr, IS_FP64: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, RTNE_BF16: tl.constexpr,
    MAPPED: tl.constexpr,
):  # fmt: skip
    """dS = rstd * (dxhat - xhat * c1 - c2) + grad_sum (RMS: no c2 term) with each row's c1, c2 from
    dan_bwd_row_coef_kernel, dxhat = dy * w; grad_residual = dS, grad_x = (keep ? dS : 0) * scale; PDW[g] =
    sum(dy * xhat), PDB[g] = sum(dy) over the rows of row tiles g, g + G, ..., in this program's column chunk.

    Looped backward, kernel B: grid (column chunks, row groups); grad_x, grad_residual and the dgamma / dbeta
    partials. A program keeps one column chunk, so its weight columns are loaded once."""
    scale, col0, pid, cols, cmask = bwd_chunk_setup(N, threshold, IS_FP64, BLOCK_N)
    w = row_load_param(W, col0, cols, cmask, HAS_W)[None, :]
    dw_acc = to_acc(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IS_FP64)
    db_acc = to_acc(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IS_FP64)
    seed0, mbase, period, jump = bwd_load_rng(SEED, DROPOUT, MAPPED)
    num_tiles = tl.cdiv(M, BLOCK_M)
    for tile in range(pid, num_tiles, tl.num_programs(1)):
        rows, row_mask, offs, mask = bwd_tile_rows(tile, 0, cols, cmask, M, N, BLOCK_M)
        seed, rng = bwd_tile_rng(seed0, tile, threshold, rows, N, mbase, period, jump, MAPPED)
        s = to_acc(tl.load(S + offs + col0, mask=mask, other=0.0), IS_FP64)
        g = to_acc(tl.load(DY + offs + col0, mask=mask, other=0.0), IS_FP64)
        if RMS:
            mean = tl.zeros([BLOCK_M], dtype=s.dtype)
        else:
            mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
        c1 = tl.load(C1 + rows, mask=row_mask, other=0.0)
        c2 = tl.load(C2 + rows, mask=row_mask, other=0.0)
        xhat, dxhat = _xhat_dxhat(s, g, mean, rstd, w, HAS_W, RMS)
        _grad_chunk(
            DX, DRES, GS, offs, mask, xhat, dxhat, rstd, c1, c2, seed, rng, col0, cols, threshold, scale,
            HAS_GS, HAS_R, RMS, DROPOUT, FAST_RNG, IS_FP64, BLOCK_M, BLOCK_N, RTNE_BF16,
        )  # fmt: skip
        if HAS_W:
            dw_acc += g * xhat
        if HAS_B:
            db_acc += g
    prow = pid.to(tl.int64) * N + col0
    if HAS_W:
        tl.store(PDW + prow + cols, tl.sum(dw_acc, axis=0), mask=cmask)
    if HAS_B:
        tl.store(PDB + prow + cols, tl.sum(db_acc, axis=0), mask=cmask)


# ------------------------------------------------------------------------------------------- launch plans
def _forward_args(x, residual, weight, bias, seed, out, sum_, mean, rstd, p: float, eps: float, rms: bool) -> tuple:
    """(M, N, the threshold, the forward kernels' arguments) of a launch_forward call."""
    n = int(x.shape[-1])
    t = dropout_threshold(p)
    r = residual if residual is not None else x  # never read without a residual
    w = weight if weight is not None else x
    b = bias if bias is not None else x
    mu = mean if not rms else rstd  # never written for RMSNorm
    m = x.numel() // n
    return m, n, t, (x, r, w, b, seed, out, sum_, mu, rstd, m, n, *eps_pair(eps), t)


def plan_forward(
    x, residual, weight, bias, seed, out, sum_, mean, rstd, p: float, eps: float, rms: bool, *,
    sm_count: Optional[int] = None, facts=None, limits: Optional[plans.RowLimits] = None,
) -> plans.LaunchPlan:  # fmt: skip
    """The forward's launch (launch_forward's arguments), tiled as the other row-normalization ops
    (plans.forward_config): the single-block kernel, persistent over SMs x the resident programs per SM of its
    compiled kernel, or the looped one (rows.plan_rows_forward). Knobs: sm_count (default: the device's,
    DEFAULT_SM_COUNT for meta tensors), `facts` (replaces the compiled-kernel query), limits (default
    plans.ROW_LIMITS)."""
    _, _, t, args = _forward_args(x, residual, weight, bias, seed, out, sum_, mean, rstd, p, eps, rms)
    flags = dict(
        HAS_R=residual is not None,
        HAS_W=weight is not None,
        HAS_B=bias is not None,
        RMS=bool(rms),
        DROPOUT=t != 0,
        MAPPED=seed_mapped(seed),
    )
    knobs = dict(sm_count=sm_count, facts=facts, limits=limits)
    return plans.row_forward_plan(dan_fwd_fused_kernel, dan_fwd_looped_kernel, x, args, flags, **knobs)


def _backward_kwargs(cfg: RowTiling, n: int, sum_, flags: dict, is_fp64: bool, limits: plans.RowLimits) -> tuple:
    """(cfg, the kernels' constexprs and num_warps, the row-coefficient launch of the looped path) of a tiling;
    flags: the constexprs fixed by the call (HAS_*, RMS, DROPOUT, MAPPED)."""
    kwargs = dict(
        flags,
        FAST_RNG=cfg.fast_rng,
        IS_FP64=is_fp64,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        RTNE_BF16=INTERPRETED,
        num_warps=cfg.num_warps,
    )
    if plans.is_wide_backward(cfg, n, limits):  # dan_bwd_wide_kernel
        kwargs.update(plans.wide_kwargs(cfg, sum_.dtype))
    coef_kwargs = dict(
        HAS_W=flags["HAS_W"],
        RMS=flags["RMS"],
        IS_FP64=is_fp64,
        BLOCK_N=cfg.block_n,
        num_warps=num_warps_for(cfg.block_n, 8),
    )
    # dan_bwd_row_coef_kernel(grad_out, sum_, w, mu, rstd, c1, c2, M, N): head[0, 2, 3, 4, 5]
    return cfg, kwargs, (dan_bwd_row_coef_kernel, (0, 2, 3, 4, 5), False, coef_kwargs)


def _backward_head(grad_out, grad_sum, sum_, weight, mean, rstd, seed, rms: bool) -> tuple:
    """The backward kernels' leading arguments (absent ones stand in by sum_: never read)."""
    gs = grad_sum if grad_sum is not None else sum_  # never read without grad_sum
    w = weight if weight is not None else sum_
    mu = mean if not rms else rstd  # never read for RMSNorm
    return grad_out, gs, sum_, w, mu, rstd, seed


def plan_backward(
    grad_out, grad_sum, sum_, weight, bias, mean, rstd, seed, grad_x, grad_res, grad_w, grad_b, p: float, rms: bool,
    *, sm_count: Optional[int] = None, facts=None, limits: Optional[plans.RowLimits] = None,
) -> RowsBackwardPlan:  # fmt: skip
    """The backward's launches (launch_backward's arguments; rows.plan_rows_backward), tiled as the other
    row-normalization ops (plans.backward_config, whose wide kernels hold the sum and grad_out: the wider of the
    two dtypes counts). Knobs as in plan_forward."""
    limits = plans.row_limits(limits)
    m, n, has_w, has_b, t = plans.backward_facts(sum_, weight, bias, p)
    is_fp64 = grad_out.dtype == torch.float64
    head = _backward_head(grad_out, grad_sum, sum_, weight, mean, rstd, seed, rms)
    flags = dict(
        HAS_GS=grad_sum is not None,
        HAS_R=grad_res is not None,
        HAS_W=has_w,
        HAS_B=has_b,
        RMS=bool(rms),
        DROPOUT=t != 0,
        MAPPED=seed_mapped(seed),
    )
    held = sum_.dtype if sum_.dtype.itemsize > grad_out.dtype.itemsize else grad_out.dtype
    cfg = plans.backward_config(n, grad_out.dtype, limits, held=held, sums=int(has_w) + int(has_b))
    looped = plans.wide_backward_fallback(cfg, n, grad_out.dtype, limits)
    cfg, kwargs, coef = _backward_kwargs(cfg, n, sum_, flags, is_fp64, limits)
    fused = dan_bwd_wide_kernel if plans.is_wide_backward(cfg, n, limits) else dan_bwd_fused_kernel
    outs = (grad_x, grad_res if grad_res is not None else grad_x)  # grad_res never written without a residual
    acc = acc_dtype(grad_out.dtype)
    looped_kwargs = _backward_kwargs(looped, n, sum_, flags, is_fp64, limits) if looped is not None else None
    knobs = dict(sm_count=sm_count, facts=facts, looped=looped_kwargs, holds=plans.wide_holds(cfg, n, limits))
    return plan_rows_backward(
        fused, dan_bwd_chunk_kernel, coef, cfg, m, n, sum_.device, acc, head, outs, t, has_w, has_b, kwargs, **knobs
    )


# ----------------------------------------------------------------------------------------------- launchers
def launch_forward(
    x, residual, weight, bias, seed, out, sum_, mean, rstd, p: float, eps: float, rms: bool, *,
    wrap=launch_directly, plan: Optional[plans.LaunchPlan] = None,
) -> None:  # fmt: skip
    """Runs the forward on contiguous x (M, N) (and residual) into the preallocated out, sum_, mean (LayerNorm
    only; (0,) for RMSNorm) and rstd, under x's device. `wrap` as in norm_dropout.py's launch_forward;
    `plan`: plan_forward's for these arguments; by default plan_forward's without knobs, kept per call key
    (common.planned)."""
    call = (x, residual, weight, bias, seed, out, sum_, mean, rstd, p, eps, rms)
    m, n, t, args = _forward_args(*call)
    if m == 0:
        return
    if plan is None:  # keyed by this module's kernel first, as layer_norm_dropout_relu's
        flags = (residual is None, weight is None, bias is None, t, bool(rms))
        key = plans.plan_key(dan_fwd_fused_kernel, m, n, (x, *args[1:4], out, sum_, rstd), flags, seed, x.device)
        plan = planned(m, key, lambda: plan_forward(*call))
    with device_guard(x.device):
        wrap(plan.kernel)[plan.grid](*args, **plan.kwargs)


def launch_backward(
    grad_out, grad_sum, sum_, weight, bias, mean, rstd, seed, grad_x, grad_res, grad_w, grad_b, p: float, rms: bool,
    *, wrap=launch_directly, plan: Optional[RowsBackwardPlan] = None,
) -> None:  # fmt: skip
    """Runs the backward on contiguous inputs into the uninitialised grad_x, grad_res (None without a residual)
    and, when weight / bias exist, grad_w / grad_b, under x's device: the dgamma / dbeta partials and their one
    stage-2 launch as in norm_dropout.py's launch_backward. `plan`: plan_backward's for these arguments; by
    default plan_backward's without knobs, kept per call key (common.planned)."""
    m, n, has_w, has_b, t = plans.backward_facts(sum_, weight, bias, p)
    if m == 0:
        zero_sums(grad_w, grad_b)
        return
    head = _backward_head(grad_out, grad_sum, sum_, weight, mean, rstd, seed, rms)
    outs = (grad_x, grad_res if grad_res is not None else grad_x)  # grad_res never written without a residual
    if plan is None:
        flags = (grad_sum is None, grad_res is None, has_w, has_b, t, bool(rms))
        tensors = (grad_out, head[1], sum_, head[3], rstd, *outs)
        key = plans.plan_key(dan_bwd_fused_kernel, m, n, tensors, flags, seed, sum_.device)
        call = (grad_out, grad_sum, sum_, weight, bias, mean, rstd, seed, grad_x, grad_res, grad_w, grad_b, p, rms)
        plan = planned(m, key, lambda: plan_backward(*call))
    acc = acc_dtype(grad_out.dtype)
    grads = (grad_w if has_w else None, grad_b if has_b else None)
    run_rows_backward(plan, head, outs, *grads, m, n, t, sum_.device, acc, wrap=wrap)
