"""Backward kernels of the row normalizations layer_norm_dropout_relu and norm_dropout: the single-block kernel
(row chunks as tuples under tl.static_range), the wide kernel of the longest rows (12288, 16384 columns) that holds
the raw row, and the looped pair (row coefficients, then a column-chunk x row-group grid). Each writes dx and the
dgamma / dbeta partial rows that common.sum_partials_kernel reduces. The contract, the RNG and the tiling are
described in norm_dropout.py, whose launchers plan and launch these."""

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
    row_chunks_dot,
    row_chunks_sum,
    row_dropout_scale,
    row_held_chunk,
    row_hold,
    row_inv_n,
    row_keep_tile,
    row_load_chunk_param,
    row_load_map,
    row_load_param,
    row_load_param_tile,
    row_load_raw_chunks,
    row_load_seed,
    row_load_stats,
    row_map_index,
    row_param_tiles,
    row_raw_chunk,
    row_thread_sums,
    row_tile_offsets,
    row_tile_seed,
    row_zero_chunks,
)


# ------------------------------------------------------------------------------------------------- backward
@triton.jit
def _bwd_chunk(
    x,
    g,
    mean,
    rstd,
    w,
    b,
    drop,
    col0,
    mask,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    DROPOUT: tl.constexpr,
    FAST_RNG: tl.constexpr,
    RMS: tl.constexpr,
    RELU: tl.constexpr,
):
    """From a [BLOCK_M, BLOCK_N] tile's (mask's shape; columns col0 + arange(BLOCK_N)) loaded x and grad_out
    (accumulation dtype) and its rows' mean (unused for RMS) and rstd: xhat, the keep and ReLU bits, and returns
    (xhat, dy, dxhat), each computed once, where dy is the gradient with respect to the pre-dropout y
    (ldr_backward_element; without RELU keep ? g * scale : 0) and dxhat = dy * w (w, b: [1, BLOCK_N] or the tile's
    shape). drop: the dropout's (seed, the rows' first indices, threshold, scale)."""
    seed, base, threshold, scale = drop
    BLOCK_M: tl.constexpr = mask.shape[0]
    BLOCK_N: tl.constexpr = mask.shape[1]
    cols = tl.arange(0, BLOCK_N)
    if RMS:
        xhat = x * rstd[:, None]
    else:
        xhat = (x - mean[:, None]) * rstd[:, None]
    if HAS_W:
        wa = w.to(xhat.dtype)
    if RELU:  # the ReLU bit from y recomputed
        y = xhat
        if HAS_W:
            y = y * wa
        if HAS_B:
            y = y + b.to(xhat.dtype)
        pass_grad = y > 0.0
        if DROPOUT:
            keep = row_keep_tile(seed, base, col0, cols, threshold, BLOCK_M, BLOCK_N, FAST_RNG)
            pass_grad = pass_grad & keep
        dy = tl.where(pass_grad, g * scale, 0.0)
    elif DROPOUT:
        keep = row_keep_tile(seed, base, col0, cols, threshold, BLOCK_M, BLOCK_N, FAST_RNG)
        dy = tl.where(keep, g * scale, 0.0)
    else:
        dy = g * scale  # scale = 1
    dy = tl.where(mask, dy, 0.0)
    if HAS_W:
        dxhat = dy * wa
    else:
        dxhat = dy
    return xhat, dy, dxhat


@triton.jit
def _bwd_chunks(
    xs,
    gs,
    mean,
    rstd,
    ws,
    bs,
    drop,
    mask,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    DROPOUT: tl.constexpr,
    FAST_RNG: tl.constexpr,
    CHUNKS: tl.constexpr,
    RMS: tl.constexpr,
    RELU: tl.constexpr,
):
    """_bwd_chunk of every chunk of a tile (tuples xs, gs, ws, bs; chunk c at columns c * BLOCK_N + arange(BLOCK_N),
    BLOCK_N mask's width): tuples (xhats, dys, dxhats)."""
    xhats = ()
    dys = ()
    dxhats = ()
    for c in tl.static_range(CHUNKS):
        col0 = c * mask.shape[1]
        xhat, dy, dxhat = _bwd_chunk(
            xs[c], gs[c], mean, rstd, ws[c], bs[c], drop, col0, mask, HAS_W, HAS_B, DROPOUT, FAST_RNG, RMS, RELU
        )
        xhats = xhats + (xhat,)
        dys = dys + (dy,)
        dxhats = dxhats + (dxhat,)
    return xhats, dys, dxhats


