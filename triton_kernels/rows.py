"""What the row-normalization kernels share (LayerNorm -> Dropout -> ReLU and dropout -> add -> LayerNorm/RMSNorm):
the exact arithmetic helpers (correctly rounded 1/N, rstd, divisions, eps as an fp32 pair), the dropout RNG of
docs/DESIGN.md section 2 (the fast bit-identical Philox of 8-element groups, the generic per-element path, the
per-tile seed), parameter loads, tile offsets, and the host-side dropout threshold and single-block row tiling.

Pure ``@triton.jit`` code and plain-Python helpers; the kernels using them are in norm_dropout_forward.py,
norm_dropout_backward.py and dropout_add_norm.py (norm_dropout.py's and dropout_add_norm.py's module docstrings
describe the RNG and the tiling rules).
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
    column_groups,
    device_guard,
    device_sm_count,
    kernel_facts,
    num_warps_for,
    partial_slab,
    persistent_programs,
    programs_per_sm,
    resident_programs,
    run_sum_partials,
    sum_partials_plan,
    to_acc,
)


# ----------------------------------------------------------------------------------------------- jit helpers
@triton.jit
def row_rsqrt(v, IS_FP64: tl.constexpr):
    # 1 / sqrt(v) with IEEE sqrt and division, as csrc does (acc_t(1) / std::sqrt(var + eps))
    if IS_FP64:
        r = 1.0 / tl.sqrt(v)
    else:
        r = tl.div_rn(tl.full(v.shape, 1.0, tl.float32), tl.sqrt_rn(v))
    return r


@triton.jit
def row_div(a, b, IS_FP64: tl.constexpr):
    """a / b correctly rounded (Triton's fp32 `/` compiles to the approximate div.full.f32; fp64 `/` is exact)."""
    if IS_FP64:
        q = a / b
    else:
        q = tl.div_rn(a, b)
    return q


@triton.jit
def row_inv_n(N, IS_FP64: tl.constexpr):
    """1 / N correctly rounded in the accumulation dtype: the statistics multiply by it, as the CPU fp32 kernels
    (inv_n = 1.0f / float(N)) and the CUDA kernels (inv_n = A(1) / A(N)) do."""
    if IS_FP64:
        r = 1.0 / tl.full([1], N, tl.int64).to(tl.float64)
    else:
        r = tl.div_rn(tl.full([1], 1.0, tl.float32), tl.full([1], N, tl.int32).to(tl.float32))
    return r


@triton.jit
def row_eps(eps_hi, eps_lo, IS_FP64: tl.constexpr):
    # eps_hi and eps_lo arrive as fp32 from a plain launch, as fp64 from Inductor (it types a Python float argument
    # fp64), as Python floats under the interpreter: eps_hi is exactly an fp32 value in each
    if IS_FP64:
        # fp64 [1] tensor + the scalars: exact widening, fp64 adds
        e = (tl.zeros([1], dtype=tl.float64) + eps_hi) + eps_lo
    else:
        e = tl.full([], eps_hi, tl.float32)  # exact (eps_hi is an fp32 value); a scalar: a [1] tensor spilled
    return e


@triton.jit
def row_dropout_scale(threshold, IS_FP64: tl.constexpr):
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
def _philox(seed, c0, c1):
    """Philox4x32-10 of the counter (c0, c1, 0, 0) under the key (seed lo32, seed hi32): tl.philox's rounds and
    constants (bit-identical), with each 32 x 32 -> 64-bit product taken from one widening multiply (one
    IMAD.WIDE.U32 for both halves, where tl.philox's umulhi and mul are two instructions)."""
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = (seed >> 32).to(tl.uint32)
    c2 = tl.zeros(c0.shape, dtype=tl.uint32)
    c3 = tl.zeros(c0.shape, dtype=tl.uint32)
    for _ in tl.static_range(10):
        pa = c0.to(tl.uint64) * 0xD2511F53
        pb = c2.to(tl.uint64) * 0xCD9E8D57
        c0 = (pb >> 32).to(tl.uint32) ^ c1 ^ k0
        c2 = (pa >> 32).to(tl.uint32) ^ c3 ^ k1
        c1 = pb.to(tl.uint32)
        c3 = pa.to(tl.uint32)
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@triton.jit
def _lanes_of_words(w0, w1, w2, w3, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The 16-bit lanes (int32) of the Philox words of a tile's 8-element groups, in lane order: lane k of a group is
    the low (k even) or high (k odd) half of word k // 2."""
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
def _lane_u16_fast(seed, base, col0, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Lanes u for the [BLOCK_M, BLOCK_N] tile of rows starting at linear index base (int64 [BLOCK_M], each a
    multiple of 8) and columns col0 + 0..BLOCK_N-1 (col0 a multiple of 8): one Philox call per 8 elements."""
    GROUPS: tl.constexpr = BLOCK_N // 8
    gcols = tl.arange(0, GROUPS).to(tl.int64)
    g = ((base[:, None] + col0) >> 3) + gcols[None, :]  # [BLOCK_M, GROUPS]
    c0 = g.to(tl.uint32)
    c1 = (g >> 32).to(tl.uint32)
    w0, w1, w2, w3 = _philox(seed, c0, c1)
    return _lanes_of_words(w0, w1, w2, w3, BLOCK_M, BLOCK_N)


@triton.jit
def _lane_u16_groups(seed, g, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Lanes u of the [BLOCK_M, BLOCK_N] tile whose 8-element groups are g (int64 [BLOCK_M, BLOCK_N // 8]: group
    g is the linear indices 8g .. 8g + 7): _lane_u16_fast's Philox and lane order from given groups (the mapped
    launches'). Its own Philox call rather than a call of it from _lane_u16_fast: one more level of inlining
    reorders the compiled code of the 1-element seed's kernels (ptxas then allocates some of them other
    registers)."""
    c0 = g.to(tl.uint32)
    c1 = (g >> 32).to(tl.uint32)
    w0, w1, w2, w3 = _philox(seed, c0, c1)
    return _lanes_of_words(w0, w1, w2, w3, BLOCK_M, BLOCK_N)


@triton.jit
def row_load_seed(SEED, DROPOUT: tl.constexpr):
    """The seed as uint64, read only when there is dropout (p = 0 never reads it). The persistent kernels read it
    once per program and derive each tile's seed with row_tile_seed: with a loop-invariant seed ptxas would hoist
    Philox's round keys out of the loop and keep them live, about 30 registers more per thread (fewer programs
    per SM)."""
    if DROPOUT:
        seed = tl.load(SEED).to(tl.uint64, bitcast=True)
    else:
        seed = tl.full([], 0, tl.uint64)
    return seed


@triton.jit
def row_load_map(SEED, DROPOUT: tl.constexpr, MAPPED: tl.constexpr):
    """The shard map (base, period, jump) of a 4-element seed [seed, base, period, jump] as int64 scalars, read only
    where the seed is (DROPOUT) and only for a mapped launch (MAPPED: seed.numel() == 4). Otherwise the identity
    (0, 1, 0), which row_map_index never uses: a 1-element seed's kernels load and compute nothing more."""
    if DROPOUT and MAPPED:
        mbase = tl.load(SEED + 1)
        period = tl.load(SEED + 2)
        jump = tl.load(SEED + 3)
    else:
        mbase = tl.full([], 0, tl.int64)
        period = tl.full([], 1, tl.int64)
        jump = tl.full([], 0, tl.int64)
    return mbase, period, jump


@triton.jit
def row_map_index(idx, mbase, period, jump, MAPPED: tl.constexpr):
    """The dropout index of linear index idx (int64, >= 0) of the op's output: idx itself, or under a shard map
    (row_load_map) idx + base + (idx // period) * jump, its linear index in the whole tensor (docs/DESIGN.md
    section 2). The row ops map each row's first index (base, period and jump are multiples of N: a whole row
    shifts together, and a row start stays a multiple of 8 when N is); gated_act maps each 8-element group's."""
    if MAPPED:
        r = idx + mbase + (idx // period) * jump
    else:
        r = idx
    return r


@triton.jit
def row_tile_seed(seed, tile, threshold):
    """The seed for one tile of a persistent loop, from the seed loaded once per program: the seed itself, since
    0 <= threshold <= 65536 makes threshold >> 17 zero, but written as depending on the tile, so that ptxas neither
    hoists Philox's round keys out of the loop and keeps them live (~20 registers) nor needs a load per tile (a
    uniform seed loaded inside the loop is moved to uniform registers at once: a wait of its own)."""
    return seed + (tile & (threshold >> 17)).to(tl.uint64)


@triton.jit
def row_keep_tile(
    seed, base, col0, cols, threshold, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FAST_RNG: tl.constexpr
):
    """Dropout keep bits of the [BLOCK_M, BLOCK_N] tile: rows start at linear index base, columns col0 + cols."""
    if FAST_RNG:
        u = _lane_u16_fast(seed, base, col0, BLOCK_M, BLOCK_N)
    else:
        idx = base[:, None] + col0 + cols[None, :].to(tl.int64)
        u = _lane_u16_generic(seed, idx)
    return u >= threshold


@triton.jit
def row_keep_tile_mapped(
    seed,
    base,
    col0,
    cols,
    threshold,
    mbase,
    period,
    jump,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FAST_RNG: tl.constexpr,
    MAPPED: tl.constexpr,
):
    """row_keep_tile of a tile of the flat output numbering (gated_act) under a shard map whose base, period and
    jump are multiples of 8 (row_load_map; MAPPED False: row_keep_tile itself): with FAST_RNG each 8-element group
    (its first index a multiple of 8) maps to a whole group, one Philox call; else each element is mapped."""
    if not MAPPED:
        keep = row_keep_tile(seed, base, col0, cols, threshold, BLOCK_M, BLOCK_N, FAST_RNG)
    else:
        if FAST_RNG:
            GROUPS: tl.constexpr = BLOCK_N // 8
            first = base[:, None] + col0 + tl.arange(0, GROUPS).to(tl.int64)[None, :] * 8
            g = row_map_index(first, mbase, period, jump, MAPPED) >> 3
            u = _lane_u16_groups(seed, g, BLOCK_M, BLOCK_N)
        else:
            # idx // period: each row's quotient once (64-bit), its columns' in 32 bits (where period < 2^30, the
            # rest of a row start and a column stay below 2^31; past that they cross at most one boundary):
            # a 64-bit division per element runs the division routine and spills registers
            start = base + col0
            q = start // period
            rest = (start - q * period)[:, None] + cols[None, :]  # < period + BLOCK_N
            small = period < 2**30
            rest32 = tl.where(small, rest, 0).to(tl.int32)
            period32 = tl.where(small, period, 1).to(tl.int32)
            step = tl.where(small, rest32 // period32, (rest >= period).to(tl.int32))
            idx = start[:, None] + cols[None, :] + mbase + (q[:, None] + step.to(tl.int64)) * jump
            u = _lane_u16_generic(seed, idx)
        keep = u >= threshold
    return keep


@triton.jit
def row_load_param(P, col0, cols, cmask, HAS: tl.constexpr):
    """Columns col0 + cols of a weight or bias in its storage dtype. Zeros, never read, when absent."""
    if HAS:
        v = tl.load(P + col0 + cols, mask=cmask, other=0.0)
    else:
        v = tl.zeros(cols.shape, dtype=tl.float32)
    return v


@triton.jit
def row_load_param_tile(P, col0, cols, cmask, HAS: tl.constexpr, BLOCK_M: tl.constexpr):
    """Columns col0 + cols of a weight or bias loaded for every row of a [BLOCK_M, BLOCK_N] tile, in the tile's own
    layout: per-tile parameter loads (L1 hits) then need no layout conversion through shared memory and no
    barrier, which a 1-D load broadcast over the rows costs on every tile."""
    offs = col0 + cols[None, :] + tl.zeros([BLOCK_M, 1], dtype=tl.int32)
    if HAS:
        v = tl.load(P + offs, mask=cmask[None, :], other=0.0)
    else:
        v = tl.zeros(offs.shape, dtype=tl.float32)
    return v


@triton.jit
def row_hold(v, OPAQUE: tl.constexpr):
    """v itself. With OPAQUE (compiled; the interpreter runs no asm) it passes through an identity asm the compilers
    do not look into, so that the wide backwards keep a chunk's raw loads (16-bit ones two to a register) across
    the row's reductions and convert them again after: without it the first pass's fp32 conversion is reused, and
    those values, twice the registers, are what stay live."""
    if OPAQUE:
        if v.dtype == tl.float32:
            r = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [v], dtype=v.dtype, is_pure=True, pack=1)
        else:
            r = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [v], dtype=v.dtype, is_pure=True, pack=2)
    else:
        r = v
    return r


@triton.jit
def row_thread_sums(v, BLOCK_N: tl.constexpr, VEC: tl.constexpr):
    """The [1, BLOCK_N] tile v summed VEC neighbours at a time, [BLOCK_N // VEC]: with VEC the elements a thread
    holds side by side, sums inside each thread. The wide backwards add up their chunks' such sums (a register
    or two) and reduce across the threads once per row."""
    return tl.sum(tl.reshape(v, [BLOCK_N // VEC, VEC]), axis=1)


@triton.jit
def row_load_chunk_param(P, col0, cols, HAS: tl.constexpr, CACHE: tl.constexpr):
    """Columns col0 + cols of a weight or bias as a [1, BLOCK_N] tile of a wide backward (every chunk is full: no
    mask), loaded with cache modifier CACHE; zeros, never read, when absent."""
    if HAS:
        v = tl.load(P + col0 + cols[None, :], cache_modifier=CACHE)
    else:
        v = tl.zeros([1, cols.shape[0]], dtype=tl.float32)
    return v


@triton.jit
def row_load_stats(MEAN, RSTD, rows, RMS: tl.constexpr):
    """A wide backward's row statistics (rows: [1] int64): mean (zeros, unused, for RMSNorm) and rstd."""
    if RMS:
        mean = tl.zeros([1], dtype=tl.float32)
    else:
        mean = tl.load(MEAN + rows)
    return mean, tl.load(RSTD + rows)


@triton.jit
def row_load_raw_chunks(A, B, offs, CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr, UPFRONT: tl.constexpr):
    """With UPFRONT, every chunk of one row of A and of B as loaded (tuples of CHUNKS [1, BLOCK_N] tiles, their own
    dtypes): a wide backward that holds its whole row issues all of the row's loads before any of its math.
    Without, two empty tuples: row_raw_chunk loads each chunk where pass 1 reaches it."""
    a = ()
    b = ()
    if UPFRONT:
        for c in tl.static_range(CHUNKS):
            a = a + (tl.load(A + offs + c * BLOCK_N),)
            b = b + (tl.load(B + offs + c * BLOCK_N),)
    return a, b


@triton.jit
def row_raw_chunk(A, offs, loaded, c: tl.constexpr, BLOCK_N: tl.constexpr, UPFRONT: tl.constexpr):
    """Chunk c of one row of A for a wide backward's pass 1: loaded[c] (row_load_raw_chunks), or loaded here."""
    if UPFRONT:
        v = loaded[c]
    else:
        v = tl.load(A + offs + c * BLOCK_N)
    return v


@triton.jit
def row_held_chunk(A, offs, held, c: tl.constexpr, CHUNKS: tl.constexpr, HOLD: tl.constexpr, BLOCK_N: tl.constexpr):
    """Chunk c of one row of A for a wide backward's pass 2: held (the last HOLD chunks, as pass 1 kept them), or
    read again (L1 / L2 hits: pass 1 read it just before) under a cache modifier of its own, so that the compiler
    does not merge it with pass 1's load and hold it after all."""
    if c >= CHUNKS - HOLD:
        v = held[c - (CHUNKS - HOLD)]
    else:
        v = tl.load(A + offs + c * BLOCK_N, cache_modifier=".ca")
    return v


@triton.jit
def row_zero_chunks(CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr):
    """A tuple of CHUNKS fp32 zero tiles [1, BLOCK_N]: the wide backwards' dgamma / dbeta accumulators."""
    z = ()
    for _ in tl.static_range(CHUNKS):
        z = z + (tl.zeros([1, BLOCK_N], dtype=tl.float32),)
    return z


@triton.jit
def row_held_params(
    W,
    B,
    cols,
    cmask,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    IS_FP64: tl.constexpr,
    CHUNKS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Tuples (ws, bs) of the CHUNKS chunks of the weight and the bias, each [1, BLOCK_N] in the accumulation dtype:
    loaded and converted once, to be held across a persistent loop (past one chunk, N == CHUNKS x BLOCK_N: every
    chunk full). Loaded chunk by chunk, weight then bias, the order the compiled kernels were measured in."""
    ws = ()
    bs = ()
    for c in tl.static_range(CHUNKS):
        ws = ws + (to_acc(row_load_param(W, c * BLOCK_N, cols, cmask, HAS_W), IS_FP64)[None, :],)
        bs = bs + (to_acc(row_load_param(B, c * BLOCK_N, cols, cmask, HAS_B), IS_FP64)[None, :],)
    return ws, bs


@triton.jit
def row_param_tiles(
    W,
    B,
    cols,
    cmask,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    CHUNKS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Tuples (ws, bs) of the CHUNKS chunks of the weight and the bias, each loaded for every row of a tile
    (row_load_param_tile), chunk by chunk, weight then bias."""
    ws = ()
    bs = ()
    for c in tl.static_range(CHUNKS):
        ws = ws + (row_load_param_tile(W, c * BLOCK_N, cols, cmask, HAS_W, BLOCK_M),)
        bs = bs + (row_load_param_tile(B, c * BLOCK_N, cols, cmask, HAS_B, BLOCK_M),)
    return ws, bs


@triton.jit
def row_chunks_sum(v, CHUNKS: tl.constexpr):
    """v[0] + v[1] + ... + v[CHUNKS - 1], added element-wise in that order (one cross-thread reduction after it
    instead of one per chunk)."""
    total = v[0]
    for c in tl.static_range(1, CHUNKS):
        total = total + v[c]
    return total


@triton.jit
def row_chunks_dot(a, b, CHUNKS: tl.constexpr):
    """a[0] * b[0] + a[1] * b[1] + ..., element-wise, added in chunk order."""
    total = a[0] * b[0]
    for c in tl.static_range(1, CHUNKS):
        total = total + a[c] * b[c]
    return total


@triton.jit
def row_fused_setup(N, eps_hi, eps_lo, threshold, IS_FP64: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr):
    """What a single-block forward computes once per program: the dropout scale, 1/N and eps in the accumulation
    dtype, a chunk's columns and their mask (EVEN_N: N == CHUNKS x BLOCK_N, no padded columns, a constant-true
    mask)."""
    scale = row_dropout_scale(threshold, IS_FP64)
    inv_n = row_inv_n(N, IS_FP64)
    eps = row_eps(eps_hi, eps_lo, IS_FP64)
    cols = tl.arange(0, BLOCK_N)
    if EVEN_N:
        cmask = cols < BLOCK_N
    else:
        cmask = cols < N
    return scale, inv_n, eps, cols, cmask


@triton.jit
def row_tile_rows(tile, cmask, M, N, BLOCK_M: tl.constexpr):
    """Row tile `tile` of a persistent single-block forward: its rows (int64; < M < 2**31, no int32 overflow), the
    rows' mask, the tile's element mask and each row's linear index rows * N. From the launch's sizes only, never
    from a loaded value: the kernels' store offsets come from it, and Inductor's TTIR analysis would take a
    pointer that a helper's loads feed for a written one."""
    rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_mask = rows < M
    mask = row_mask[:, None] & cmask[None, :]
    base = rows * N
    return rows, row_mask, mask, base


@triton.jit
def row_tile_rng(seed0, tile, threshold, base, mbase, period, jump, MAPPED: tl.constexpr):
    """The seed of a persistent kernel's tile (row_tile_seed) and each row's first dropout index (row_map_index)."""
    return row_tile_seed(seed0, tile, threshold), row_map_index(base, mbase, period, jump, MAPPED)


@triton.jit
def row_centred(v, mean, mask, RMS: tl.constexpr, EVEN: tl.constexpr):
    """v - mean (zero on padded columns) for LayerNorm; v itself for RMSNorm (padded columns load zeros)."""
    if RMS:
        d = v
    elif EVEN:  # every column real; masked rows load zeros and have mean 0: deviations 0 without a select
        d = v - mean[:, None]
    else:
        d = tl.where(mask, v - mean[:, None], 0.0)
    return d


@triton.jit
def row_moments(
    vs, mask, inv_n, eps, RMS: tl.constexpr, EVEN_N: tl.constexpr, IS_FP64: tl.constexpr, CHUNKS: tl.constexpr
):
    """(mean, deviations, rstd) of the rows of a single-block tile from its chunks vs (a tuple, masked lanes
    zeros): the chunks added element-wise first, one cross-thread reduction per statistic, not one per chunk.
    RMS: no centring, the deviations are vs themselves and the mean (zeros) is not used."""
    if RMS:
        mean = tl.zeros([vs[0].shape[0]], dtype=vs[0].dtype)
    else:
        mean = tl.sum(row_chunks_sum(vs, CHUNKS), axis=1) * inv_n
    ds = ()
    for c in tl.static_range(CHUNKS):
        ds = ds + (row_centred(vs[c], mean, mask, RMS, EVEN_N),)
    rstd = row_rsqrt(tl.sum(row_chunks_dot(ds, ds, CHUNKS), axis=1) * inv_n + eps, IS_FP64)
    return mean, ds, rstd


@triton.jit
def row_merge_stats(mean, m2, v, mask, col0, N, BLOCK_N: tl.constexpr, RMS: tl.constexpr, IS_FP64: tl.constexpr):
    """Pass 1 of a looped forward: a row's running statistics merged with its chunk v ([1, BLOCK_N] at columns
    col0, masked lanes zeros). RMSNorm: the sum of squares m2 (mean unchanged, unused). LayerNorm: Chan et al.'s
    merge of (col0, mean, m2) with the chunk's (n_b, mean_b, m2_b), every division correctly rounded."""
    if RMS:
        m2 += tl.sum(v * v, axis=1)
    else:
        n_b = tl.minimum(N - col0, BLOCK_N)
        n_a = to_acc(col0 + tl.zeros([1], dtype=tl.int32), IS_FP64)
        n_b_f = to_acc(n_b + tl.zeros([1], dtype=tl.int32), IS_FP64)
        mean_b = row_div(tl.sum(v, axis=1), n_b_f, IS_FP64)
        d = tl.where(mask, v - mean_b[:, None], 0.0)
        m2_b = tl.sum(d * d, axis=1)
        tot = n_a + n_b_f
        delta = mean_b - mean
        mean = mean + delta * row_div(n_b_f, tot, IS_FP64)
        m2 = m2 + m2_b + delta * delta * row_div(n_a * n_b_f, tot, IS_FP64)
    return mean, m2


@triton.jit
def row_tile_offsets(rows, row_mask, col0, cols, cmask, N):
    """Linear offsets and mask of the tile rows x (col0 + cols). Computed in the kernels themselves (not returned
    from a helper that also loads), so Inductor's TTIR analysis sees that only the output pointers are stored."""
    mask = row_mask[:, None] & cmask[None, :]
    offs = rows[:, None] * N + col0 + cols[None, :]
    return offs, mask


# ------------------------------------------------------------------------------------------- launch helpers
def dropout_threshold(p: float) -> int:
    """t = round(p * 65536) half up, clamped to 0..65536 (csrc/fused_math.h dropout_threshold)."""
    t = p * 65536.0 + 0.5
    t = min(max(t, 0.0), 65536.0)
    return int(math.floor(t))


def seed_mapped(seed: torch.Tensor) -> bool:
    """Whether the seed tensor carries a shard map ([seed, base, period, jump]: 4 elements; checks.check_seed_p
    admits 1 or 4): the kernels' MAPPED constexpr. Fixed by the seed's shape, so fake and meta seeds give it too."""
    return seed.numel() == 4


def eps_pair(eps: float):
    """eps as fp32 hi + lo: the fp32 kernels use hi (= float(eps), as csrc), the fp64 kernels hi + lo. Kept per
    Python float (a repeated call converts nothing)."""
    got = _EPS_PAIRS.get(eps) if type(eps) is float else None
    if got is None:
        hi = float(np.float32(eps))
        got = hi, float(np.float32(eps - hi))
        if type(eps) is float and len(_EPS_PAIRS) < 256:
            _EPS_PAIRS[eps] = got
    return got


_EPS_PAIRS: dict = {}


@dataclass(frozen=True, kw_only=True)
class RowTiling:
    """How a row-normalization kernel tiles its rows: the planners (forward_config, backward_config,
    row_fused_config) build it by keyword from (N, dtype) alone; the launchers add the grid from the compiled
    kernel's facts."""

    fused: bool  # single-block kernels (whole rows in registers, x read once) or the looped ones (rows in chunks)
    block_m: int  # rows a tile
    block_n: int  # columns of one chunk
    num_warps: int
    fast_rng: bool  # N % 8 == 0: a tile's Philox groups never straddle rows, one call per 8 elements
    chunks: int = 1  # chunks of block_n columns per row (single-block kernels): 1, or 3 / 4 when N = 3 x 2^k / 2^k

    @property
    def elems_per_thread(self) -> int:
        return max(1, self.block_m * self.block_n * self.chunks // (32 * self.num_warps))


def row_chunks(n: int) -> tuple[int, int]:
    """(chunks, chunk width) of a single-block row: 3 chunks of N / 3 when that is a power of two >= 8 (N = 768,
    1536, 3072, 6144: no padded lanes running Philox and the math for nothing), else one chunk of
    next_power_of_2(N)."""
    third = n // 3
    if n % 3 == 0 and third >= 8 and third & (third - 1) == 0:
        return 3, third
    return 1, triton.next_power_of_2(n)


def row_fused_config(
    n: int,
    fp64: bool,
    *,
    rows_elems: int,
    per_thread: int,
    chunk_per_thread: int,
    wide_chunk_per_thread: int,
    quarters: bool = False,
) -> RowTiling:
    """The single-block tiling: BLOCK_M = clamp(rows_elems // next_pow2(N), 1, 64) rows and num_warps for
    per_thread elements of the padded tile. 3-chunk rows keep BLOCK_M (while it fits 16 warps) and instead take
    BLOCK_M x chunk / (32 x chunk_per_thread) warps: one warp per row at N = 768, so the row statistics need no
    shared memory or barrier, and a thread's 8 elements are its own Philox group, so the lanes need no layout
    conversion either. Chunks wider than 32 x chunk_per_thread span several warps anyway; they take
    wide_chunk_per_thread (the backward halves it there: fewer registers)."""
    padded = triton.next_power_of_2(n)
    block_m = max(1, min(64, rows_elems // padded))
    chunks, block_n = row_chunks(n)
    if quarters and chunks == 1 and n == padded and n >= 128 * chunk_per_thread:
        chunks, block_n = 4, n // 4
    if chunks == 1:
        warps = num_warps_for(block_m * padded, per_thread)
        return RowTiling(fused=True, block_m=block_m, block_n=block_n, num_warps=warps, fast_rng=n % 8 == 0)
    if block_n > 32 * chunk_per_thread:
        chunk_per_thread = wide_chunk_per_thread
    block_m = max(1, min(block_m, 16 * 32 * chunk_per_thread // block_n))
    warps = max(1, min(16, block_m * block_n // (32 * chunk_per_thread)))
    return RowTiling(fused=True, block_m=block_m, block_n=block_n, num_warps=warps, fast_rng=True, chunks=chunks)


# ----------------------------------------------------------------------------------------------- launches
def plan_rows_forward(
    fused_kernel, looped_kernel, cfg, m: int, n: int, device, args, kwargs, *, sm_count, facts, looped_cfg=None
) -> tuple:
    """(kernel, grid, constexprs and num_warps) of the forward of a row-normalization op (cfg from its
    forward_config): the single-block kernel, persistent over cdiv(m, BLOCK_M) row tiles (SMs x its resident
    programs per SM: common.programs_per_sm, `facts` replacing the compiled-kernel query), or the looped kernel, a
    program a row. The single-block kernel holds weight and bias across its persistent loop (converted to the
    accumulation dtype once) for short rows (several per tile), where a tile's parameter loads and conversions are
    a large share of its work, and at 16 warps (N > 8192), where one program per SM is resident anyway; other long
    rows amortize them, and holding them would cost the registers of a resident program. looped_cfg (the widest
    rows, 32 elements a thread): where the compiled single-block kernel spills registers, it is tried again without
    holding the parameters, and where that spills too, the looped kernel runs with looped_cfg instead."""
    with device_guard(device):
        if cfg.fused:
            held = cfg.block_m > 1 or cfg.num_warps == 16
            for hoist in (held, False) if looped_cfg is not None and held else (held,):
                fused_kwargs = dict(
                    kwargs,
                    BLOCK_M=cfg.block_m,
                    CHUNKS=cfg.chunks,
                    HOIST_PARAMS=hoist,
                    EVEN_N=cfg.chunks * cfg.block_n == n,
                )
                got = kernel_facts(fused_kernel, device, args, fused_kwargs, facts)
                if looped_cfg is None or got is None or not got.spills:
                    per_sm = resident_programs(got, cfg.num_warps)
                    grid = (persistent_programs(triton.cdiv(m, cfg.block_m), device, per_sm, sm_count),)
                    return fused_kernel, grid, fused_kwargs
            kwargs = dict(kwargs, BLOCK_N=looped_cfg.block_n, FAST_RNG=looped_cfg.fast_rng)
            kwargs.update(num_warps=looped_cfg.num_warps)
    return looped_kernel, (m,), kwargs


@dataclass(frozen=True)
class RowsBackwardPlan:
    """What a row-normalization backward launches (plan_rows_backward): `kernel` (the single-block kernel, or the
    looped path's chunk kernel after `coef`, the row-coefficient launch) on `grid` with `kwargs`, the partial buffer
    of `sets` (G, N) sets `slab` elements apart (then, on the looped path, the row coefficients c1 and c2, `coef_len`
    elements each, 16-byte aligned) in one allocation of `size` elements, and stage 2 (`stage2`:
    common.sum_partials_plan; None without a weight or a bias)."""

    kernel: object
    grid: tuple
    kwargs: dict
    groups: int
    slab: int
    sets: int
    size: int
    coef: Optional[tuple]  # (kernel, head indices, with the threshold, kwargs) of the looped path
    coef_len: int
    stage2: Optional[tuple]


def plan_rows_backward(
    fused_kernel,
    chunk_kernel,
    coef,
    cfg,
    m: int,
    n: int,
    device,
    acc: torch.dtype,
    head,
    outs,
    threshold: int,
    has_w: bool,
    has_b: bool,
    kwargs,
    *,
    sm_count,
    facts,
    looped=None,
    holds=(),
) -> RowsBackwardPlan:
    """The plan of the backward launches of a row-normalization op (cfg from its backward_config; kwargs the
    kernels' constexprs and num_warps; coef: (kernel, the indices of its arguments in head, whether the threshold
    follows M and N, its kwargs), the row-coefficient launch of the looped path). The kernels take
    (*head, [c1, c2,] *outs, PDW, PDB, M, N, threshold): head the inputs, outs the gradients they write, c1 / c2
    the chunk kernel's per-row coefficients, which the coefficient kernel computes first. The single-block kernel
    is persistent over the row tiles; the chunk kernel's grid is (column chunks, groups), the SMs' programs spread
    over the chunks. The dgamma / dbeta partials go to one buffer of (groups, N) sets in the accumulation dtype,
    reduced in a fixed order by one stage-2 launch: groups, and with it the bits of dgamma / dbeta, is fixed by
    (shape, dtype, device). holds: the wide kernels' HOLD values to try in turn where the compiled kernel holding
    its whole row spills (wide_holds); looped: (cfg, kwargs, coef) of the looped kernels, run instead where the
    compiled single-block kernel of cfg spills registers all the same (the widest rows: wide_backward_fallback).
    The compiled kernels are asked with one-element stand-ins for the partial sets and the coefficients (only
    their dtype counts)."""
    sets = int(has_w) + int(has_b)
    kwargs = dict(kwargs)
    with device_guard(device):
        stand_in = torch.empty((1,), dtype=acc, device=device)
        if cfg.fused:
            kwargs["CHUNKS"] = cfg.chunks
            args = [*head, *outs, stand_in, stand_in, m, n, threshold]
            got = kernel_facts(fused_kernel, device, args, kwargs, facts)
            for hold in holds:  # a wide kernel holding less of its row, where the whole row spills
                if got is None or not got.spills:
                    break
                kwargs["HOLD"] = hold
                got = kernel_facts(fused_kernel, device, args, kwargs, facts)
            if looped is not None and got is not None and got.spills:
                cfg, kwargs, coef = looped
        num_tiles = triton.cdiv(m, cfg.block_m)
        if cfg.fused:
            kernel = fused_kernel
            groups = persistent_programs(num_tiles, device, resident_programs(got, cfg.num_warps), sm_count)
            grid = (groups,)
        else:
            kernel = chunk_kernel
            args = [*head, stand_in, stand_in, *outs, stand_in, stand_in, m, n, threshold]
            chunks = triton.cdiv(n, cfg.block_n)
            sms = sm_count if sm_count is not None else device_sm_count(device)
            resident = sms * programs_per_sm(kernel, device, args, kwargs, facts)
            groups = persistent_programs(num_tiles, device, 1, column_groups(chunks, resident, sms))
            grid = (chunks, groups)
    slab = partial_slab(groups, n)
    size = max(1, sets) * slab
    coef_len = 0
    if not cfg.fused:
        kernel_c, idx, with_t, coef_kwargs = coef
        coef = (kernel_c, (m,), tuple(idx), with_t, coef_kwargs)
        coef_len = -(-m // 4) * 4  # c2 16-byte aligned
        size += 2 * coef_len
    else:
        coef = None
    stage2 = sum_partials_plan(groups, n, sets, acc.itemsize) if sets else None
    return RowsBackwardPlan(kernel, grid, kwargs, groups, slab, sets, size, coef, coef_len, stage2)


def run_rows_backward(plan: RowsBackwardPlan, head, outs, grad_w, grad_b, m, n, threshold, device, acc, *, wrap):
    """The launches of a plan from plan_rows_backward: one allocation (the partial sets, then c1 and c2 on the
    looped path), the coefficient launch (looped path), the kernel, stage 2, under the device."""
    with device_guard(device):
        buf = torch.empty((plan.size,), dtype=acc, device=device)
        slab = plan.slab
        pdw = buf  # the first set (never written without a weight: HAS_W)
        pdb = buf[slab:] if plan.sets == 2 else buf  # never written without a bias (HAS_B)
        tail = (pdw, pdb, m, n, threshold)
        if plan.coef is not None:
            kernel_c, grid_c, idx, with_t, coef_kwargs = plan.coef
            off = max(1, plan.sets) * slab
            c1 = buf[off : off + m]
            c2 = buf[off + plan.coef_len : off + plan.coef_len + m]
            cargs = [head[i] for i in idx]
            cargs += (c1, c2, m, n, threshold) if with_t else (c1, c2, m, n)
            wrap(kernel_c)[grid_c](*cargs, **coef_kwargs)
            wrap(plan.kernel)[plan.grid](*head, c1, c2, *outs, *tail, **plan.kwargs)
        else:
            wrap(plan.kernel)[plan.grid](*head, *outs, *tail, **plan.kwargs)
        if plan.stage2 is not None:
            run_sum_partials(buf, [g for g in (grad_w, grad_b) if g is not None], plan.stage2, wrap=wrap)
