"""Triton kernels of LayerNorm -> Dropout -> ReLU (forward and backward) and their launch helpers.

The same kernels are norm_dropout's, through two constexprs: RMS (RMSNorm: rstd = 1 / sqrt(mean(x^2) + eps),
xhat = x * rstd, the mean output not written; the looped forward keeps a running sum of squares; the backward has
no c2 term) and RELU (the ReLU after the dropout; without it out = keep ? y * scale : 0, dropped elements selected
to zero). layer_norm_dropout_relu launches RMS=False, RELU=True: its code is that of the kernels without the flags.

Pure ``@triton.jit`` code plus plain-Python launchers: no torch.library here (the registrations live in
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
tests): no configuration spills. Not yet timed on a GPU. Every launch runs under x's device (device_guard).

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
- Backward, wide path (ldr_bwd_wide_kernel) for N = 12288 and 16384 (not fp64): one row a tile in 4096-column
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
import triton
import triton.language as tl

from .common import (
    INTERPRETED,
    cacheable,
    cached_plan,
    device_guard,
    launch_directly,
    num_warps_for,
    to_acc,
    to_out,
)

# The jit helpers shared with dropout_add_norm are called by their own names (row_*), never through an alias:
# Inductor re-emits a triton_op kernel's helpers under each helper's __name__, so an alias would be undefined there.
from .rows import (  # noqa: F401  (LdrConfig, dropout_threshold, eps_pair, row_chunks: re-exported here)
    LdrConfig,
    dropout_threshold,
    eps_pair,
    plan_rows_backward,
    plan_rows_forward,
    row_chunks,
    row_div,
    row_dropout_scale,
    row_eps,
    row_fused_config,
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
    row_rsqrt,
    row_thread_sums,
    row_tile_offsets,
    row_tile_seed,
    row_zero_chunks,
    run_rows_backward,
    seed_mapped,
)

# Longest rows of the single-block kernels: 16 warps x 32 threads x (elements per thread, see _warps_for).
FWD_MAX_FUSED_N = 16384
# Past this, a row takes the single-block forward only when it splits into whole chunks (N = 3 x 2^k or 2^k): a
# padded chunk of next_power_of_2(N) would waste up to half the lanes and registers (past 8192: 12288, 16384).
FWD_MAX_PADDED_N = 8192
FWD_MAX_FUSED_N_FP64 = 4096
BWD_MAX_FUSED_N = 8192
BWD_MAX_FUSED_N_FP64 = 2048
# Rows the wide single-block backwards take (not fp64; backward_config), where the compiled kernel does not spill
# (else the looped kernels: wide_backward_fallback).
WIDE_BWD_N = (12288, 16384)
# Registers a thread of the wide backward may give the row it holds and its dgamma / dbeta accumulators, by
# num_warps (sm_90 compiles, triton 3.8): at 16 warps 72 (16-bit LayerNorm at 12288) and 64 (16-bit RMSNorm-dropout
# at 16384) fit, 96 (16-bit LayerNorm at 16384) spills; at 8 warps 168 and 192 (12288: an fp32 sum, fp32 x) fit,
# 224 and 256 (16384) spill, and 192 at 16384 (fp32 RMSNorm-dropout) spills 88 bytes, which the compiled kernel's
# facts catch. Past them backward_config plans the looped kernels at once, compiling no kernel known to spill.
WIDE_BWD_REGS = {16: 80, 8: 192}


# ----------------------------------------------------------------------------------------------- jit helpers
@triton.jit
def _fwd_chunk(
    y,
    w,
    b,
    seed,
    base,
    col0,
    cols,
    threshold,
    scale,
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
    keep ? y * scale : 0, the dropped elements selected to zero before the multiply."""
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
    CHUNKS: tl.constexpr,
    HOIST_PARAMS: tl.constexpr,
    EVEN_N: tl.constexpr,
    RTNE_BF16: tl.constexpr,
    RMS: tl.constexpr,
    RELU: tl.constexpr,
    MAPPED: tl.constexpr,
):
    """Single-block forward, persistent: program p takes row tiles p, p + G, ... of BLOCK_M whole rows. A row is
    one chunk of BLOCK_N >= N columns, or CHUNKS = 3 or 4 chunks of BLOCK_N = N / CHUNKS (no padded lanes at
    N = 3 x 2^k; a chunk as wide as one warp's vectors at N = 4 x 2^k, so that the rows lie along the warps and
    each thread holds more of a row). The dropout scale, 1/N and eps are computed once per program; with
    HOIST_PARAMS the weight and bias are loaded (and converted to the accumulation dtype) once per program too,
    otherwise once per tile. RMS: RMSNorm (the mean square of x, no centring; MEAN is not written); RELU: the ReLU
    after the dropout (layer_norm_dropout_relu: RMS=False, RELU=True)."""
    scale = row_dropout_scale(threshold, IS_FP64)
    inv_n = row_inv_n(N, IS_FP64)
    eps = row_eps(eps_hi, eps_lo, IS_FP64)
    cols = tl.arange(0, BLOCK_N)
    if EVEN_N:  # N == CHUNKS x BLOCK_N: no padded columns, a constant-true column mask
        cmask = cols < BLOCK_N
    else:
        cmask = cols < N
    seed0 = row_load_seed(SEED, DROPOUT)
    mbase, period, jump = row_load_map(SEED, DROPOUT, MAPPED)
    if HOIST_PARAMS:
        w0 = to_acc(row_load_param(W, 0, cols, cmask, HAS_W), IS_FP64)[None, :]
        b0 = to_acc(row_load_param(B, 0, cols, cmask, HAS_B), IS_FP64)[None, :]
        if CHUNKS > 1:  # N == CHUNKS * BLOCK_N: every chunk is full
            w1 = to_acc(row_load_param(W, BLOCK_N, cols, cmask, HAS_W), IS_FP64)[None, :]
            b1 = to_acc(row_load_param(B, BLOCK_N, cols, cmask, HAS_B), IS_FP64)[None, :]
            w2 = to_acc(row_load_param(W, 2 * BLOCK_N, cols, cmask, HAS_W), IS_FP64)[None, :]
            b2 = to_acc(row_load_param(B, 2 * BLOCK_N, cols, cmask, HAS_B), IS_FP64)[None, :]
        if CHUNKS > 3:
            w3 = to_acc(row_load_param(W, 3 * BLOCK_N, cols, cmask, HAS_W), IS_FP64)[None, :]
            b3 = to_acc(row_load_param(B, 3 * BLOCK_N, cols, cmask, HAS_B), IS_FP64)[None, :]
    num_tiles = tl.cdiv(M, BLOCK_M)
    for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # < M < 2**31: no int32 overflow
        row_mask = rows < M
        mask = row_mask[:, None] & cmask[None, :]
        base = rows * N
        seed = row_tile_seed(seed0, tile, threshold)
        rng = row_map_index(base, mbase, period, jump, MAPPED)  # each row's first dropout index
        offs = base[:, None] + cols[None, :]
        # every load of the tile before its first reduction
        x0 = to_acc(tl.load(X + offs, mask=mask, other=0.0), IS_FP64)
        if CHUNKS > 1:
            x1 = to_acc(tl.load(X + offs + BLOCK_N, mask=mask, other=0.0), IS_FP64)
            x2 = to_acc(tl.load(X + offs + 2 * BLOCK_N, mask=mask, other=0.0), IS_FP64)
        if CHUNKS > 3:
            x3 = to_acc(tl.load(X + offs + 3 * BLOCK_N, mask=mask, other=0.0), IS_FP64)
        if RMS:  # no centring: the "deviations" are x itself (masked lanes load zeros)
            d0 = x0
            if CHUNKS > 1:
                d1 = x1
                d2 = x2
            if CHUNKS > 3:
                d3 = x3
        else:
            # chunks added element-wise first: one cross-thread reduction per statistic, not one per chunk
            if CHUNKS == 4:
                mean = tl.sum(x0 + x1 + x2 + x3, axis=1) * inv_n
            elif CHUNKS == 3:
                mean = tl.sum(x0 + x1 + x2, axis=1) * inv_n
            else:
                mean = tl.sum(x0, axis=1) * inv_n
            if EVEN_N:  # masked rows load zeros and have mean 0: their deviations are 0 without a select
                d0 = x0 - mean[:, None]
            else:
                d0 = tl.where(mask, x0 - mean[:, None], 0.0)
            if CHUNKS > 1:  # every chunk full (EVEN_N)
                d1 = x1 - mean[:, None]
                d2 = x2 - mean[:, None]
            if CHUNKS > 3:
                d3 = x3 - mean[:, None]
        if CHUNKS == 4:
            q = tl.sum(d0 * d0 + d1 * d1 + d2 * d2 + d3 * d3, axis=1)
        elif CHUNKS == 3:
            q = tl.sum(d0 * d0 + d1 * d1 + d2 * d2, axis=1)
        else:
            q = tl.sum(d0 * d0, axis=1)
        rstd = row_rsqrt(q * inv_n + eps, IS_FP64)
        if not HOIST_PARAMS:
            w0 = row_load_param_tile(W, 0, cols, cmask, HAS_W, BLOCK_M)
            b0 = row_load_param_tile(B, 0, cols, cmask, HAS_B, BLOCK_M)
            if CHUNKS > 1:
                w1 = row_load_param_tile(W, BLOCK_N, cols, cmask, HAS_W, BLOCK_M)
                b1 = row_load_param_tile(B, BLOCK_N, cols, cmask, HAS_B, BLOCK_M)
                w2 = row_load_param_tile(W, 2 * BLOCK_N, cols, cmask, HAS_W, BLOCK_M)
                b2 = row_load_param_tile(B, 2 * BLOCK_N, cols, cmask, HAS_B, BLOCK_M)
            if CHUNKS > 3:
                w3 = row_load_param_tile(W, 3 * BLOCK_N, cols, cmask, HAS_W, BLOCK_M)
                b3 = row_load_param_tile(B, 3 * BLOCK_N, cols, cmask, HAS_B, BLOCK_M)
        if not RMS:
            tl.store(MEAN + rows, mean, mask=row_mask)
        tl.store(RSTD + rows, rstd, mask=row_mask)
        _fwd_store_chunk(
            OUT, offs, mask, d0, rstd, w0, b0, seed, rng, 0, cols, threshold, scale,
            HAS_W, HAS_B, DROPOUT, FAST_RNG, BLOCK_M, BLOCK_N, RTNE_BF16, RELU,
        )  # fmt: skip
        if CHUNKS > 1:
            _fwd_store_chunk(
                OUT, offs, mask, d1, rstd, w1, b1, seed, rng, BLOCK_N, cols, threshold, scale,
                HAS_W, HAS_B, DROPOUT, FAST_RNG, BLOCK_M, BLOCK_N, RTNE_BF16, RELU,
            )  # fmt: skip
            _fwd_store_chunk(
                OUT, offs, mask, d2, rstd, w2, b2, seed, rng, 2 * BLOCK_N, cols, threshold, scale,
                HAS_W, HAS_B, DROPOUT, FAST_RNG, BLOCK_M, BLOCK_N, RTNE_BF16, RELU,
            )  # fmt: skip
        if CHUNKS > 3:
            _fwd_store_chunk(
                OUT, offs, mask, d3, rstd, w3, b3, seed, rng, 3 * BLOCK_N, cols, threshold, scale,
                HAS_W, HAS_B, DROPOUT, FAST_RNG, BLOCK_M, BLOCK_N, RTNE_BF16, RELU,
            )  # fmt: skip