@triton.jit
def bwd_load_rng(SEED, DROPOUT: tl.constexpr, MAPPED: tl.constexpr):
    """A backward program's dropout state, read once: the seed (row_load_seed) and its shard map (row_load_map).
    Loaded values: never part of a store's offsets (Inductor's TTIR analysis would take SEED for a written
    pointer), so the set-up helpers below, whose offsets the kernels store through, take none of them."""
    seed0 = row_load_seed(SEED, DROPOUT)
    mbase, period, jump = row_load_map(SEED, DROPOUT, MAPPED)
    return seed0, mbase, period, jump


@triton.jit
def bwd_fused_setup(
    N, threshold, IS_FP64: tl.constexpr, CHUNKS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """A single-block backward's per-program set-up, from the launch's values only: the dropout scale, 1/N, the
    program id, a chunk's columns and their mask, and the dgamma / dbeta accumulators (bwd_acc_tiles)."""
    scale = row_dropout_scale(threshold, IS_FP64)
    inv_n = row_inv_n(N, IS_FP64)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    acc = bwd_acc_tiles(CHUNKS, BLOCK_M, BLOCK_N, IS_FP64)  # dgamma and dbeta tiles of each chunk
    return scale, inv_n, pid, cols, cmask, acc


@triton.jit
def bwd_chunk_setup(N, threshold, IS_FP64: tl.constexpr, BLOCK_N: tl.constexpr):
    """A looped backward's chunk kernel's per-program set-up (grid: column chunks x row groups), from the launch's
    values only: the dropout scale, the chunk's first column, the row group, the columns and their mask."""
    scale = row_dropout_scale(threshold, IS_FP64)
    col0 = tl.program_id(0) * BLOCK_N
    pid = tl.program_id(1)
    cols = tl.arange(0, BLOCK_N)
    cmask = (col0 + cols) < N
    return scale, col0, pid, cols, cmask


@triton.jit
def bwd_tile_rows(tile, col0, cols, cmask, M, N, BLOCK_M: tl.constexpr):
    """Row tile `tile` of a persistent backward: its rows (int64; < M < 2**31, no int32 overflow), the rows' mask,
    and the offsets and mask of its columns col0 + cols (row_tile_offsets). From the launch's sizes only: the
    kernels store through these offsets."""
    rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_mask = rows < M
    offs, mask = row_tile_offsets(rows, row_mask, col0, cols, cmask, N)
    return rows, row_mask, offs, mask


@triton.jit
def bwd_tile_rng(seed0, tile, threshold, rows, N, mbase, period, jump, MAPPED: tl.constexpr):
    """The seed of a persistent backward's tile (row_tile_seed) and each row's first dropout index."""
    seed = row_tile_seed(seed0, tile, threshold)
    rng = row_map_index(rows * N, mbase, period, jump, MAPPED)
    return seed, rng


@triton.jit
def bwd_wide_setup(N, threshold, CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr):
    """A wide backward's per-program set-up (never fp64), from the launch's values only: the dropout scale, 1/N,
    the program id, a chunk's columns and the dgamma / dbeta accumulators of every chunk (row_zero_chunks)."""
    scale = row_dropout_scale(threshold, False)
    inv_n = row_inv_n(N, False)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    dw = row_zero_chunks(CHUNKS, BLOCK_N)
    db = row_zero_chunks(CHUNKS, BLOCK_N)
    return scale, inv_n, pid, cols, dw, db


@triton.jit
def bwd_wide_row(row, N, cols):
    """Row `row` of a wide backward as a [1] int64 tile (row * N may pass 2**31), its [1, BLOCK_N] offsets of
    chunk 0 and its linear index. From the launch's sizes only: the kernels store through these offsets."""
    rows = row + tl.zeros([1], dtype=tl.int64)
    offs = rows[:, None] * N + cols[None, :]
    base = rows * N
    return rows, offs, base


@triton.jit
def bwd_wide_row_state(
    MEAN, RSTD, rows, base, seed0, row, threshold, mbase, period, jump, RMS: tl.constexpr, MAPPED: tl.constexpr
):
    """A wide backward's row state: its seed (row_tile_seed), its first dropout index and its statistics
    (row_load_stats: mean, unused for RMSNorm, and rstd)."""
    seed = row_tile_seed(seed0, row, threshold)
    rng = row_map_index(base, mbase, period, jump, MAPPED)  # each row's first dropout index
    mean, rstd = row_load_stats(MEAN, RSTD, rows, RMS)
    return seed, rng, mean, rstd


@triton.jit
def bwd_coef_start(MEAN, RSTD, rows, row_mask, RMS: tl.constexpr, IS_FP64: tl.constexpr, BLOCK_N: tl.constexpr):
    """A looped backward's row coefficient kernel's start (rows: its [1] row): the row's mean (zeros, unused, for
    RMSNorm: MEAN is not read) and rstd, a chunk's columns, and the two row sums at zero."""
    if RMS:
        mean = to_acc(tl.zeros([1], dtype=tl.float32), IS_FP64)  # unused
    else:
        mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)
    rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
    cols = tl.arange(0, BLOCK_N)
    s1 = to_acc(tl.zeros([1], dtype=tl.float32), IS_FP64)
    s2 = to_acc(tl.zeros([1], dtype=tl.float32), IS_FP64)
    return mean, rstd, cols, s1, s2


