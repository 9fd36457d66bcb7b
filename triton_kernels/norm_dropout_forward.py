"""Forward kernels of the row normalizations layer_norm_dropout_relu and norm_dropout: LayerNorm or RMSNorm (RMS),
then the dropout, then the ReLU (RELU). The single-block kernel holds whole rows (one chunk, or 3 or 4 chunks as a
tuple under tl.static_range); the looped kernel takes one row a program in chunks, two passes over x. The contract,
the RNG and the tiling are described in norm_dropout.py, whose launchers plan and launch these."""

from __future__ import annotations

import triton
import triton.language as tl

from .common import (
    to_acc,
    to_out,
)

# The jit helpers are called by their own names (row_*), never through an alias: Inductor re-emits a triton_op
# kernel's helpers under each helper's __name__, so an alias would be undefined there.
from .rows import (
    row_dropout_scale,
    row_eps,
    row_fused_setup,
    row_held_params,
    row_inv_n,
    row_keep_tile,
    row_load_map,
    row_load_param_tile,
    row_load_seed,
    row_map_index,
    row_merge_stats,
    row_moments,
    row_param_tiles,
    row_rsqrt,
    row_tile_rng,
    row_tile_rows,
)


# ----------------------------------------------------------------------------------------------- jit helpers
@triton.jit
def _fwd_chunk(
    y,
    w,
    b,
    drop,
    col0,
    cols,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    DROPOUT: tl.constexpr,
    FAST_RNG: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    RELU: tl.constexpr,
):
    """ldr_forward_element on a tile of normalized values y (rows from linear index base, columns col0 + cols) with
    its weight and bias columns w, b already loaded ([1, BLOCK_N] or the tile's shape): affine, then
    keep ? (y <= 0 ? 0 : y * scale) : 0 (a NaN that survives dropout stays NaN). Without RELU (norm_dropout):
    keep ? y * scale : 0, the dropped elements selected to zero before the multiply. drop: the dropout's (seed, the
    rows' first indices, threshold, scale)."""
    seed, base, threshold, scale = drop
    if HAS_W:
        y = y * w.to(y.dtype)
    if HAS_B:
        y = y + b.to(y.dtype)
    if DROPOUT:
        # dropped -> y = 0 -> out 0 (also for a NaN or inf y), kept -> relu(y) * scale: the select on fp32 before
        # the multiply, which the compiler cannot sink past the final conversion onto 16-bit halves
        keep = row_keep_tile(seed, base, col0, cols, threshold, BLOCK_M, BLOCK_N, FAST_RNG)
        y = tl.where(keep, y, 0.0)
        if RELU:
            out = tl.where(y <= 0.0, 0.0, y) * scale
        else:
            out = y * scale
    elif RELU:
        out = tl.where(y <= 0.0, 0.0, y)
    else:
        out = y
    return out


