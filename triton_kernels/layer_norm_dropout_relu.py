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

from .common import (
    INTERPRETED,
    cacheable,
    cached_plan,
    device_guard,
    launch_directly,
    num_warps_for,
)
from .norm_dropout_backward import (  # noqa: F401  (the kernels: re-exported here)
    ldr_bwd_chunk_kernel,
    ldr_bwd_fused_kernel,
    ldr_bwd_row_coef_kernel,
    ldr_bwd_wide_kernel,
)
from .norm_dropout_forward import ldr_fwd_fused_kernel, ldr_fwd_looped_kernel  # noqa: F401
from .rows import (  # noqa: F401  (RowTiling, dropout_threshold, eps_pair: re-exported here)
    RowTiling,
    dropout_threshold,
    eps_pair,
    plan_rows_backward,
    plan_rows_forward,
    row_chunks,
    row_fused_config,
    run_rows_backward,
    seed_mapped,
)

# Longest rows of the single-block kernels: 16 warps x 32 threads x (elements per thread, see _warps_for).
FWD_MAX_FUSED_N = 16384
# Past this, a row takes the single-block forward only when it splits into whole chunks (N = 3 x 2^k or 2^k): a
# padded chunk of next_power_of_2(N) would waste up to half the lanes and registers (past 8192: 12288, 16384).
FWD_MAX_PADDED_N = 8192
# fp64 values take two registers each: the same registers a thread holds at 16384 fp32 columns hold 4096 fp64 ones
# at 8 elements a thread (the forward's fp64 per_thread).
FWD_MAX_FUSED_N_FP64 = 4096
# The backward holds x, grad_out, xhat, dy, dxhat and the dgamma / dbeta tiles together: at 8 elements a thread and
# 16 warps a row of 8192 columns is the longest that fits (the wide kernels hold less and take 12288 and 16384).
BWD_MAX_FUSED_N = 8192
# fp64: 4 elements a thread at 16 warps, half the fp32 row for the same registers.
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


# ------------------------------------------------------------------------------------------- launch helpers


def forward_config(n: int, dtype: torch.dtype, max_fused_n: int | None = None) -> RowTiling:
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
        return row_fused_config(
            n,
            fp64,
            rows_elems=4096,  # a tile of ~4096 elements: several short rows per program
            per_thread=per_thread,
            chunk_per_thread=4 if fp64 else 8,  # 3-chunk rows: one warp per row at N = 768
            wide_chunk_per_thread=4 if fp64 else 8,
            quarters=not fp64,  # N = 2^k >= 1024: four chunks, the row's warps along it
        )
    block_n = 2048 if fp64 else 4096
    block_n = max(8, min(block_n, triton.next_power_of_2(max_fused_n)))  # tests shrink max_fused_n
    return RowTiling(
        fused=False, block_m=1, block_n=block_n, num_warps=num_warps_for(block_n, per_thread), fast_rng=n % 8 == 0
    )


def wide_fallback(cfg: RowTiling, n: int, dtype: torch.dtype) -> Optional[RowTiling]:
    """The looped forward's config where cfg is the single-block kernel over four chunks past 8192 columns (32
    elements a thread): plan_rows_forward plans it instead where that compiled kernel spills registers."""
    if cfg.fused and cfg.chunks == 4 and n > 8192:
        return forward_config(n, dtype, max_fused_n=8192)
    return None


def backward_config(
    n: int, dtype: torch.dtype, max_fused_n: int | None = None, held: Optional[torch.dtype] = None, sums: int = 0
) -> RowTiling:
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
            wide = RowTiling(fused=True, block_m=1, block_n=4096, num_warps=16, fast_rng=True, chunks=n // 4096)
            if held.itemsize != 2:
                wide = RowTiling(fused=True, block_m=1, block_n=2048, num_warps=8, fast_rng=True, chunks=n // 2048)
            elems = n // (32 * wide.num_warps)  # of the row, a thread
            if elems * ((dtype.itemsize + held.itemsize) / 4 + sums) <= WIDE_BWD_REGS[wide.num_warps]:
                return wide
        max_fused_n = BWD_MAX_FUSED_N_FP64 if fp64 else BWD_MAX_FUSED_N
    if n <= max_fused_n:
        if not fp64 and n >= 1024 and n == triton.next_power_of_2(n):
            return RowTiling(fused=True, block_m=1, block_n=n, num_warps=num_warps_for(n, 16), fast_rng=True)
        return row_fused_config(
            n,
            fp64,
            rows_elems=2048,  # half the forward's tile: five operands live per element
            per_thread=per_thread,
            chunk_per_thread=4 if fp64 else 8,  # 3-chunk rows: one warp per row at N = 768
            wide_chunk_per_thread=2 if fp64 else 4,  # chunks spanning several warps: fewer registers
        )
    block_n = max(8, min(1024, triton.next_power_of_2(max_fused_n)))
    block_m = max(1, min(16, 2048 // block_n))
    warps = num_warps_for(block_m * block_n, per_thread)
    return RowTiling(fused=False, block_m=block_m, block_n=block_n, num_warps=warps, fast_rng=n % 8 == 0)


def wide_kwargs(cfg: RowTiling, dtype: torch.dtype) -> dict:
    """The wide backward kernels' own constexprs: VEC, the elements a thread holds side by side (a 16-byte vector,
    or fewer where the chunk gives a thread fewer), OPAQUE (row_hold's asm, off under the interpreter) and HOLD,
    the chunks of x (dropout_add_norm: of the sum) held across the row sums: all of them (wide_holds: fewer)."""
    per_thread = cfg.block_n // (32 * cfg.num_warps)
    return dict(VEC=max(1, min(16 // dtype.itemsize, per_thread)), OPAQUE=not INTERPRETED, HOLD=cfg.chunks)


def wide_holds(cfg: RowTiling, n: int) -> tuple:
    """The HOLD values plan_rows_backward tries, in turn, where the compiled wide kernel holding its whole row
    spills: one chunk fewer at a time, down to half the row (the rest read again in pass 2, from L2 in the
    performance model, at half the cost of a DRAM read: re-reading half of x estimates 0.85-0.88 in the kinds
    measured, against 0.5-0.7 for the looped kernels). Empty where cfg is not the wide kernels' plan."""
    if not is_wide_backward(cfg, n):
        return ()
    return tuple(range(cfg.chunks - 1, (cfg.chunks + 1) // 2 - 1, -1))


def is_wide_backward(cfg: RowTiling, n: int) -> bool:
    """Whether cfg, from backward_config, is the wide kernels' plan (single-block past BWD_MAX_FUSED_N)."""
    return cfg.fused and n > BWD_MAX_FUSED_N


def wide_backward_fallback(cfg: RowTiling, n: int, dtype: torch.dtype) -> Optional[RowTiling]:
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