@triton.jit
def bwd_chunk_tile(rows, row_mask, col0, cols, N):
    """The mask of the columns col0 + cols of a looped kernel's row and the chunk's offsets and mask
    (row_tile_offsets)."""
    cmask = (col0 + cols) < N
    offs, mask = row_tile_offsets(rows, row_mask, col0, cols, cmask, N)
    return cmask, offs, mask


@triton.jit
def bwd_acc_tiles(CHUNKS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_FP64: tl.constexpr):
    """A backward's dgamma / dbeta accumulators: a tuple of 2 x CHUNKS zero tiles [BLOCK_M, BLOCK_N] in the
    accumulation dtype, each chunk's dgamma tile then its dbeta tile (the order of the persistent loop's carried
    values, which the compiled kernels were measured with), added to element-wise per tile and reduced over the
    rows once at the end (bwd_store_partials)."""
    z = ()
    for _ in tl.static_range(2 * CHUNKS):
        z = z + (to_acc(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IS_FP64),)
    return z


@triton.jit
def bwd_load_tiles(A, B, offs, mask, CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr, IS_FP64: tl.constexpr):
    """Tuples of the CHUNKS chunks of a tile of A and of B (offs, mask: chunk 0's), in the accumulation dtype,
    loaded chunk by chunk, A then B: every load of a tile issued before its reductions."""
    a = ()
    b = ()
    for c in tl.static_range(CHUNKS):
        a = a + (to_acc(tl.load(A + offs + c * BLOCK_N, mask=mask, other=0.0), IS_FP64),)
        b = b + (to_acc(tl.load(B + offs + c * BLOCK_N, mask=mask, other=0.0), IS_FP64),)
    return a, b


@triton.jit
def bwd_tile_stats(MEAN, RSTD, rows, row_mask, like, RMS: tl.constexpr):
    """A tile's row statistics: mean (zeros of like's dtype, unused, for RMSNorm: MEAN is not read) and rstd."""
    if RMS:
        mean = tl.zeros(rows.shape, dtype=like.dtype)
    else:
        mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)
    return mean, tl.load(RSTD + rows, mask=row_mask, other=0.0)


@triton.jit
def bwd_tile_coefs(C1, C2, rows, row_mask, RMS: tl.constexpr):
    """A tile's row coefficients c1, c2 from the looped backward's first kernel (RMS: C2 is not read; c1 stands in
    for the unused c2)."""
    c1 = tl.load(C1 + rows, mask=row_mask, other=0.0)
    if RMS:
        c2 = c1
    else:
        c2 = tl.load(C2 + rows, mask=row_mask, other=0.0)
    return c1, c2


@triton.jit
def bwd_dx(dxhat, xhat, rstd, c1, c2, RMS: tl.constexpr):
    """rstd * (dxhat - xhat * c1 - c2) of a chunk, from its rows' rstd and coefficients (RMS: no c2 term)."""
    if RMS:
        dx = rstd[:, None] * (dxhat - xhat * c1[:, None])
    else:
        dx = rstd[:, None] * (dxhat - xhat * c1[:, None] - c2[:, None])
    return dx


@triton.jit
def bwd_row_coefs(dxhats, xhats, inv_n, CHUNKS: tl.constexpr, RMS: tl.constexpr):
    """c1 = mean(dxhat * xhat) and c2 = mean(dxhat) of a tile's rows from its chunks (tuples), the chunks added
    element-wise first: one cross-thread reduction per coefficient. RMS: c2 is not needed (c1 stands in)."""
    c1 = tl.sum(row_chunks_dot(dxhats, xhats, CHUNKS), axis=1)
    if RMS:
        c1 = c1 * inv_n
        c2 = c1
    else:
        c2 = tl.sum(row_chunks_sum(dxhats, CHUNKS), axis=1)
        c1 = c1 * inv_n
        c2 = c2 * inv_n
    return c1, c2


