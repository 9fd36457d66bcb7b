"""Backward kernels of the row normalizations layer_norm_dropout_relu and norm_dropout: the single-block kernel
(row chunks as tuples under tl.static_range), the wide kernel of the longest rows (12288, 16384 columns) that holds
the raw row, and the looped pair (row coefficients, then a column-chunk x row-group grid). Each writes dx and the
dgamma / dbeta partial rows that common.sum_partials_kernel reduces. The contract, the RNG and the tiling are
described in layer_norm_dropout_relu.py, whose launchers plan and launch these."""

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
    seed,
    base,
    col0,
    cols,
    mask,
    threshold,
    scale,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    DROPOUT: tl.constexpr,
    FAST_RNG: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    RMS: tl.constexpr,
    RELU: tl.constexpr,
):
    """From a tile's loaded x and grad_out (accumulation dtype) and its rows' mean (unused for RMS) and rstd: xhat,
    the keep and ReLU bits, and returns (xhat, dy, dxhat), each computed once, where dy is the gradient with
    respect to the pre-dropout y (ldr_backward_element; without RELU keep ? g * scale : 0) and dxhat = dy * w
    (w, b: [1, BLOCK_N] or the tile's shape)."""
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
def ldr_bwd_fused_kernel(
    DY,
    X,
    W,
    B,
    MEAN,
    RSTD,
    SEED,
    DX,
    PDW,
    PDB,
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
    """Single-block backward, persistent: program p handles row tiles p, p + G, ...; rows are 1 chunk of
    BLOCK_N >= N columns or 3 chunks of N / 3, as the forward. A tile's loads (x, grad_out, mean, rstd, weight
    and bias of every chunk) are all issued before its reductions; xhat, dy and dxhat are computed once.
    dgamma/dbeta accumulate element-wise in [BLOCK_M, BLOCK_N] register tiles per chunk, reduced over the rows
    once at the end into the program's partial row. RMS: RMSNorm (MEAN is not read, no c2 term); RELU: the ReLU
    after the dropout."""
    scale = row_dropout_scale(threshold, IS_FP64)
    inv_n = row_inv_n(N, IS_FP64)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    dw0 = to_acc(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IS_FP64)
    db0 = to_acc(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IS_FP64)
    if CHUNKS == 3:  # N == 3 * BLOCK_N: every chunk is full
        dw1 = to_acc(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IS_FP64)
        db1 = to_acc(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IS_FP64)
        dw2 = to_acc(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IS_FP64)
        db2 = to_acc(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IS_FP64)
    seed0 = row_load_seed(SEED, DROPOUT)
    mbase, period, jump = row_load_map(SEED, DROPOUT, MAPPED)
    num_tiles = tl.cdiv(M, BLOCK_M)
    for tile in range(pid, num_tiles, tl.num_programs(0)):
        rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # < M < 2**31: no int32 overflow
        row_mask = rows < M
        offs, mask = row_tile_offsets(rows, row_mask, 0, cols, cmask, N)
        base = rows * N
        seed = row_tile_seed(seed0, tile, threshold)
        rng = row_map_index(base, mbase, period, jump, MAPPED)  # each row's first dropout index
        x0 = to_acc(tl.load(X + offs, mask=mask, other=0.0), IS_FP64)
        g0 = to_acc(tl.load(DY + offs, mask=mask, other=0.0), IS_FP64)
        if CHUNKS == 3:
            x1 = to_acc(tl.load(X + offs + BLOCK_N, mask=mask, other=0.0), IS_FP64)
            g1 = to_acc(tl.load(DY + offs + BLOCK_N, mask=mask, other=0.0), IS_FP64)
            x2 = to_acc(tl.load(X + offs + 2 * BLOCK_N, mask=mask, other=0.0), IS_FP64)
            g2 = to_acc(tl.load(DY + offs + 2 * BLOCK_N, mask=mask, other=0.0), IS_FP64)
        if RMS:
            mean = tl.zeros([BLOCK_M], dtype=x0.dtype)  # unused
        else:
            mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
        # weight and bias per tile (L1 hits): held across the loop they cost ~10-20 registers per thread, which
        # at N = 4096 halves the resident programs (the dgamma/dbeta accumulators are live across it too)
        w0 = row_load_param_tile(W, 0, cols, cmask, HAS_W, BLOCK_M)
        b0 = row_load_param_tile(B, 0, cols, cmask, HAS_B, BLOCK_M)
        if CHUNKS == 3:
            w1 = row_load_param_tile(W, BLOCK_N, cols, cmask, HAS_W, BLOCK_M)
            b1 = row_load_param_tile(B, BLOCK_N, cols, cmask, HAS_B, BLOCK_M)
            w2 = row_load_param_tile(W, 2 * BLOCK_N, cols, cmask, HAS_W, BLOCK_M)
            b2 = row_load_param_tile(B, 2 * BLOCK_N, cols, cmask, HAS_B, BLOCK_M)
        xhat0, dy0, dxhat0 = _bwd_chunk(
            x0,
            g0,
            mean,
            rstd,
            w0,
            b0,
            seed,
            rng,
            0,
            cols,
            mask,
            threshold,
            scale,
            HAS_W,
            HAS_B,
            DROPOUT,
            FAST_RNG,
            BLOCK_M,
            BLOCK_N,
            RMS,
            RELU,
        )
        if CHUNKS == 1:
            c1 = tl.sum(dxhat0 * xhat0, axis=1)
            if not RMS:
                c2 = tl.sum(dxhat0, axis=1)
        else:
            xhat1, dy1, dxhat1 = _bwd_chunk(
                x1,
                g1,
                mean,
                rstd,
                w1,
                b1,
                seed,
                rng,
                BLOCK_N,
                cols,
                mask,
                threshold,
                scale,
                HAS_W,
                HAS_B,
                DROPOUT,
                FAST_RNG,
                BLOCK_M,
                BLOCK_N,
                RMS,
                RELU,
            )
            xhat2, dy2, dxhat2 = _bwd_chunk(
                x2,
                g2,
                mean,
                rstd,
                w2,
                b2,
                seed,
                rng,
                2 * BLOCK_N,
                cols,
                mask,
                threshold,
                scale,
                HAS_W,
                HAS_B,
                DROPOUT,
                FAST_RNG,
                BLOCK_M,
                BLOCK_N,
                RMS,
                RELU,
            )
            # chunks added element-wise first: one cross-thread reduction per coefficient
            c1 = tl.sum(dxhat0 * xhat0 + dxhat1 * xhat1 + dxhat2 * xhat2, axis=1)
            if not RMS:
                c2 = tl.sum(dxhat0 + dxhat1 + dxhat2, axis=1)
        c1 = c1 * inv_n
        if RMS:
            dx = rstd[:, None] * (dxhat0 - xhat0 * c1[:, None])
        else:
            c2 = c2 * inv_n
            dx = rstd[:, None] * (dxhat0 - xhat0 * c1[:, None] - c2[:, None])
        tl.store(DX + offs, to_out(dx, DX, RTNE_BF16), mask=mask)
        if HAS_W:
            dw0 += dy0 * xhat0
        if HAS_B:
            db0 += dy0
        if CHUNKS == 3:
            if RMS:
                dx = rstd[:, None] * (dxhat1 - xhat1 * c1[:, None])
            else:
                dx = rstd[:, None] * (dxhat1 - xhat1 * c1[:, None] - c2[:, None])
            tl.store(DX + offs + BLOCK_N, to_out(dx, DX, RTNE_BF16), mask=mask)
            if RMS:
                dx = rstd[:, None] * (dxhat2 - xhat2 * c1[:, None])
            else:
                dx = rstd[:, None] * (dxhat2 - xhat2 * c1[:, None] - c2[:, None])
            tl.store(DX + offs + 2 * BLOCK_N, to_out(dx, DX, RTNE_BF16), mask=mask)
            if HAS_W:
                dw1 += dy1 * xhat1
                dw2 += dy2 * xhat2
            if HAS_B:
                db1 += dy1
                db2 += dy2
    prow = pid.to(tl.int64) * N
    if HAS_W:
        tl.store(PDW + prow + cols, tl.sum(dw0, axis=0), mask=cmask)
        if CHUNKS == 3:
            tl.store(PDW + prow + BLOCK_N + cols, tl.sum(dw1, axis=0), mask=cmask)
            tl.store(PDW + prow + 2 * BLOCK_N + cols, tl.sum(dw2, axis=0), mask=cmask)
    if HAS_B:
        tl.store(PDB + prow + cols, tl.sum(db0, axis=0), mask=cmask)
        if CHUNKS == 3:
            tl.store(PDB + prow + BLOCK_N + cols, tl.sum(db1, axis=0), mask=cmask)
            tl.store(PDB + prow + 2 * BLOCK_N + cols, tl.sum(db2, axis=0), mask=cmask)


@triton.jit
def _wide_bwd_sums(
    xr, gr, W, B, mean, rstd, seed, base, col0, cols, threshold,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, DROPOUT: tl.constexpr, FAST_RNG: tl.constexpr, BLOCK_N: tl.constexpr,
    VEC: tl.constexpr, RMS: tl.constexpr, RELU: tl.constexpr, OPAQUE: tl.constexpr,
):  # fmt: skip
    """The wide backward's first pass over one chunk of raw x and grad_out (xr, gr): the keep and ReLU bits select
    grad_out in its own dtype (gm: exact, a select), and the row sums' per-thread parts of gm * w * xhat and
    gm * w, without the dropout scale (applied to the row coefficients). Returns (x, gm) held (row_hold) and the
    two partial sums."""
    if RMS:
        xhat = xr.to(tl.float32) * rstd[:, None]
    else:
        xhat = (xr.to(tl.float32) - mean[:, None]) * rstd[:, None]
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
        gm = tl.where(pass_grad, gr, tl.zeros_like(gr))
    elif DROPOUT:
        gm = tl.where(row_keep_tile(seed, base, col0, cols, threshold, 1, BLOCK_N, FAST_RNG), gr, tl.zeros_like(gr))
    else:
        gm = gr
    gw = gm.to(tl.float32)
    if HAS_W:
        gw = gw * w
    s1 = row_thread_sums(gw * xhat, BLOCK_N, VEC)
    s2 = row_thread_sums(gw, BLOCK_N, VEC)
    return row_hold(xr, OPAQUE), row_hold(gm, OPAQUE), s1, s2


@triton.jit
def ldr_bwd_wide_kernel(
    DY,
    X,
    W,
    B,
    MEAN,
    RSTD,
    SEED,
    DX,
    PDW,
    PDB,
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
    """Single-block backward of the widest rows (N = CHUNKS x BLOCK_N, 12288 and 16384; not fp64), persistent, one
    row a tile. Per row: every chunk of x and grad_out is loaded first; pass 1 forms each chunk's keep and ReLU
    bits, keeps grad_out selected by them in its own dtype (gm) and the raw x, both held two to a register for
    16-bit data (row_hold), and adds per-thread parts of the row sums (row_thread_sums); one reduction per
    coefficient; pass 2 converts x and gm again, with the weight reloaded (L1 hits; a cache modifier of its own,
    so that the compiler does not merge it with pass 1's load and hold the weight across the reductions), stores
    dx and accumulates dgamma / dbeta without the dropout scale (applied to the program's partial row). Live
    across the row sums: the raw row (1 register an element for 16-bit data) and the accumulators (1 or 2), where
    the fused kernel holds xhat, dy and dxhat in fp32. VEC: the elements a thread holds side by side. HOLD: the
    chunks of x held (the last HOLD); below CHUNKS, pass 2 reads the others again (row_held_chunk) and pass 1
    loads chunk by chunk, for the registers that the held row and all of a row's loads in flight would take."""
    UPFRONT: tl.constexpr = HOLD == CHUNKS
    scale = row_dropout_scale(threshold, False)
    inv_n = row_inv_n(N, False)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    dw = row_zero_chunks(CHUNKS, BLOCK_N)
    db = row_zero_chunks(CHUNKS, BLOCK_N)
    seed0 = row_load_seed(SEED, DROPOUT)
    mbase, period, jump = row_load_map(SEED, DROPOUT, MAPPED)
    for row in range(pid, M, tl.num_programs(0)):
        rows = row + tl.zeros([1], dtype=tl.int64)  # int64: row * N may pass 2**31
        offs = rows[:, None] * N + cols[None, :]
        base = rows * N
        seed = row_tile_seed(seed0, row, threshold)
        rng = row_map_index(base, mbase, period, jump, MAPPED)  # each row's first dropout index
        mean, rstd = row_load_stats(MEAN, RSTD, rows, RMS)
        xr, gr = row_load_raw_chunks(X, DY, offs, CHUNKS, BLOCK_N, UPFRONT)
        xs = ()
        gs = ()
        s1 = tl.zeros([BLOCK_N // VEC], dtype=tl.float32)
        s2 = tl.zeros([BLOCK_N // VEC], dtype=tl.float32)
        for c in tl.static_range(CHUNKS):
            x_c, g_c, t1, t2 = _wide_bwd_sums(
                row_raw_chunk(X, offs, xr, c, BLOCK_N, UPFRONT), row_raw_chunk(DY, offs, gr, c, BLOCK_N, UPFRONT),
                W, B, mean, rstd, seed, rng, c * BLOCK_N, cols, threshold,
                HAS_W, HAS_B, DROPOUT, FAST_RNG, BLOCK_N, VEC, RMS, RELU, OPAQUE,
            )  # fmt: skip
            if c >= CHUNKS - HOLD:
                xs = xs + (x_c,)
            gs = gs + (g_c,)
            s1 += t1
            s2 += t2
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
        dw = ndw
        db = ndb
    prow = pid.to(tl.int64) * N
    for c in tl.static_range(CHUNKS):
        if HAS_W:
            tl.store(PDW + prow + c * BLOCK_N + cols, tl.sum(dw[c], axis=0) * scale)
        if HAS_B:
            tl.store(PDB + prow + c * BLOCK_N + cols, tl.sum(db[c], axis=0) * scale)


@triton.jit
def ldr_bwd_row_coef_kernel(
    DY,
    X,
    W,
    B,
    MEAN,
    RSTD,
    SEED,
    C1,
    C2,
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
    C2 is not written)."""
    scale = row_dropout_scale(threshold, IS_FP64)
    seed = row_load_seed(SEED, DROPOUT)
    mbase, period, jump = row_load_map(SEED, DROPOUT, MAPPED)
    rows = tl.program_id(0).to(tl.int64) + tl.arange(0, 1).to(tl.int64)
    row_mask = rows < M
    base = rows * N
    rng = row_map_index(base, mbase, period, jump, MAPPED)  # each row's first dropout index
    if RMS:
        mean = to_acc(tl.zeros([1], dtype=tl.float32), IS_FP64)  # unused
    else:
        mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)
    rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
    cols = tl.arange(0, BLOCK_N)
    s1 = to_acc(tl.zeros([1], dtype=tl.float32), IS_FP64)
    s2 = to_acc(tl.zeros([1], dtype=tl.float32), IS_FP64)
    for col0 in range(0, N, BLOCK_N):
        cmask = (col0 + cols) < N
        offs, mask = row_tile_offsets(rows, row_mask, col0, cols, cmask, N)
        x = to_acc(tl.load(X + offs, mask=mask, other=0.0), IS_FP64)
        g = to_acc(tl.load(DY + offs, mask=mask, other=0.0), IS_FP64)
        w = row_load_param_tile(W, col0, cols, cmask, HAS_W, 1)
        b = row_load_param_tile(B, col0, cols, cmask, HAS_B, 1)
        xhat, dy, dxhat = _bwd_chunk(
            x,
            g,
            mean,
            rstd,
            w,
            b,
            seed,
            rng,
            col0,
            cols,
            mask,
            threshold,
            scale,
            HAS_W,
            HAS_B,
            DROPOUT,
            FAST_RNG,
            1,
            BLOCK_N,
            RMS,
            RELU,
        )
        s1 += tl.sum(dxhat * xhat, axis=1)
        if not RMS:
            s2 += tl.sum(dxhat, axis=1)
    inv_n = row_inv_n(N, IS_FP64)
    tl.store(C1 + rows, s1 * inv_n, mask=row_mask)
    if not RMS:
        tl.store(C2 + rows, s2 * inv_n, mask=row_mask)


@triton.jit
def ldr_bwd_chunk_kernel(
    DY,
    X,
    W,
    B,
    MEAN,
    RSTD,
    SEED,
    C1,
    C2,
    DX,
    PDW,
    PDB,
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
    """Looped backward, kernel B: grid (column chunks, row groups); dx and the dgamma/dbeta partials. A program
    keeps one column chunk, so its weight and bias columns are loaded once. RMS: MEAN and C2 are not read."""
    scale = row_dropout_scale(threshold, IS_FP64)
    col0 = tl.program_id(0) * BLOCK_N
    pid = tl.program_id(1)
    cols = tl.arange(0, BLOCK_N)
    cmask = (col0 + cols) < N
    w = row_load_param(W, col0, cols, cmask, HAS_W)[None, :]
    b = row_load_param(B, col0, cols, cmask, HAS_B)[None, :]
    dw_acc = to_acc(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IS_FP64)
    db_acc = to_acc(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IS_FP64)
    seed0 = row_load_seed(SEED, DROPOUT)
    mbase, period, jump = row_load_map(SEED, DROPOUT, MAPPED)
    num_tiles = tl.cdiv(M, BLOCK_M)
    for tile in range(pid, num_tiles, tl.num_programs(1)):
        rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # < M < 2**31: no int32 overflow
        row_mask = rows < M
        offs, mask = row_tile_offsets(rows, row_mask, col0, cols, cmask, N)
        seed = row_tile_seed(seed0, tile, threshold)
        rng = row_map_index(rows * N, mbase, period, jump, MAPPED)  # each row's first dropout index
        x = to_acc(tl.load(X + offs, mask=mask, other=0.0), IS_FP64)
        g = to_acc(tl.load(DY + offs, mask=mask, other=0.0), IS_FP64)
        if RMS:
            mean = tl.zeros([BLOCK_M], dtype=x.dtype)  # unused
        else:
            mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
        c1 = tl.load(C1 + rows, mask=row_mask, other=0.0)
        if not RMS:
            c2 = tl.load(C2 + rows, mask=row_mask, other=0.0)
        xhat, dy, dxhat = _bwd_chunk(
            x,
            g,
            mean,
            rstd,
            w,
            b,
            seed,
            rng,
            col0,
            cols,
            mask,
            threshold,
            scale,
            HAS_W,
            HAS_B,
            DROPOUT,
            FAST_RNG,
            BLOCK_M,
            BLOCK_N,
            RMS,
            RELU,
        )
        if RMS:
            dx = rstd[:, None] * (dxhat - xhat * c1[:, None])
        else:
            dx = rstd[:, None] * (dxhat - xhat * c1[:, None] - c2[:, None])
        tl.store(DX + offs, to_out(dx, DX, RTNE_BF16), mask=mask)
        if HAS_W:
            dw_acc += dy * xhat
        if HAS_B:
            db_acc += dy
    prow = pid.to(tl.int64) * N + col0
    if HAS_W:
        tl.store(PDW + prow + cols, tl.sum(dw_acc, axis=0), mask=cmask)
    if HAS_B:
        tl.store(PDB + prow + cols, tl.sum(db_acc, axis=0), mask=cmask)
