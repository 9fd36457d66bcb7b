"""Triton kernels of LayerNorm -> Dropout -> ReLU (forward and backward) and their launch helpers.

Pure ``@triton.jit`` code plus plain-Python launchers: no torch.library here (the registrations live in
gpuopt_ops/triton_ops.py). The math is that of csrc/fused_math.h, the dropout RNG that of docs/DESIGN.md:

- Philox4x32-10 through ``tl.philox(seed, c0, c1, c2, c3)`` with uint32 counters; tl.philox splits the 64-bit
  seed into the key (seed & 0xffffffff, seed >> 32). The seed is loaded inside the kernel from the int64 seed
  tensor (no host sync). Element idx (int64 linear index in the contiguous (M, N) view) belongs to group
  g = idx >> 3, counter (g lo32, g hi32, 0, 0), and takes the 16-bit lane k = idx & 7 of the four output words
  (even k: low half of word k >> 1, odd k: high half). keep <=> u >= t, t = round(p * 65536) computed on the
  host, kept values scaled by 65536 / (65536 - t) (computed in the kernel, in the accumulation dtype);
  t = 65536 gives exact zeros through a select.
- Fast RNG path (N % 8 == 0, so a tile's groups never straddle rows): one Philox call per 8 elements, lanes
  interleaved with tl.join + tl.reshape into element order. Generic path (any N): one call per element, the
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
GPU with the specialization of a real launch: `python -m tools.triton_resources`,
the static gate of the tests): no configuration spills, at most 128 registers per thread (backward N = 8192
fp32: 16 warps, 128). Not yet timed on a GPU. Every launch runs under x's device (device_guard).

- Forward, single-block path when N <= 8192 (4096 for fp64): BLOCK_N = next_power_of_2(N); several rows per
  program, BLOCK_M = clamp(4096 // BLOCK_N, 1, 64), so a program moves >= 4096 elements (short rows do not
  waste a program each). Statistics are exact two-pass (mean, then sum of squared deviations) on the rows
  held in registers: x is read once.
- Forward, looped path for longer rows: one row per program, chunks of 4096 columns (2048 for fp64), 8 warps.
  Pass 1 merges the per-chunk (count, mean, M2) with Chan's formula (exact per chunk, no E[x^2] - E[x]^2
  cancellation); pass 2 re-reads x and writes the output: two reads of x.
- Backward, single-block path when N <= 8192 (2048 for fp64): BLOCK_M = clamp(2048 // BLOCK_N, 1, 64) rows per
  tile; G programs = SM count x resident programs per SM (backward_programs_per_sm: a fixed register budget per
  (elements per thread, dtype size), checked against the compiled kernels; <= 8 on the interpreter), so the
  grid is one wave; program p takes row tiles p, p + G, ...; per row it computes c1 = mean(dxhat * xhat),
  c2 = mean(dxhat) and dx, and accumulates dgamma/dbeta element-wise in [BLOCK_M, BLOCK_N] register tiles,
  reduced over rows once at the end into its partial row of a (G, N) buffer; ``sum_partials_kernel`` (one
  program per 32 columns) reduces the G rows in a fixed order (deterministic: no float atomics; the bits
  depend on (shape, dtype, SM count), never on autotuning). N = 16384 would need 32 elements per thread at 16
  warps (> 128 registers: spills or less than one block per SM), so it stays on the looped path.
- Backward, looped path: kernel A computes c1, c2 of one row per program (1024-column chunks, 4 warps);
  kernel B runs a (1024-column chunk x row group) grid, tiles of 2 rows, computing dx and the dgamma/dbeta
  partials; then the same reduction. x and grad_out are read twice.

All indexing is int64 (row * N), grids are (tiles,) or (chunks, groups) with groups <= 65535, so M > 65535 and
numel > 2^31 are fine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import triton
import triton.language as tl

from .common import (
    INTERPRETED,
    device_guard,
    device_sm_count,
    launch_directly,
    launch_sum_partials,
    num_row_groups,
    num_warps_for,
    persistent_regs,
    resident_programs_per_sm,
    to_acc,
    to_out,
)

# Longest rows of the single-block kernels: 16 warps x 32 threads x (elements per thread, see _warps_for).
FWD_MAX_FUSED_N = 8192
FWD_MAX_FUSED_N_FP64 = 4096
BWD_MAX_FUSED_N = 8192
BWD_MAX_FUSED_N_FP64 = 2048


# ----------------------------------------------------------------------------------------------- jit helpers
@triton.jit
def _rsqrt(v, IS_FP64: tl.constexpr):
    # 1 / sqrt(v) with IEEE sqrt and division, as csrc does (acc_t(1) / std::sqrt(var + eps))
    if IS_FP64:
        r = 1.0 / tl.sqrt(v)
    else:
        r = tl.div_rn(tl.full(v.shape, 1.0, tl.float32), tl.sqrt_rn(v))
    return r


@triton.jit
def _div(a, b, IS_FP64: tl.constexpr):
    """a / b correctly rounded (Triton's fp32 `/` compiles to the approximate div.full.f32; fp64 `/` is exact)."""
    if IS_FP64:
        q = a / b
    else:
        q = tl.div_rn(a, b)
    return q


@triton.jit
def _inv_n(N, IS_FP64: tl.constexpr):
    """1 / N correctly rounded in the accumulation dtype: the statistics multiply by it, as the CPU fp32 kernels
    (inv_n = 1.0f / float(N)) and the CUDA kernels (inv_n = A(1) / A(N)) do."""
    if IS_FP64:
        r = 1.0 / tl.full([1], N, tl.int64).to(tl.float64)
    else:
        r = tl.div_rn(tl.full([1], 1.0, tl.float32), tl.full([1], N, tl.int32).to(tl.float32))
    return r


@triton.jit
def _eps(eps_hi, eps_lo, IS_FP64: tl.constexpr):
    if IS_FP64:
        # fp64 [1] tensor + the fp32 scalars (Python floats under the interpreter): exact widening, fp64 adds
        e = (tl.zeros([1], dtype=tl.float64) + eps_hi) + eps_lo
    else:
        e = eps_hi
    return e


@triton.jit
def _dropout_scale(threshold, IS_FP64: tl.constexpr):
    """The scale of kept values, 65536 / (65536 - t), in the accumulation dtype: 1 when t = 0 (the backward
    multiplies by it with p = 0 too), 0 when t = 65536 (p = 1).

    Computed here rather than passed in: Triton passes a Python float as fp32, which would leave the fp64 kernels
    only fp32-accurate. Both divisions are correctly rounded, so the fp32 value is the fp32 rounding of the fp64
    quotient, i.e. csrc's static_cast<float>(DropoutParams::scale), for every t (the dropout-bits tests check all).
    """
    if IS_FP64:
        kept = tl.full([], 65536 - threshold, tl.float64)
        s = 65536.0 / tl.maximum(kept, 1.0)
    else:
        kept = tl.full([], 65536 - threshold, tl.float32)
        s = tl.div_rn(tl.full([], 65536.0, tl.float32), tl.maximum(kept, 1.0))
    return tl.where(kept > 0.0, s, 0.0)


@triton.jit
def _lane_u16_generic(seed, idx):
    """The 16-bit Philox lane u (int32, 0..65535) of each linear index idx (int64 tensor): one call each."""
    g = idx >> 3
    c0 = g.to(tl.uint32)  # truncation: the low 32 bits
    c1 = (g >> 32).to(tl.uint32)
    z = tl.zeros(idx.shape, dtype=tl.uint32)
    w0, w1, w2, w3 = tl.philox(seed, c0, c1, z, z)
    k = (idx & 7).to(tl.int32)
    word_idx = k >> 1
    word = tl.where(word_idx == 0, w0, tl.where(word_idx == 1, w1, tl.where(word_idx == 2, w2, w3)))
    u = tl.where((k & 1) == 1, word >> 16, word & 0xFFFF)
    return u.to(tl.int32)


@triton.jit
def _lane_u16_fast(seed, base, col0, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Lanes u for the [BLOCK_M, BLOCK_N] tile of rows starting at linear index base (int64 [BLOCK_M], each a
    multiple of 8) and columns col0 + 0..BLOCK_N-1 (col0 a multiple of 8): one Philox call per 8 elements."""
    GROUPS: tl.constexpr = BLOCK_N // 8
    gcols = tl.arange(0, GROUPS).to(tl.int64)
    g = ((base[:, None] + col0) >> 3) + gcols[None, :]  # [BLOCK_M, GROUPS]
    c0 = g.to(tl.uint32)
    c1 = (g >> 32).to(tl.uint32)
    z = tl.zeros([BLOCK_M, GROUPS], dtype=tl.uint32)
    w0, w1, w2, w3 = tl.philox(seed, c0, c1, z, z)
    lo0 = w0 & 0xFFFF
    lo1 = w1 & 0xFFFF
    lo2 = w2 & 0xFFFF
    lo3 = w3 & 0xFFFF
    hi0 = w0 >> 16
    hi1 = w1 >> 16
    hi2 = w2 >> 16
    hi3 = w3 >> 16
    # [..., j, i, h] = (lo, hi)[h] of word 2j + i  ->  flattened order w0lo w0hi w1lo w1hi ... = lane k
    u = tl.join(tl.join(tl.join(lo0, lo2), tl.join(lo1, lo3)), tl.join(tl.join(hi0, hi2), tl.join(hi1, hi3)))
    u = tl.reshape(u, [BLOCK_M, BLOCK_N])
    return u.to(tl.int32)


@triton.jit
def _keep_tile(SEED, base, col0, cols, threshold, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FAST_RNG: tl.constexpr):
    """Dropout keep bits of the [BLOCK_M, BLOCK_N] tile: rows start at linear index base, columns col0 + cols."""
    seed = tl.load(SEED).to(tl.uint64, bitcast=True)
    if FAST_RNG:
        u = _lane_u16_fast(seed, base, col0, BLOCK_M, BLOCK_N)
    else:
        idx = base[:, None] + col0 + cols[None, :].to(tl.int64)
        u = _lane_u16_generic(seed, idx)
    return u >= threshold


@triton.jit
def _fwd_output(
    y,
    W,
    B,
    SEED,
    base,
    col0,
    cols,
    cmask,
    threshold,
    scale,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    DROPOUT: tl.constexpr,
    FAST_RNG: tl.constexpr,
    IS_FP64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """ldr_forward_element on a tile of normalized values y (rows from linear index base, columns col0 + cols):
    affine, then keep ? (y <= 0 ? 0 : y * scale) : 0  (a NaN that survives dropout stays NaN)."""
    if HAS_W:
        w = to_acc(tl.load(W + col0 + cols, mask=cmask, other=0.0), IS_FP64)
        y = y * w[None, :]
    if HAS_B:
        b = to_acc(tl.load(B + col0 + cols, mask=cmask, other=0.0), IS_FP64)
        y = y + b[None, :]
    out = tl.where(y <= 0.0, 0.0, y)
    if DROPOUT:
        keep = _keep_tile(SEED, base, col0, cols, threshold, BLOCK_M, BLOCK_N, FAST_RNG)
        out = tl.where(keep, out * scale, 0.0)
    return out


# -------------------------------------------------------------------------------------------------- forward
@triton.jit
def ldr_fwd_fused_kernel(
    X,
    W,
    B,
    SEED,
    OUT,
    MEAN,
    RSTD,
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
    RTNE_BF16: tl.constexpr,
):
    """Single-block forward: BLOCK_M whole rows (BLOCK_N >= N) per program."""
    scale = _dropout_scale(threshold, IS_FP64)
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < M
    col_mask = cols < N
    mask = row_mask[:, None] & col_mask[None, :]
    base = rows * N
    offs = base[:, None] + cols[None, :]
    x = to_acc(tl.load(X + offs, mask=mask, other=0.0), IS_FP64)
    inv_n = _inv_n(N, IS_FP64)
    mean = tl.sum(x, axis=1) * inv_n
    d = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(d * d, axis=1) * inv_n
    rstd = _rsqrt(var + _eps(eps_hi, eps_lo, IS_FP64), IS_FP64)
    tl.store(MEAN + rows, mean, mask=row_mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)
    out = _fwd_output(
        d * rstd[:, None],
        W,
        B,
        SEED,
        base,
        0,
        cols,
        col_mask,
        threshold,
        scale,
        HAS_W,
        HAS_B,
        DROPOUT,
        FAST_RNG,
        IS_FP64,
        BLOCK_M,
        BLOCK_N,
    )
    tl.store(OUT + offs, to_out(out, OUT, RTNE_BF16), mask=mask)


@triton.jit
def ldr_fwd_looped_kernel(
    X,
    W,
    B,
    SEED,
    OUT,
    MEAN,
    RSTD,
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
):
    """Looped forward for long rows: one row per program, BLOCK_N-column chunks, two passes over x."""
    scale = _dropout_scale(threshold, IS_FP64)
    row = tl.program_id(0).to(tl.int64)
    rows = row + tl.arange(0, 1).to(tl.int64)  # [1]: the tile helpers work on [rows, cols]
    base = rows * N
    cols = tl.arange(0, BLOCK_N)
    mean = to_acc(tl.zeros([1], dtype=tl.float32), IS_FP64)
    m2 = to_acc(tl.zeros([1], dtype=tl.float32), IS_FP64)
    for col0 in range(0, N, BLOCK_N):
        cmask = (col0 + cols) < N
        x = to_acc(tl.load(X + base[:, None] + col0 + cols[None, :], mask=cmask[None, :], other=0.0), IS_FP64)
        n_b = tl.minimum(N - col0, BLOCK_N)
        # Chan et al.: merge (col0, mean, m2) with (n_b, mean_b, m2_b); every division correctly rounded
        n_a = to_acc(col0 + tl.zeros([1], dtype=tl.int32), IS_FP64)
        n_b_f = to_acc(n_b + tl.zeros([1], dtype=tl.int32), IS_FP64)
        mean_b = _div(tl.sum(x, axis=1), n_b_f, IS_FP64)
        d = tl.where(cmask[None, :], x - mean_b[:, None], 0.0)
        m2_b = tl.sum(d * d, axis=1)
        tot = n_a + n_b_f
        delta = mean_b - mean
        mean = mean + delta * _div(n_b_f, tot, IS_FP64)
        m2 = m2 + m2_b + delta * delta * _div(n_a * n_b_f, tot, IS_FP64)
    var = m2 * _inv_n(N, IS_FP64)
    rstd = _rsqrt(var + _eps(eps_hi, eps_lo, IS_FP64), IS_FP64)
    tl.store(MEAN + rows, mean)
    tl.store(RSTD + rows, rstd)
    for col0 in range(0, N, BLOCK_N):
        cmask = (col0 + cols) < N
        offs = base[:, None] + col0 + cols[None, :]
        x = to_acc(tl.load(X + offs, mask=cmask[None, :], other=0.0), IS_FP64)
        out = _fwd_output(
            (x - mean[:, None]) * rstd[:, None],
            W,
            B,
            SEED,
            base,
            col0,
            cols,
            cmask,
            threshold,
            scale,
            HAS_W,
            HAS_B,
            DROPOUT,
            FAST_RNG,
            IS_FP64,
            1,
            BLOCK_N,
        )
        tl.store(OUT + offs, to_out(out, OUT, RTNE_BF16), mask=cmask[None, :])


# ------------------------------------------------------------------------------------------------- backward
@triton.jit
def _tile_offsets(rows, row_mask, col0, cols, cmask, N):
    """Linear offsets and mask of the tile rows x (col0 + cols). Computed in the kernels themselves (not returned
    from a helper that also loads), so Inductor's TTIR analysis sees that only the output pointers are stored."""
    mask = row_mask[:, None] & cmask[None, :]
    offs = rows[:, None] * N + col0 + cols[None, :]
    return offs, mask


@triton.jit
def _ldr_bwd_tile(
    DY,
    X,
    W,
    B,
    MEAN,
    RSTD,
    SEED,
    rows,
    row_mask,
    col0,
    cols,
    cmask,
    offs,
    mask,
    N,
    threshold,
    scale,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    DROPOUT: tl.constexpr,
    FAST_RNG: tl.constexpr,
    IS_FP64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Recomputes xhat, y, the keep and ReLU bits of a tile; returns (rstd, xhat, dy, dxhat) where dy is the
    gradient with respect to the pre-dropout y (ldr_backward_element) and dxhat = dy * w."""
    base = rows * N
    x = to_acc(tl.load(X + offs, mask=mask, other=0.0), IS_FP64)
    g = to_acc(tl.load(DY + offs, mask=mask, other=0.0), IS_FP64)
    mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)
    rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
    xhat = (x - mean[:, None]) * rstd[:, None]
    y = xhat
    if HAS_W:
        w = to_acc(tl.load(W + col0 + cols, mask=cmask, other=0.0), IS_FP64)
        y = y * w[None, :]
    if HAS_B:
        b = to_acc(tl.load(B + col0 + cols, mask=cmask, other=0.0), IS_FP64)
        y = y + b[None, :]
    pass_grad = y > 0.0
    if DROPOUT:
        keep = _keep_tile(SEED, base, col0, cols, threshold, BLOCK_M, BLOCK_N, FAST_RNG)
        pass_grad = pass_grad & keep
    dy = tl.where(pass_grad, g * scale, 0.0)
    dy = tl.where(mask, dy, 0.0)
    if HAS_W:
        dxhat = dy * w[None, :]
    else:
        dxhat = dy
    return rstd, xhat, dy, dxhat


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
    RTNE_BF16: tl.constexpr,
):
    """Single-block backward: program p handles row tiles p, p + G, ...; dgamma/dbeta accumulate element-wise in
    [BLOCK_M, BLOCK_N] register tiles, reduced over the tile's rows once at the end into its partial row."""
    scale = _dropout_scale(threshold, IS_FP64)
    inv_n = _inv_n(N, IS_FP64)
    pid = tl.program_id(0)
    num_groups = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    dw_acc = to_acc(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IS_FP64)
    db_acc = to_acc(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IS_FP64)
    num_tiles = tl.cdiv(M, BLOCK_M)
    for tile in range(pid, num_tiles, num_groups):
        rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # < M < 2**31: no int32 overflow
        row_mask = rows < M
        offs, mask = _tile_offsets(rows, row_mask, 0, cols, cmask, N)
        rstd, xhat, dy, dxhat = _ldr_bwd_tile(
            DY,
            X,
            W,
            B,
            MEAN,
            RSTD,
            SEED,
            rows,
            row_mask,
            0,
            cols,
            cmask,
            offs,
            mask,
            N,
            threshold,
            scale,
            HAS_W,
            HAS_B,
            DROPOUT,
            FAST_RNG,
            IS_FP64,
            BLOCK_M,
            BLOCK_N,
        )
        c1 = tl.sum(dxhat * xhat, axis=1) * inv_n
        c2 = tl.sum(dxhat, axis=1) * inv_n
        dx = rstd[:, None] * (dxhat - xhat * c1[:, None] - c2[:, None])
        tl.store(DX + offs, to_out(dx, DX, RTNE_BF16), mask=mask)
        if HAS_W:
            dw_acc += dy * xhat
        if HAS_B:
            db_acc += dy
    prow = pid.to(tl.int64) * N
    if HAS_W:
        tl.store(PDW + prow + cols, tl.sum(dw_acc, axis=0), mask=cmask)
    if HAS_B:
        tl.store(PDB + prow + cols, tl.sum(db_acc, axis=0), mask=cmask)


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
):
    """Looped backward, kernel A: c1 = mean(dxhat * xhat), c2 = mean(dxhat) of one row per program."""
    scale = _dropout_scale(threshold, IS_FP64)
    rows = tl.program_id(0).to(tl.int64) + tl.arange(0, 1).to(tl.int64)
    row_mask = rows < M
    cols = tl.arange(0, BLOCK_N)
    s1 = to_acc(tl.zeros([1], dtype=tl.float32), IS_FP64)
    s2 = to_acc(tl.zeros([1], dtype=tl.float32), IS_FP64)
    for col0 in range(0, N, BLOCK_N):
        cmask = (col0 + cols) < N
        offs, mask = _tile_offsets(rows, row_mask, col0, cols, cmask, N)
        rstd, xhat, dy, dxhat = _ldr_bwd_tile(
            DY,
            X,
            W,
            B,
            MEAN,
            RSTD,
            SEED,
            rows,
            row_mask,
            col0,
            cols,
            cmask,
            offs,
            mask,
            N,
            threshold,
            scale,
            HAS_W,
            HAS_B,
            DROPOUT,
            FAST_RNG,
            IS_FP64,
            1,
            BLOCK_N,
        )
        s1 += tl.sum(dxhat * xhat, axis=1)
        s2 += tl.sum(dxhat, axis=1)
    inv_n = _inv_n(N, IS_FP64)
    tl.store(C1 + rows, s1 * inv_n, mask=row_mask)
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
):
    """Looped backward, kernel B: grid (column chunks, row groups); dx and the dgamma/dbeta partials."""
    scale = _dropout_scale(threshold, IS_FP64)
    col0 = tl.program_id(0) * BLOCK_N
    pid = tl.program_id(1)
    num_groups = tl.num_programs(1)
    cols = tl.arange(0, BLOCK_N)
    cmask = (col0 + cols) < N
    dw_acc = to_acc(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IS_FP64)
    db_acc = to_acc(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IS_FP64)
    num_tiles = tl.cdiv(M, BLOCK_M)
    for tile in range(pid, num_tiles, num_groups):
        rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # < M < 2**31: no int32 overflow
        row_mask = rows < M
        offs, mask = _tile_offsets(rows, row_mask, col0, cols, cmask, N)
        rstd, xhat, dy, dxhat = _ldr_bwd_tile(
            DY,
            X,
            W,
            B,
            MEAN,
            RSTD,
            SEED,
            rows,
            row_mask,
            col0,
            cols,
            cmask,
            offs,
            mask,
            N,
            threshold,
            scale,
            HAS_W,
            HAS_B,
            DROPOUT,
            FAST_RNG,
            IS_FP64,
            BLOCK_M,
            BLOCK_N,
        )
        c1 = tl.load(C1 + rows, mask=row_mask, other=0.0)
        c2 = tl.load(C2 + rows, mask=row_mask, other=0.0)
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


# ------------------------------------------------------------------------------------------- launch helpers
def dropout_threshold(p: float) -> int:
    """t = round(p * 65536) half up, clamped to 0..65536 (csrc/fused_math.h dropout_threshold)."""
    t = p * 65536.0 + 0.5
    t = min(max(t, 0.0), 65536.0)
    return int(math.floor(t))


def eps_pair(eps: float):
    """eps as fp32 hi + lo: the fp32 kernels use hi (= float(eps), as csrc), the fp64 kernels hi + lo."""
    hi = float(np.float32(eps))
    lo = float(np.float32(eps - hi))
    return hi, lo


@dataclass(frozen=True)
class LdrConfig:
    fused: bool
    block_m: int
    block_n: int
    num_warps: int
    fast_rng: bool

    @property
    def elems_per_thread(self) -> int:
        return max(1, self.block_m * self.block_n // (32 * self.num_warps))


def forward_config(n: int, dtype: torch.dtype, max_fused_n: int | None = None) -> LdrConfig:
    """Forward tiling: 16 elements per thread; 8 for fp64 (values take two registers) and for N % 8 != 0 (one
    Philox call per element keeps its four words live)."""
    fp64 = dtype == torch.float64
    per_thread = 8 if fp64 or n % 8 != 0 else 16
    if max_fused_n is None:
        max_fused_n = FWD_MAX_FUSED_N_FP64 if fp64 else FWD_MAX_FUSED_N
    if n <= max_fused_n:
        block_n = triton.next_power_of_2(n)
        block_m = max(1, min(64, 4096 // block_n))
        return LdrConfig(True, block_m, block_n, num_warps_for(block_m * block_n, per_thread), n % 8 == 0)
    block_n = 2048 if fp64 else 4096
    block_n = max(8, min(block_n, triton.next_power_of_2(max_fused_n)))  # tests shrink max_fused_n
    return LdrConfig(False, 1, block_n, num_warps_for(block_n, per_thread), n % 8 == 0)


def backward_config(n: int, dtype: torch.dtype, max_fused_n: int | None = None) -> LdrConfig:
    """Backward tiling: 8 elements per thread (4 for fp64) up to 16 warps, so 16 per thread at N = 8192: x,
    grad_out, xhat, dy, dxhat and the dgamma/dbeta accumulator tiles are live together."""
    fp64 = dtype == torch.float64
    per_thread = 4 if fp64 else 8
    if max_fused_n is None:
        max_fused_n = BWD_MAX_FUSED_N_FP64 if fp64 else BWD_MAX_FUSED_N
    if n <= max_fused_n:
        block_n = triton.next_power_of_2(n)
        block_m = max(1, min(64, 2048 // block_n))
        return LdrConfig(True, block_m, block_n, num_warps_for(block_m * block_n, per_thread), n % 8 == 0)
    block_n = max(8, min(1024, triton.next_power_of_2(max_fused_n)))
    block_m = max(1, min(16, 2048 // block_n))
    return LdrConfig(False, block_m, block_n, num_warps_for(block_m * block_n, per_thread), n % 8 == 0)


def backward_programs_per_sm(cfg: LdrConfig, dtype: torch.dtype) -> int:
    """Resident programs per SM of the persistent backward kernels (fused, or the chunk kernel of the looped
    path), from the register budget of their elements per thread: the grid is SMs x this, one wave."""
    elem_bytes = torch.empty((), dtype=dtype).element_size()
    return resident_programs_per_sm(cfg.num_warps, persistent_regs(cfg.elems_per_thread, elem_bytes))


def launch_forward(
    x,
    weight,
    bias,
    seed,
    out,
    mean,
    rstd,
    p: float,
    eps: float,
    *,
    wrap=launch_directly,
    max_fused_n: int | None = None,
    sm_count: Optional[int] = None,
) -> None:
    """Runs the forward on contiguous x (M, N) view into the preallocated out, mean, rstd, under x's device.

    `wrap` is applied to each kernel before launching (torch.library.wrap_triton inside a triton_op). sm_count
    is unused (the forward grid is one program per row tile); accepted for a uniform launcher signature.
    """
    n = int(x.shape[-1])
    m = x.numel() // n
    if m == 0:
        return
    t = dropout_threshold(p)
    eps_hi, eps_lo = eps_pair(eps)
    cfg = forward_config(n, x.dtype, max_fused_n)
    common = dict(
        HAS_W=weight is not None,
        HAS_B=bias is not None,
        DROPOUT=t != 0,
        FAST_RNG=cfg.fast_rng,
        IS_FP64=x.dtype == torch.float64,
        BLOCK_N=cfg.block_n,
        RTNE_BF16=INTERPRETED,
    )
    w = weight if weight is not None else x  # never read when HAS_W is False
    b = bias if bias is not None else x
    with device_guard(x.device):
        if cfg.fused:
            grid = (triton.cdiv(m, cfg.block_m),)
            wrap(ldr_fwd_fused_kernel)[grid](
                x,
                w,
                b,
                seed,
                out,
                mean,
                rstd,
                m,
                n,
                eps_hi,
                eps_lo,
                t,
                BLOCK_M=cfg.block_m,
                num_warps=cfg.num_warps,
                **common,
            )
        else:
            grid = (m,)
            wrap(ldr_fwd_looped_kernel)[grid](
                x, w, b, seed, out, mean, rstd, m, n, eps_hi, eps_lo, t, num_warps=cfg.num_warps, **common
            )


def launch_backward(
    grad_out,
    x,
    weight,
    bias,
    mean,
    rstd,
    seed,
    grad_x,
    grad_w,
    grad_b,
    p: float,
    *,
    wrap=launch_directly,
    max_fused_n: int | None = None,
    sm_count: Optional[int] = None,
) -> None:
    """Runs the backward on contiguous inputs into grad_x and (when weight/bias exist) grad_w/grad_b, under x's
    device.

    The dgamma/dbeta partials go to a (G, N) buffer in the accumulation dtype, reduced in a fixed order. G (and
    with it the bits of dgamma/dbeta) is fixed by (shape, dtype, SM count): SMs x backward_programs_per_sm on a
    GPU (sm_count: the device's, or DEFAULT_SM_COUNT for meta tensors; pass it to override), 8 on the interpreter.
    """
    n = int(x.shape[-1])
    m = x.numel() // n
    if m == 0:
        return
    t = dropout_threshold(p)
    is_fp64 = x.dtype == torch.float64
    acc = torch.float64 if is_fp64 else torch.float32
    cfg = backward_config(n, x.dtype, max_fused_n)
    has_w, has_b = weight is not None, bias is not None
    common = dict(
        HAS_W=has_w,
        HAS_B=has_b,
        DROPOUT=t != 0,
        FAST_RNG=cfg.fast_rng,
        IS_FP64=is_fp64,
        BLOCK_N=cfg.block_n,
        RTNE_BF16=INTERPRETED,
    )
    w = weight if has_w else x
    b = bias if has_b else x
    num_tiles = triton.cdiv(m, cfg.block_m)
    with device_guard(x.device):
        if cfg.fused:
            groups = num_row_groups(num_tiles, x.device, backward_programs_per_sm(cfg, x.dtype), sm_count)
        else:  # the chunk kernel's grid is (column chunks, groups): spread the SMs' programs over the chunks
            chunks = triton.cdiv(n, cfg.block_n)
            sms = sm_count if sm_count is not None else device_sm_count(x.device)
            groups = num_row_groups(
                num_tiles, x.device, 1, max(1, sms * backward_programs_per_sm(cfg, x.dtype) // chunks)
            )
        pdw = torch.empty((groups, n) if has_w else (1,), dtype=acc, device=x.device)
        pdb = torch.empty((groups, n) if has_b else (1,), dtype=acc, device=x.device)
        if cfg.fused:
            wrap(ldr_bwd_fused_kernel)[(groups,)](
                grad_out,
                x,
                w,
                b,
                mean,
                rstd,
                seed,
                grad_x,
                pdw,
                pdb,
                m,
                n,
                t,
                BLOCK_M=cfg.block_m,
                num_warps=cfg.num_warps,
                **common,
            )
        else:
            c1 = torch.empty((m,), dtype=acc, device=x.device)
            c2 = torch.empty((m,), dtype=acc, device=x.device)
            wrap(ldr_bwd_row_coef_kernel)[(m,)](
                grad_out, x, w, b, mean, rstd, seed, c1, c2, m, n, t, num_warps=num_warps_for(cfg.block_n, 8), **common
            )
            grid = (triton.cdiv(n, cfg.block_n), groups)
            wrap(ldr_bwd_chunk_kernel)[grid](
                grad_out,
                x,
                w,
                b,
                mean,
                rstd,
                seed,
                c1,
                c2,
                grad_x,
                pdw,
                pdb,
                m,
                n,
                t,
                BLOCK_M=cfg.block_m,
                num_warps=cfg.num_warps,
                **common,
            )
        if has_w:
            launch_sum_partials(pdw, grad_w, groups, n, wrap=wrap)
        if has_b:
            launch_sum_partials(pdb, grad_b, groups, n, wrap=wrap)