@triton.jit
def _fwd_store_chunk(
    OUT, offs, mask, d, rstd, w, b, seed, base, col0, cols, threshold, scale,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, DROPOUT: tl.constexpr, FAST_RNG: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, RTNE_BF16: tl.constexpr, RELU: tl.constexpr,
):  # fmt: skip
    """The output of one chunk of a single-block forward tile (deviations d from the mean, or x for RMSNorm) at
    OUT + offs + col0."""
    out = _fwd_chunk(
        d * rstd[:, None], w, b, seed, base, col0, cols, threshold, scale,
        HAS_W, HAS_B, DROPOUT, FAST_RNG, BLOCK_M, BLOCK_N, RELU,
    )  # fmt: skip
    tl.store(OUT + offs + col0, to_out(out, OUT, RTNE_BF16), mask=mask)


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
    RMS: tl.constexpr,
    RELU: tl.constexpr,
    MAPPED: tl.constexpr,
):
    """Looped forward for long rows: one row per program, BLOCK_N-column chunks, two passes over x. Pass 1 merges
    the chunks' statistics (Chan's formula for LayerNorm, the running sum of squares for RMSNorm)."""
    scale = row_dropout_scale(threshold, IS_FP64)
    seed = row_load_seed(SEED, DROPOUT)
    mbase, period, jump = row_load_map(SEED, DROPOUT, MAPPED)
    row = tl.program_id(0).to(tl.int64)
    rows = row + tl.arange(0, 1).to(tl.int64)  # [1]: the tile helpers work on [rows, cols]
    base = rows * N
    rng = row_map_index(base, mbase, period, jump, MAPPED)  # each row's first dropout index
    cols = tl.arange(0, BLOCK_N)
    mean = to_acc(tl.zeros([1], dtype=tl.float32), IS_FP64)
    m2 = to_acc(tl.zeros([1], dtype=tl.float32), IS_FP64)
    for col0 in range(0, N, BLOCK_N):
        cmask = (col0 + cols) < N
        x = to_acc(tl.load(X + base[:, None] + col0 + cols[None, :], mask=cmask[None, :], other=0.0), IS_FP64)
        if RMS:  # masked lanes load zeros
            m2 += tl.sum(x * x, axis=1)
        else:
            n_b = tl.minimum(N - col0, BLOCK_N)
            # Chan et al.: merge (col0, mean, m2) with (n_b, mean_b, m2_b); every division correctly rounded
            n_a = to_acc(col0 + tl.zeros([1], dtype=tl.int32), IS_FP64)
            n_b_f = to_acc(n_b + tl.zeros([1], dtype=tl.int32), IS_FP64)
            mean_b = row_div(tl.sum(x, axis=1), n_b_f, IS_FP64)
            d = tl.where(cmask[None, :], x - mean_b[:, None], 0.0)
            m2_b = tl.sum(d * d, axis=1)
            tot = n_a + n_b_f
            delta = mean_b - mean
            mean = mean + delta * row_div(n_b_f, tot, IS_FP64)
            m2 = m2 + m2_b + delta * delta * row_div(n_a * n_b_f, tot, IS_FP64)
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
        out = _fwd_chunk(
            xhat,
            w,
            b,
            seed,
            rng,
            col0,
            cols,
            threshold,
            scale,
            HAS_W,
            HAS_B,
            DROPOUT,
            FAST_RNG,
            1,
            BLOCK_N,
            RELU,
        )
        tl.store(OUT + offs, to_out(out, OUT, RTNE_BF16), mask=cmask[None, :])


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