@triton.jit
def fwd_store_stats(MEAN, RSTD, rows, row_mask, mean, rstd, RMS: tl.constexpr):
    """A single-block forward's tile statistics stored: the rows' mean (LayerNorm only) and rstd."""
    if not RMS:
        tl.store(MEAN + rows, mean, mask=row_mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit
def fwd_looped_start(BLOCK_N: tl.constexpr, IS_FP64: tl.constexpr):
    """A looped forward's chunk columns and its row's running statistics at zero (mean, m2: row_merge_stats)."""
    cols = tl.arange(0, BLOCK_N)
    mean = to_acc(tl.zeros([1], dtype=tl.float32), IS_FP64)
    m2 = to_acc(tl.zeros([1], dtype=tl.float32), IS_FP64)
    return cols, mean, m2


# -------------------------------------------------------------------------------------------------- forward
@triton.jit
def nd_fwd_fused_kernel(
    X,  # (M, N) x
    W,  # (N,) weight, x's dtype or fp32; X without HAS_W, never read
    B,  # (N,) bias, x's dtype or fp32 (the weight's); X without HAS_B, never read
    SEED,  # (1,) int64 seed, or (4,) with the shard map (MAPPED); read only with DROPOUT
    OUT,  # (M, N) out, x's dtype
    MEAN,  # (M,) mean, fp32 (fp64 for fp64 x); RSTD for RMS, never written
    RSTD,  # (M,) rstd, fp32 (fp64 for fp64 x)
    M,
    N,
    eps_hi,
    eps_lo,
    threshold,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    DROPOUT: tl.constexpr,
    FAST_RNG: tl.constexpr,
    IS_FP64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CHUNKS: tl.constexpr,
    HOIST_PARAMS: tl.constexpr,
    EVEN_N: tl.constexpr,
    RTNE_BF16: tl.constexpr,
    RMS: tl.constexpr,
    RELU: tl.constexpr,
    MAPPED: tl.constexpr,
):
    """out = keep ? relu(y) * scale : 0 (no RELU: keep ? y * scale : 0), y = xhat * w + b, xhat = (x - mean) * rstd,
    rstd = 1 / sqrt(mean((x - mean)^2) + eps); RMS: xhat = x * rstd, rstd = 1 / sqrt(mean(x^2) + eps).

    Single-block forward, persistent: program p takes row tiles p, p + G, ... of BLOCK_M whole rows. A row is
    one chunk of BLOCK_N >= N columns, or CHUNKS = 3 or 4 chunks of BLOCK_N = N / CHUNKS (no padded lanes at
    N = 3 x 2^k; a chunk as wide as one warp's vectors at N = 4 x 2^k, so that the rows lie along the warps and
    each thread holds more of a row). The dropout scale, 1/N and eps are computed once per program; with
    HOIST_PARAMS the weight and bias are loaded (and converted to the accumulation dtype) once per program too,
    otherwise once per tile. RMS: RMSNorm (the mean square of x, no centring; MEAN is not written); RELU: the ReLU
    after the dropout (layer_norm_dropout_relu: RMS=False, RELU=True)."""
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
        # every load of the tile before its first reduction
        xs = ()
        for c in tl.static_range(CHUNKS):
            xs = xs + (to_acc(tl.load(X + offs + c * BLOCK_N, mask=mask, other=0.0), IS_FP64),)
        mean, ds, rstd = row_moments(xs, mask, inv_n, eps, RMS, EVEN_N, IS_FP64, CHUNKS)
        if not HOIST_PARAMS:
            ws, bs = row_param_tiles(W, B, cols, cmask, HAS_W, HAS_B, CHUNKS, BLOCK_M, BLOCK_N)
        fwd_store_stats(MEAN, RSTD, rows, row_mask, mean, rstd, RMS)
        for c in tl.static_range(CHUNKS):
            drop = (seed, rng, threshold, scale)
            out = _fwd_chunk(
                ds[c] * rstd[:, None],
                ws[c],
                bs[c],
                drop,
                c * BLOCK_N,
                cols,
                HAS_W,
                HAS_B,
                DROPOUT,
                FAST_RNG,
                BLOCK_M,
                BLOCK_N,
                RELU,
            )
            tl.store(OUT + offs + c * BLOCK_N, to_out(out, OUT, RTNE_BF16), mask=mask)


@triton.jit
def nd_fwd_looped_kernel(
    X,  # (M, N) x, read twice (statistics, then the output)
    W,  # (N,) weight, x's dtype or fp32; X without HAS_W, never read
    B,  # (N,) bias, x's dtype or fp32 (the weight's); X without HAS_B, never read
    SEED,  # (1,) int64 seed, or (4,) with the shard map (MAPPED); read only with DROPOUT
    OUT,  # (M, N) out, x's dtype, written in pass 2
    MEAN,  # (M,) mean, fp32 (fp64 for fp64 x); RSTD for RMS, never written
    RSTD,  # (M,) rstd, fp32 (fp64 for fp64 x)
    M,
    N,
    eps_hi,
    eps_lo,
    threshold,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    DROPOUT: tl.constexpr,
    FAST_RNG: tl.constexpr,
    IS_FP64: tl.constexpr,
    BLOCK_N: tl.constexpr,
    RTNE_BF16: tl.constexpr,
    RMS: tl.constexpr,
    RELU: tl.constexpr,
    MAPPED: tl.constexpr,
):
    """out = keep ? relu(y) * scale : 0 (no RELU: keep ? y * scale : 0), y = xhat * w + b, xhat = (x - mean) * rstd,
    rstd = 1 / sqrt(mean((x - mean)^2) + eps); RMS: xhat = x * rstd, rstd = 1 / sqrt(mean(x^2) + eps).

    Looped forward for long rows: one row per program, BLOCK_N-column chunks, two passes over x. Pass 1 merges
    the chunks' statistics (Chan's formula for LayerNorm, the running sum of squares for RMSNorm)."""
    scale = row_dropout_scale(threshold, IS_FP64)
    seed = row_load_seed(SEED, DROPOUT)
    mbase, period, jump = row_load_map(SEED, DROPOUT, MAPPED)
    row = tl.program_id(0).to(tl.int64)
    rows = row + tl.arange(0, 1).to(tl.int64)  # [1]: the tile helpers work on [rows, cols]
    base = rows * N
    rng = row_map_index(base, mbase, period, jump, MAPPED)  # each row's first dropout index
    cols, mean, m2 = fwd_looped_start(BLOCK_N, IS_FP64)
    for col0 in range(0, N, BLOCK_N):
        cmask = (col0 + cols) < N
        x = to_acc(tl.load(X + base[:, None] + col0 + cols[None, :], mask=cmask[None, :], other=0.0), IS_FP64)
        mean, m2 = row_merge_stats(mean, m2, x, cmask[None, :], col0, N, BLOCK_N, RMS, IS_FP64)
    var = m2 * row_inv_n(N, IS_FP64)
    rstd = row_rsqrt(var + row_eps(eps_hi, eps_lo, IS_FP64), IS_FP64)
    if not RMS:
        tl.store(MEAN + rows, mean)
    tl.store(RSTD + rows, rstd)
    for col0 in range(0, N, BLOCK_N):
        cmask = (col0 + cols) < N
        offs = base[:, None] + col0 + cols[None, :]
        x = to_acc(tl.load(X + offs, mask=cmask[None, :], other=0.0), IS_FP64)
        w = row_load_param_tile(W, col0, cols, cmask, HAS_W, 1)
        b = row_load_param_tile(B, col0, cols, cmask, HAS_B, 1)
        if RMS:
            xhat = x * rstd[:, None]
        else:
            xhat = (x - mean[:, None]) * rstd[:, None]
        drop = (seed, rng, threshold, scale)
        out = _fwd_chunk(xhat, w, b, drop, col0, cols, HAS_W, HAS_B, DROPOUT, FAST_RNG, 1, BLOCK_N, RELU)
        tl.store(OUT + offs, to_out(out, OUT, RTNE_BF16), mask=cmask[None, :])