@triton.jit
def bwd_accumulate(
    acc, dys, xhats, HAS_W: tl.constexpr, HAS_B: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr, CHUNKS: tl.constexpr
):
    """The accumulators of bwd_acc_tiles with one more tile's chunks LO to HI - 1 added: dgamma + dy * xhat of
    each, then dbeta + dy of each. The fused backwards add chunk 0's right after its dx and the others' after all
    of the tile's dx: the order of operations the compiled kernels were measured with."""
    dws = ()
    dbs = ()
    for c in tl.static_range(LO, HI):
        if HAS_W:
            dws = dws + (acc[2 * c] + dys[c] * xhats[c],)
        else:
            dws = dws + (acc[2 * c],)
    for c in tl.static_range(LO, HI):
        if HAS_B:
            dbs = dbs + (acc[2 * c + 1] + dys[c],)
        else:
            dbs = dbs + (acc[2 * c + 1],)
    new = ()
    for c in tl.static_range(CHUNKS):
        if c >= LO and c < HI:
            new = new + (dws[c - LO], dbs[c - LO])
        else:
            new = new + (acc[2 * c], acc[2 * c + 1])
    return new


@triton.jit
def bwd_store_partials(
    PDW,
    PDB,
    prow,
    cols,
    cmask,
    acc,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    CHUNKS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The program's dgamma / dbeta partial row at prow: each accumulator tile of bwd_acc_tiles reduced over its
    rows, the dgamma chunks then the dbeta chunks."""
    if HAS_W:
        for c in tl.static_range(CHUNKS):
            tl.store(PDW + prow + c * BLOCK_N + cols, tl.sum(acc[2 * c], axis=0), mask=cmask)
    if HAS_B:
        for c in tl.static_range(CHUNKS):
            tl.store(PDB + prow + c * BLOCK_N + cols, tl.sum(acc[2 * c + 1], axis=0), mask=cmask)


@triton.jit
def _bwd_outputs(
    DX,
    offs,
    mask,
    acc,
    xhats,
    dys,
    dxhats,
    rstd,
    c1,
    c2,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    CHUNKS: tl.constexpr,
    RMS: tl.constexpr,
    RTNE_BF16: tl.constexpr,
):
    """dx of every chunk of a tile (tuples; offs, mask: chunk 0's) stored, and the accumulators of bwd_acc_tiles
    returned with the tile added: chunk 0's right after its dx, the others' after all of the tile's dx
    (bwd_accumulate)."""
    for c in tl.static_range(CHUNKS):
        dx = bwd_dx(dxhats[c], xhats[c], rstd, c1, c2, RMS)
        tl.store(DX + offs + c * mask.shape[1], to_out(dx, DX, RTNE_BF16), mask=mask)
        if c == 0:
            acc = bwd_accumulate(acc, dys, xhats, HAS_W, HAS_B, 0, 1, CHUNKS)
    return bwd_accumulate(acc, dys, xhats, HAS_W, HAS_B, 1, CHUNKS, CHUNKS)


@triton.jit
def nd_bwd_fused_kernel(
    DY,  # (M, N) grad_out, x's dtype
    X,  # (M, N) x
    W,  # (N,) weight, x's dtype or fp32; X without HAS_W, never read
    B,  # (N,) bias, x's dtype or fp32 (the weight's), read for the ReLU bit (RELU); X without HAS_B, never read
    MEAN,  # (M,) mean, fp32 (fp64 for fp64 x); RSTD for RMS, never read
    RSTD,  # (M,) rstd, fp32 (fp64 for fp64 x)
    SEED,  # (1,) int64 seed, or (4,) with the shard map (MAPPED); read only with DROPOUT
    DX,  # (M, N) grad_x, x's dtype
    PDW,  # (G, N) dgamma partial rows, fp32 (fp64 for fp64 x), G the grid's programs; not written without HAS_W
    PDB,  # (G, N) dbeta partial rows, the set after PDW's (PDW's where there is no weight); written with HAS_B
    M,
    N,
    threshold,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    DROPOUT: tl.constexpr,
    FAST_RNG: tl.constexpr,
    IS_FP64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CHUNKS: tl.constexpr,
    RTNE_BF16: tl.constexpr,
    RMS: tl.constexpr,
    RELU: tl.constexpr,
    MAPPED: tl.constexpr,
):
    """dx = rstd * (dxhat - xhat * c1 - c2), c1 = mean(dxhat * xhat), c2 = mean(dxhat) (RMS: no c2 term), dxhat =
    dy' * w, dy' = keep & (y > 0) ? dy * scale : 0 (no RELU: keep ? dy * scale : 0), xhat = (x - mean) * rstd (RMS:
    x * rstd), the ReLU bit from y = xhat * w + b recomputed, the keep bits drawn again; PDW[g] = sum(dy' * xhat),
    PDB[g] = sum(dy') over program g's rows.

    Single-block backward, persistent: program p takes row tiles p, p + G, ...; a row is 1 chunk of BLOCK_N >= N
    columns or 3 chunks of N / 3 (tuples under tl.static_range), as the forward. A tile's loads (x, grad_out, mean,
    rstd, weight and bias of every chunk) all come before its reductions; xhat, dy and dxhat are computed once;
    dgamma/dbeta accumulate in [BLOCK_M, BLOCK_N] register tiles per chunk, reduced over the rows once at the end
    into the program's partial row. RMS: RMSNorm (MEAN is not read, no c2 term); RELU: the ReLU after the dropout."""
    scale, inv_n, pid, cols, cmask, acc = bwd_fused_setup(N, threshold, IS_FP64, CHUNKS, BLOCK_M, BLOCK_N)
    seed0, mbase, period, jump = bwd_load_rng(SEED, DROPOUT, MAPPED)
    for tile in range(pid, tl.cdiv(M, BLOCK_M), tl.num_programs(0)):
        rows, row_mask, offs, mask = bwd_tile_rows(tile, 0, cols, cmask, M, N, BLOCK_M)
        seed, rng = bwd_tile_rng(seed0, tile, threshold, rows, N, mbase, period, jump, MAPPED)
        xs, gs = bwd_load_tiles(X, DY, offs, mask, CHUNKS, BLOCK_N, IS_FP64)
        mean, rstd = bwd_tile_stats(MEAN, RSTD, rows, row_mask, xs[0], RMS)
        # weight and bias per tile (L1 hits): held across the loop, ~10-20 more registers (half the programs at 4096)
        ws, bs = row_param_tiles(W, B, cols, cmask, HAS_W, HAS_B, CHUNKS, BLOCK_M, BLOCK_N)
        drop = (seed, rng, threshold, scale)
        xhats, dys, dxhats = _bwd_chunks(
            xs, gs, mean, rstd, ws, bs, drop, mask, HAS_W, HAS_B, DROPOUT, FAST_RNG, CHUNKS, RMS, RELU
        )
        c1, c2 = bwd_row_coefs(dxhats, xhats, inv_n, CHUNKS, RMS)
        acc = _bwd_outputs(DX, offs, mask, acc, xhats, dys, dxhats, rstd, c1, c2, HAS_W, HAS_B, CHUNKS, RMS, RTNE_BF16)
    bwd_store_partials(PDW, PDB, pid.to(tl.int64) * N, cols, cmask, acc, HAS_W, HAS_B, CHUNKS, BLOCK_N)


@triton.jit
def _wide_bwd_pass1(
    X, DY, W, B, offs, mean, rstd, seed, base, cols, threshold,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, DROPOUT: tl.constexpr, FAST_RNG: tl.constexpr, CHUNKS: tl.constexpr,
    BLOCK_N: tl.constexpr, VEC: tl.constexpr, RMS: tl.constexpr, RELU: tl.constexpr, OPAQUE: tl.constexpr,
    HOLD: tl.constexpr,
):  # fmt: skip
    """The wide backward's first pass over one row (offs: chunk 0's [1, BLOCK_N] offsets), chunk by chunk: the raw
    x and grad_out (every chunk loaded first where the whole row is held, HOLD == CHUNKS; else where the pass
    reaches it), the keep and ReLU bits, which select grad_out in its own dtype (gm: exact, a select), and the row
    sums' per-thread parts (row_thread_sums) of gm * w * xhat and gm * w, without the dropout scale (applied to the
    row coefficients). Returns the tuples xs (the last HOLD chunks of the raw x) and gs (every chunk's gm), both
    held two to a register for 16-bit data (row_hold), and the two sums."""
    UPFRONT: tl.constexpr = HOLD == CHUNKS
    xr, gr = row_load_raw_chunks(X, DY, offs, CHUNKS, BLOCK_N, UPFRONT)
    xs = ()
    gs = ()
    s1 = tl.zeros([BLOCK_N // VEC], dtype=tl.float32)
    s2 = tl.zeros([BLOCK_N // VEC], dtype=tl.float32)
    for c in tl.static_range(CHUNKS):
        col0 = c * BLOCK_N
        x_c = row_raw_chunk(X, offs, xr, c, BLOCK_N, UPFRONT)
        g_c = row_raw_chunk(DY, offs, gr, c, BLOCK_N, UPFRONT)
        if RMS:
            xhat = x_c.to(tl.float32) * rstd[:, None]
        else:
            xhat = (x_c.to(tl.float32) - mean[:, None]) * rstd[:, None]
        w = row_load_chunk_param(W, col0, cols, HAS_W, "").to(tl.float32)
        if RELU:  # the ReLU bit from y recomputed
            y = xhat
            if HAS_W:
                y = y * w
            if HAS_B:
                y = y + row_load_chunk_param(B, col0, cols, HAS_B, "").to(tl.float32)
            pass_grad = y > 0.0
            if DROPOUT:
                pass_grad = pass_grad & row_keep_tile(seed, base, col0, cols, threshold, 1, BLOCK_N, FAST_RNG)
            gm = tl.where(pass_grad, g_c, tl.zeros_like(g_c))
        elif DROPOUT:
            gm = tl.where(
                row_keep_tile(seed, base, col0, cols, threshold, 1, BLOCK_N, FAST_RNG), g_c, tl.zeros_like(g_c)
            )
        else:
            gm = g_c
        gw = gm.to(tl.float32)
        if HAS_W:
            gw = gw * w
        t1 = row_thread_sums(gw * xhat, BLOCK_N, VEC)
        t2 = row_thread_sums(gw, BLOCK_N, VEC)
        if c >= CHUNKS - HOLD:
            xs = xs + (row_hold(x_c, OPAQUE),)
        gs = gs + (row_hold(gm, OPAQUE),)
        s1 += t1
        s2 += t2
    return xs, gs, s1, s2


@triton.jit
def _wide_bwd_pass2(
    X,
    W,
    DX,
    offs,
    xs,
    gs,
    mean,
    rstd,
    s1,
    s2,
    scale,
    inv_n,
    dw,
    db,
    HAS_W: tl.constexpr,
    CHUNKS: tl.constexpr,
    HOLD: tl.constexpr,
    RMS: tl.constexpr,
    RTNE_BF16: tl.constexpr,
):
    """The wide backward's second pass over one row (offs: chunk 0's [1, BLOCK_N] offsets), after one reduction
    per row coefficient of pass 1's sums s1, s2: x (held, or read again: row_held_chunk) and gm converted again,
    the weight reloaded (L1 hits; a cache modifier of its own, so that the compiler does not merge it with pass 1's
    load and hold the weight across the reductions), dx stored, and the dgamma / dbeta accumulators dw, db
    (tuples) returned with the row added, without the dropout scale (applied to the program's partial row)."""
    BLOCK_N: tl.constexpr = offs.shape[1]
    cols = tl.arange(0, BLOCK_N)
    # dx = rstd * (dxhat - xhat * c1 - c2) with dxhat = scale * gm * w: k1 = rstd * scale, k2 = rstd * c1,
    # k3 = rstd * c2, each c the row's sum x scale / N
    k1 = rstd * scale
    k2 = rstd * (tl.sum(s1, axis=0) * scale * inv_n)
    if not RMS:
        k3 = rstd * (tl.sum(s2, axis=0) * scale * inv_n)
    ndw = ()
    ndb = ()
    for c in tl.static_range(CHUNKS):
        x_c = row_held_chunk(X, offs, xs, c, CHUNKS, HOLD, BLOCK_N)
        if RMS:
            xhat = x_c.to(tl.float32) * rstd[:, None]
        else:
            xhat = (x_c.to(tl.float32) - mean[:, None]) * rstd[:, None]
        g = gs[c].to(tl.float32)
        gw = g
        if HAS_W:  # its own cache modifier: not merged with pass 1's load
            gw = g * row_load_chunk_param(W, c * BLOCK_N, cols, HAS_W, ".ca").to(tl.float32)
        if RMS:
            dx = gw * k1[:, None] - xhat * k2[:, None]
        else:
            dx = gw * k1[:, None] - (xhat * k2[:, None] + k3[:, None])
        tl.store(DX + offs + c * BLOCK_N, to_out(dx, DX, RTNE_BF16))
        ndw = ndw + (dw[c] + g * xhat,)
        ndb = ndb + (db[c] + g,)
    return ndw, ndb


@triton.jit
def nd_bwd_wide_kernel(
    DY,  # (M, N) grad_out, x's dtype
    X,  # (M, N) x, 16-bit or fp32 (never fp64 here)
    W,  # (N,) weight, x's dtype or fp32; X without HAS_W, never read
    B,  # (N,) bias, x's dtype or fp32 (the weight's), read for the ReLU bit (RELU); X without HAS_B, never read
    MEAN,  # (M,) mean, fp32; RSTD for RMS, never read
    RSTD,  # (M,) rstd, fp32
    SEED,  # (1,) int64 seed, or (4,) with the shard map (MAPPED); read only with DROPOUT
    DX,  # (M, N) grad_x, x's dtype
    PDW,  # (G, N) fp32 dgamma partial rows, G the grid's programs; not written without HAS_W
    PDB,  # (G, N) fp32 dbeta partial rows, the set after PDW's (PDW's where there is no weight); written with HAS_B
    M,
    N,
    threshold,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    DROPOUT: tl.constexpr,
    FAST_RNG: tl.constexpr,
    IS_FP64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CHUNKS: tl.constexpr,
    RTNE_BF16: tl.constexpr,
    RMS: tl.constexpr,
    RELU: tl.constexpr,
    VEC: tl.constexpr,
    OPAQUE: tl.constexpr,
    HOLD: tl.constexpr,
    MAPPED: tl.constexpr,
):
    """nd_bwd_fused_kernel's dx and partials with the dropout scale factored out: gm = keep & (y > 0) ? dy : 0 in
    dy's dtype (no RELU: keep ? dy : 0), c1 = scale * mean(gm * w * xhat), c2 = scale * mean(gm * w) (not for RMS);
    dx = rstd * (scale * gm * w - xhat * c1 - c2); PDW[g] = scale * sum(gm * xhat), PDB[g] = scale * sum(gm).

    Single-block backward of the widest rows (N = CHUNKS x BLOCK_N, 12288 and 16384; not fp64), persistent, one
    row a tile, in two passes over the row's chunks (_wide_bwd_pass1: the keep and ReLU bits and the row sums'
    per-thread parts; one reduction per coefficient; _wide_bwd_pass2: dx and dgamma / dbeta). Live across the row
    sums: the raw row (1 register an element for 16-bit data) and the accumulators (1 or 2), where the fused
    kernel holds xhat, dy and dxhat in fp32. VEC: the elements a thread holds side by side. HOLD: the chunks of x
    held (the last HOLD); below CHUNKS, pass 2 reads the others again (row_held_chunk) and pass 1 loads chunk by
    chunk, for the registers that the held row and all of a row's loads in flight would take."""
    scale, inv_n, pid, cols, dw, db = bwd_wide_setup(N, threshold, CHUNKS, BLOCK_N)
    seed0, mbase, period, jump = bwd_load_rng(SEED, DROPOUT, MAPPED)
    for row in range(pid, M, tl.num_programs(0)):
        rows, offs, base = bwd_wide_row(row, N, cols)
        seed, rng, mean, rstd = bwd_wide_row_state(
            MEAN, RSTD, rows, base, seed0, row, threshold, mbase, period, jump, RMS, MAPPED
        )
        xs, gs, s1, s2 = _wide_bwd_pass1(
            X, DY, W, B, offs, mean, rstd, seed, rng, cols, threshold,
            HAS_W, HAS_B, DROPOUT, FAST_RNG, CHUNKS, BLOCK_N, VEC, RMS, RELU, OPAQUE, HOLD,
        )  # fmt: skip
        dw, db = _wide_bwd_pass2(
            X, W, DX, offs, xs, gs, mean, rstd, s1, s2, scale, inv_n, dw, db, HAS_W, CHUNKS, HOLD, RMS, RTNE_BF16
        )
    prow = pid.to(tl.int64) * N
    for c in tl.static_range(CHUNKS):
        if HAS_W:
            tl.store(PDW + prow + c * BLOCK_N + cols, tl.sum(dw[c], axis=0) * scale)
        if HAS_B:
            tl.store(PDB + prow + c * BLOCK_N + cols, tl.sum(db[c], axis=0) * scale)


@triton.jit
def nd_bwd_row_coef_kernel(
    DY,  # (M, N) grad_out, x's dtype
    X,  # (M, N) x
    W,  # (N,) weight, x's dtype or fp32; X without HAS_W, never read
    B,  # (N,) bias, x's dtype or fp32 (the weight's), read for the ReLU bit (RELU); X without HAS_B, never read
    MEAN,  # (M,) mean, fp32 (fp64 for fp64 x); RSTD for RMS, never read
    RSTD,  # (M,) rstd, fp32 (fp64 for fp64 x)
    SEED,  # (1,) int64 seed, or (4,) with the shard map (MAPPED); read only with DROPOUT
    C1,  # (M,) c1 of each row, fp32 (fp64 for fp64 x)
    C2,  # (M,) c2 of each row, fp32 (fp64 for fp64 x); not written for RMS
    M,
    N,
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
    """Looped backward, kernel A: c1 = mean(dxhat * xhat), c2 = mean(dxhat) of one row per program (RMS: c1 only,
    C2 is not written), dxhat = dy' * w and xhat as in nd_bwd_fused_kernel (the ReLU and keep bits recomputed)."""
    scale = row_dropout_scale(threshold, IS_FP64)
    seed, mbase, period, jump = bwd_load_rng(SEED, DROPOUT, MAPPED)
    rows = tl.program_id(0).to(tl.int64) + tl.arange(0, 1).to(tl.int64)
    row_mask = rows < M
    base = rows * N
    rng = row_map_index(base, mbase, period, jump, MAPPED)  # each row's first dropout index
    mean, rstd, cols, s1, s2 = bwd_coef_start(MEAN, RSTD, rows, row_mask, RMS, IS_FP64, BLOCK_N)
    for col0 in range(0, N, BLOCK_N):
        cmask, offs, mask = bwd_chunk_tile(rows, row_mask, col0, cols, N)
        xs, gs = bwd_load_tiles(X, DY, offs, mask, 1, BLOCK_N, IS_FP64)
        w = row_load_param_tile(W, col0, cols, cmask, HAS_W, 1)
        b = row_load_param_tile(B, col0, cols, cmask, HAS_B, 1)
        drop = (seed, rng, threshold, scale)
        xhat, dy, dxhat = _bwd_chunk(
            xs[0], gs[0], mean, rstd, w, b, drop, col0, mask, HAS_W, HAS_B, DROPOUT, FAST_RNG, RMS, RELU
        )
        s1 += tl.sum(dxhat * xhat, axis=1)
        if not RMS:
            s2 += tl.sum(dxhat, axis=1)
    inv_n = row_inv_n(N, IS_FP64)
    tl.store(C1 + rows, s1 * inv_n, mask=row_mask)
    if not RMS:
        tl.store(C2 + rows, s2 * inv_n, mask=row_mask)


@triton.jit
def nd_bwd_chunk_kernel(
    DY,  # (M, N) grad_out, x's dtype
    X,  # (M, N) x
    W,  # (N,) weight, x's dtype or fp32; X without HAS_W, never read
    B,  # (N,) bias, x's dtype or fp32 (the weight's), read for the ReLU bit (RELU); X without HAS_B, never read
    MEAN,  # (M,) mean, fp32 (fp64 for fp64 x); RSTD for RMS, never read
    RSTD,  # (M,) rstd, fp32 (fp64 for fp64 x)
    SEED,  # (1,) int64 seed, or (4,) with the shard map (MAPPED); read only with DROPOUT
    C1,  # (M,) c1 of each row (nd_bwd_row_coef_kernel), fp32 (fp64 for fp64 x)
    C2,  # (M,) c2 of each row, fp32 (fp64 for fp64 x); not read for RMS
    DX,  # (M, N) grad_x, x's dtype
    PDW,  # (G, N) dgamma partial rows, fp32 (fp64 for fp64 x), G the row groups; not written without HAS_W
    PDB,  # (G, N) dbeta partial rows, the set after PDW's (PDW's where there is no weight); written with HAS_B
    M,
    N,
    threshold,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    DROPOUT: tl.constexpr,
    FAST_RNG: tl.constexpr,
    IS_FP64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    RTNE_BF16: tl.constexpr,
    RMS: tl.constexpr,
    RELU: tl.constexpr,
    MAPPED: tl.constexpr,
):
    """dx = rstd * (dxhat - xhat * c1 - c2) (RMS: no c2 term) with each row's c1, c2 from nd_bwd_row_coef_kernel,
    dxhat = dy' * w as in nd_bwd_fused_kernel; PDW[g] = sum(dy' * xhat), PDB[g] = sum(dy') over the rows of row
    tiles g, g + G, ..., in this program's column chunk.

    Looped backward, kernel B: grid (column chunks, row groups); dx and the dgamma/dbeta partials. A program
    keeps one column chunk, so its weight and bias columns are loaded once. RMS: MEAN and C2 are not read."""
    scale, col0, pid, cols, cmask = bwd_chunk_setup(N, threshold, IS_FP64, BLOCK_N)
    w = row_load_param(W, col0, cols, cmask, HAS_W)[None, :]
    b = row_load_param(B, col0, cols, cmask, HAS_B)[None, :]
    acc = bwd_acc_tiles(1, BLOCK_M, BLOCK_N, IS_FP64)  # dgamma and dbeta tiles
    seed0, mbase, period, jump = bwd_load_rng(SEED, DROPOUT, MAPPED)
    for tile in range(pid, tl.cdiv(M, BLOCK_M), tl.num_programs(1)):
        rows, row_mask, offs, mask = bwd_tile_rows(tile, col0, cols, cmask, M, N, BLOCK_M)
        seed, rng = bwd_tile_rng(seed0, tile, threshold, rows, N, mbase, period, jump, MAPPED)
        x = to_acc(tl.load(X + offs, mask=mask, other=0.0), IS_FP64)
        g = to_acc(tl.load(DY + offs, mask=mask, other=0.0), IS_FP64)
        mean, rstd = bwd_tile_stats(MEAN, RSTD, rows, row_mask, x, RMS)
        c1, c2 = bwd_tile_coefs(C1, C2, rows, row_mask, RMS)
        drop = (seed, rng, threshold, scale)
        xhat, dy, dxhat = _bwd_chunk(
            x, g, mean, rstd, w, b, drop, col0, mask, HAS_W, HAS_B, DROPOUT, FAST_RNG, RMS, RELU
        )
        acc = _bwd_outputs(DX, offs, mask, acc, (xhat,), (dy,), (dxhat,), rstd, c1, c2, HAS_W, HAS_B, 1, RMS, RTNE_BF16)
    bwd_store_partials(PDW, PDB, pid.to(tl.int64) * N + col0, cols, cmask, acc, HAS_W, HAS_B, 1, BLOCK_N)