# ------------------------------------------------------------------------------------------- launch helpers


def forward_config(n: int, dtype: torch.dtype, max_fused_n: int | None = None) -> LdrConfig:
    """Forward tiling: 16 elements per thread; 8 for fp64 (values take two registers) and for N % 8 != 0 (one
    Philox call per element keeps its four words live)."""
    fp64 = dtype == torch.float64
    per_thread = 8 if fp64 or n % 8 != 0 else 16
    if max_fused_n is None:
        max_fused_n = FWD_MAX_FUSED_N_FP64 if fp64 else FWD_MAX_FUSED_N
    padded_ok = n <= FWD_MAX_PADDED_N or n == triton.next_power_of_2(n) or row_chunks(n)[0] == 3
    # past 8192: rows of three chunks (12288) and of four 4096-column chunks (16384: 32 elements a thread at 16
    # warps, where 32 warps would cap the registers at 64); where that compiled kernel spills (triton 3.6's
    # bf16 LayerNorm-dropout-ReLU: 24 bytes) it runs without holding the parameters, else the looped kernel
    # (wide_fallback, plan_rows_forward)
    if n <= max_fused_n and padded_ok:
        quarters = not fp64
        return row_fused_config(n, fp64, 4096, per_thread, 4 if fp64 else 8, 4 if fp64 else 8, quarters)
    block_n = 2048 if fp64 else 4096
    block_n = max(8, min(block_n, triton.next_power_of_2(max_fused_n)))  # tests shrink max_fused_n
    return LdrConfig(False, 1, block_n, num_warps_for(block_n, per_thread), n % 8 == 0)


def wide_fallback(cfg: LdrConfig, n: int, dtype: torch.dtype) -> Optional[LdrConfig]:
    """The looped forward's config where cfg is the single-block kernel over four chunks past 8192 columns (32
    elements a thread): plan_rows_forward plans it instead where that compiled kernel spills registers."""
    if cfg.fused and cfg.chunks == 4 and n > 8192:
        return forward_config(n, dtype, max_fused_n=8192)
    return None


def backward_config(
    n: int, dtype: torch.dtype, max_fused_n: int | None = None, held: Optional[torch.dtype] = None, sums: int = 0
) -> LdrConfig:
    """Backward tiling: 8 elements per thread (4 for fp64) up to 16 warps: x, grad_out, xhat, dy, dxhat and the
    dgamma/dbeta accumulator tiles are live together. Rows of N = 2^k >= 1024 (not fp64) take one row per tile
    at 16 elements per thread (N / 512 warps: 2 at 1024 .. 16 at 8192), so that a thread holds 16 elements of
    its row and the row's reductions, address math and Philox keys are spread over twice as many elements (more
    programs, so more partial rows G, which stage 2 reads back). N in WIDE_BWD_N (12288, 16384; not fp64, default
    limits): the wide kernels, one row a tile, which hold the raw row: 4096-column chunks at 16 warps (128
    registers) where every operand they hold is 16-bit, else (held: the widest of them, default dtype; fp32 x,
    or dropout_add_norm's fp32 sum) 2048-column chunks at 8 warps (255 registers). Where the row as held (x's
    and held's bytes an element) and the `sums` accumulators (dgamma, dbeta) would take more of a thread's
    registers than WIDE_BWD_REGS allows, the looped kernels are planned at once, without compiling a kernel known
    to spill; where the compiled kernel spills all the same, plan_rows_backward takes wide_backward_fallback's
    looped kernels."""
    fp64 = dtype == torch.float64
    per_thread = 4 if fp64 else 8
    if max_fused_n is None:
        if not fp64 and n in WIDE_BWD_N:
            held = held or dtype
            wide = LdrConfig(True, 1, 4096, 16, True, n // 4096)
            if held.itemsize != 2:
                wide = LdrConfig(True, 1, 2048, 8, True, n // 2048)
            elems = n // (32 * wide.num_warps)  # of the row, a thread
            if elems * ((dtype.itemsize + held.itemsize) / 4 + sums) <= WIDE_BWD_REGS[wide.num_warps]:
                return wide
        max_fused_n = BWD_MAX_FUSED_N_FP64 if fp64 else BWD_MAX_FUSED_N
    if n <= max_fused_n:
        if not fp64 and n >= 1024 and n == triton.next_power_of_2(n):
            return LdrConfig(True, 1, n, num_warps_for(n, 16), True)
        return row_fused_config(n, fp64, 2048, per_thread, 4 if fp64 else 8, 2 if fp64 else 4)
    block_n = max(8, min(1024, triton.next_power_of_2(max_fused_n)))
    block_m = max(1, min(16, 2048 // block_n))
    return LdrConfig(False, block_m, block_n, num_warps_for(block_m * block_n, per_thread), n % 8 == 0)


def wide_kwargs(cfg: LdrConfig, dtype: torch.dtype) -> dict:
    """The wide backward kernels' own constexprs: VEC, the elements a thread holds side by side (a 16-byte vector,
    or fewer where the chunk gives a thread fewer), OPAQUE (row_hold's asm, off under the interpreter) and HOLD,
    the chunks of x (dropout_add_norm: of the sum) held across the row sums: all of them (wide_holds: fewer)."""
    per_thread = cfg.block_n // (32 * cfg.num_warps)
    return dict(VEC=max(1, min(16 // dtype.itemsize, per_thread)), OPAQUE=not INTERPRETED, HOLD=cfg.chunks)


def wide_holds(cfg: LdrConfig, n: int) -> tuple:
    """The HOLD values plan_rows_backward tries, in turn, where the compiled wide kernel holding its whole row
    spills: one chunk fewer at a time, down to half the row (the rest read again in pass 2, from L2 in the
    performance model, at half the cost of a DRAM read: re-reading half of x estimates 0.85-0.88 in the kinds
    measured, against 0.5-0.7 for the looped kernels). Empty where cfg is not the wide kernels' plan."""
    if not is_wide_backward(cfg, n):
        return ()
    return tuple(range(cfg.chunks - 1, (cfg.chunks + 1) // 2 - 1, -1))


def is_wide_backward(cfg: LdrConfig, n: int) -> bool:
    """Whether cfg, from backward_config, is the wide kernels' plan (single-block past BWD_MAX_FUSED_N)."""
    return cfg.fused and n > BWD_MAX_FUSED_N


def wide_backward_fallback(cfg: LdrConfig, n: int, dtype: torch.dtype) -> Optional[LdrConfig]:
    """The looped backward's config where cfg is the wide kernel's (past 8192 columns: N = 12288 and 16384):
    plan_rows_backward plans it instead where that compiled kernel spills registers."""
    if is_wide_backward(cfg, n):
        return backward_config(n, dtype, max_fused_n=BWD_MAX_FUSED_N)
    return None


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
    rms: bool = False,
    relu: bool = True,
    wrap=launch_directly,
    max_fused_n: int | None = None,
    sm_count: Optional[int] = None,
    facts=None,
) -> None:
    """Runs the forward on contiguous x (M, N) view into the preallocated out, mean, rstd, under x's device.

    rms / relu: norm_dropout's flags (RMSNorm instead of LayerNorm, then mean is the (0,) tensor and never
    written; the ReLU after the dropout); the defaults are layer_norm_dropout_relu.

    `wrap` is applied to each kernel before launching (torch.library.wrap_triton inside a triton_op). The
    single-block kernel is persistent: SMs x the resident programs per SM of its compiled kernel
    (common.programs_per_sm; sm_count: the device's, or DEFAULT_SM_COUNT for meta tensors; `facts` replaces the
    compiled-kernel query, as tools/triton_resources.py does), 8 programs on the interpreter.
    """
    n = int(x.shape[-1])
    m = x.numel() // n
    if m == 0:
        return
    t = dropout_threshold(p)
    eps_hi, eps_lo = eps_pair(eps)
    w = weight if weight is not None else x  # never read when HAS_W is False
    b = bias if bias is not None else x
    mu = rstd if rms else mean  # never written for RMSNorm
    mapped = seed_mapped(seed)
    args = (x, w, b, seed, out, mu, rstd, m, n, eps_hi, eps_lo, t)

    def make():
        cfg = forward_config(n, x.dtype, max_fused_n)
        kwargs = dict(
            HAS_W=weight is not None,
            HAS_B=bias is not None,
            DROPOUT=t != 0,
            FAST_RNG=cfg.fast_rng,
            IS_FP64=x.dtype == torch.float64,
            BLOCK_N=cfg.block_n,
            RTNE_BF16=INTERPRETED,
            RMS=bool(rms),
            RELU=bool(relu),
            MAPPED=mapped,
            num_warps=cfg.num_warps,
        )
        return plan_rows_forward(
            ldr_fwd_fused_kernel, ldr_fwd_looped_kernel, cfg, m, n, x.device, args, kwargs,
            sm_count=sm_count, facts=facts, looped_cfg=wide_fallback(cfg, n, x.dtype),
        )  # fmt: skip

    if cacheable(m, facts):
        key = (
            "ldr_fwd", m, n, x.dtype, w.dtype, b.dtype, out.dtype, rstd.dtype, weight is None, bias is None, t,
            bool(rms), bool(relu), mapped, x.device, sm_count, max_fused_n, tunables(),
        )  # fmt: skip
        kernel, grid, kwargs = cached_plan(key, make)
    else:
        kernel, grid, kwargs = make()
    with device_guard(x.device):
        wrap(kernel)[grid](*args, **kwargs)


def tunables() -> tuple:
    """The module's planning limits and wide_kwargs as they are now: part of every launch plan's key, so that a
    plan made under other limits (tests lower them to reach the looped kernels) is not reused."""
    return (
        FWD_MAX_FUSED_N, FWD_MAX_FUSED_N_FP64, FWD_MAX_PADDED_N, BWD_MAX_FUSED_N, BWD_MAX_FUSED_N_FP64, WIDE_BWD_N,
        wide_kwargs,
    )  # fmt: skip


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
    rms: bool = False,
    relu: bool = True,
    wrap=launch_directly,
    max_fused_n: int | None = None,
    sm_count: Optional[int] = None,
    facts=None,
) -> None:
    """Runs the backward on contiguous inputs into the uninitialised grad_x and (when weight/bias exist)
    grad_w/grad_b, under x's device. rms / relu as in launch_forward (for RMSNorm mean is never read).

    The dgamma/dbeta partials go to one buffer of two (G, N) sets in the accumulation dtype, reduced in a fixed
    order by one stage-2 launch. G (and with it the bits of dgamma/dbeta) is fixed by (shape, dtype, device): SMs x
    the resident programs per SM of the compiled persistent kernel (common.programs_per_sm; sm_count: the
    device's, or DEFAULT_SM_COUNT for meta tensors; `facts` replaces the compiled-kernel query), 8 on the
    interpreter.
    """
    n = int(x.shape[-1])
    m = x.numel() // n
    has_w, has_b = weight is not None, bias is not None
    if m == 0:  # sums over no rows
        for g in (grad_w, grad_b):
            if g is not None:
                g.zero_()
        return
    t = dropout_threshold(p)
    is_fp64 = x.dtype == torch.float64
    acc = torch.float64 if is_fp64 else torch.float32
    w = weight if has_w else x
    b = bias if has_b else x
    mu = rstd if rms else mean  # never read for RMSNorm
    mapped = seed_mapped(seed)
    head = (grad_out, x, w, b, mu, rstd, seed)

    def plan(cfg):  # (cfg, the kernels' constexprs and num_warps, the row-coefficient launch of the looped path)
        kwargs = dict(
            HAS_W=has_w,
            HAS_B=has_b,
            DROPOUT=t != 0,
            FAST_RNG=cfg.fast_rng,
            IS_FP64=is_fp64,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            RTNE_BF16=INTERPRETED,
            RMS=bool(rms),
            RELU=bool(relu),
            MAPPED=mapped,
            num_warps=cfg.num_warps,
        )
        if is_wide_backward(cfg, n):  # ldr_bwd_wide_kernel
            kwargs.update(wide_kwargs(cfg, x.dtype))
        coef_kwargs = {k: v for k, v in kwargs.items() if k not in ("BLOCK_M", "VEC", "OPAQUE")}
        coef_kwargs["num_warps"] = num_warps_for(cfg.block_n, 8)
        # ldr_bwd_row_coef_kernel(*head, c1, c2, M, N, threshold)
        return cfg, kwargs, (ldr_bwd_row_coef_kernel, range(len(head)), True, coef_kwargs)

    def make():
        cfg = backward_config(n, x.dtype, max_fused_n, sums=int(has_w) + int(has_b))
        looped = wide_backward_fallback(cfg, n, x.dtype)
        cfg, kwargs, coef = plan(cfg)
        fused = ldr_bwd_wide_kernel if is_wide_backward(cfg, n) else ldr_bwd_fused_kernel
        return plan_rows_backward(
            fused, ldr_bwd_chunk_kernel, coef, cfg, m, n, x.device, acc, head, (grad_x,), t, has_w, has_b, kwargs,
            sm_count=sm_count, facts=facts, looped=plan(looped) if looped is not None else None,
            holds=wide_holds(cfg, n),
        )  # fmt: skip

    if cacheable(m, facts):
        key = (
            "ldr_bwd", m, n, grad_out.dtype, x.dtype, w.dtype, b.dtype, rstd.dtype, grad_x.dtype, has_w, has_b, t,
            bool(rms), bool(relu), mapped, x.device, sm_count, max_fused_n, tunables(),
        )  # fmt: skip
        rows_plan = cached_plan(key, make)
    else:
        rows_plan = make()
    run_rows_backward(
        rows_plan, head, (grad_x,), grad_w if has_w else None, grad_b if has_b else None, m, n, t, x.device, acc,
        wrap=wrap,
    )  # fmt: skip
