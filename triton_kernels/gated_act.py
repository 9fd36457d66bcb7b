"""Triton kernels of the gated activation (gated_act: out = dropout_p(act(gate) * up), SwiGLU / GeGLU / ReGLU),
forward and backward, + launch helpers.

Pure ``@triton.jit`` code; the torch.library registrations are in gpuopt_ops/triton_ops.py. The math is
csrc/fused_math.h's gated_forward_element / gated_backward_element, through bias_act.py's activation functions
(act_forward, act_derivative: the same fp32 arithmetic as bias_act, fp64 for fp64 inputs), in the accumulation
dtype:

    forward   h = act(gate) * up;  out = keep ? h * scale : 0
    backward  gh = keep ? grad_out * scale : 0;  grad_up = gh * act(gate);
              grad_gate = (gh * up) * act'(gate)   (relu: gate > 0 ? gh * up : 0, so 0 at 0 and for NaN)

ACT is a constexpr (0 relu, 1 gelu, 2 gelu_tanh, 3 silu). DROPOUT (t = round(p * 65536) > 0) is a constexpr:
without it the kernels do no RNG work and never read the seed. The keep bit of output element (r, c) is that of
linear index r * F + c (docs/DESIGN.md section 2, rows.row_keep_tile: the 8-lane Philox, or one call per element
where a tile's 8-element groups could straddle rows), in both layouts, so the one-tensor layout gives the
two-tensor layout's bits. Under a 4-element seed's shard map [seed, base, period, jump] (base, period and jump
multiples of 8) linear index i draws the bit of i + base + (i // period) * jump: MAPPED (seed.numel() == 4) is a
constexpr, the map is read with the seed, and each 8-element group maps to a whole group, still one Philox call
(rows.row_keep_tile_mapped; each element where the generic path runs); a 1-element seed compiles without it.

Layouts and launch plans (no autotune; fixed by (M, F, dtype, layout), kept per call key by common.cached_plan):

- Two tensors (PACKED=False): gate, up, out (and grad_out, grad_gate, grad_up) are contiguous and element-wise
  alike, so the kernels run flat over the M * F elements: grid (cdiv(M * F, BLOCK),), program i takes elements
  [i * BLOCK, (i + 1) * BLOCK) (int64 offsets). BLOCK = 4096 in the forward (8 warps), 2048 in the backward
  (4 warps): 16 elements a thread, i.e. 16-byte vector loads (2 per tensor for 16-bit dtypes, 4 for fp32);
  fp64 halves BLOCK. Every block starts at a multiple of 8, so the 8-lane Philox serves every F.
- One tensor (PACKED=True, gate (M, 2F) = [gate | up]): a 2-D grid (row tiles, column tiles) of
  [BLOCK_M, BLOCK_N] tiles of the (M, F) output: gate at row * 2F + c, up at row * 2F + F + c, out at
  row * F + c; the backward writes grad_gate and grad_up into one (M, 2F) tensor at those same offsets.
  BLOCK_N is the power of two from min(next_pow2(F), 1024) down to 128 (16 for F < 128) that pads F least (the
  widest of those: 256 at F = 11008, 512 at F = 13824, 1024 at F = 14336), BLOCK_M = BLOCK // BLOCK_N rows.
  Row tiles on the first grid axis (up to 2^31 - 1 programs), column tiles on the second. The 8-lane Philox
  where F % 8 == 0.
  The kernels read up (and write grad_up) through the gate (grad_gate) pointer: UP and DUP are passed (the gate,
  and the op's (0,) grad_up) but never touched, so torch.compile's analysis sees exactly one written tensor.

M = 0 launches nothing. Every launch runs under the gate's device. Every output element is written once: no sums,
so the results never depend on the launch.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .bias_act import act_derivative, act_forward
from .common import INTERPRETED, device_guard, launch_directly, num_warps_for, planned, to_acc, to_out
from .plans import LaunchPlan
from .rows import dropout_threshold, row_dropout_scale, row_keep_tile_mapped, row_load_map, row_load_seed, seed_mapped

# Elements of one program's tile: forward, backward (halved for fp64), at 16 elements a thread.
FORWARD_BLOCK = 4096
BACKWARD_BLOCK = 2048
MIN_BLOCK_N = 16


@triton.jit
def gated_tile_offsets(M, F, NUMEL, PACKED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's tile: (output offsets = dropout indices, the gate's offsets, mask, the linear index of each
    tile row's first column (int64 [BLOCK_M]), the tile's first column). Offsets only: the kernels load and store
    themselves (Inductor's analysis of the kernel then sees which pointers are written)."""
    cols = tl.arange(0, BLOCK_N)
    if PACKED:
        rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
        col0 = tl.program_id(1) * BLOCK_N
        mask = (rows < M)[:, None] & ((col0 + cols) < F)[None, :]
        base = rows * F
        offs = base[:, None] + col0 + cols[None, :]
        in_offs = (rows * (2 * F))[:, None] + col0 + cols[None, :]
    else:
        # flat: one row of BLOCK_N elements of the contiguous M * F (= NUMEL) elements
        base = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.zeros([1], dtype=tl.int64)
        col0 = 0
        offs = base[:, None] + cols[None, :]
        mask = offs < NUMEL
        in_offs = offs
    return offs, in_offs, mask, base, col0


@triton.jit
def gated_load_inputs(GATE, UP, in_offs, mask, F, PACKED: tl.constexpr, IS_FP64: tl.constexpr):
    """The tile's gate and up in the accumulation dtype: up from UP, or with PACKED from GATE's second half."""
    g = to_acc(tl.load(GATE + in_offs, mask=mask, other=0.0), IS_FP64)
    if PACKED:
        u = to_acc(tl.load(GATE + (in_offs + F), mask=mask, other=0.0), IS_FP64)
    else:
        u = to_acc(tl.load(UP + in_offs, mask=mask, other=0.0), IS_FP64)
    return g, u


@triton.jit
def gated_keep(
    SEED,
    base,
    col0,
    threshold,
    IS_FP64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FAST_RNG: tl.constexpr,
    MAPPED: tl.constexpr,
):
    """(keep bits, scale) of the tile at gated_tile_offsets' base and col0, for a launch with dropout: the seed and
    its shard map are read here (rows.row_keep_tile_mapped)."""
    seed = row_load_seed(SEED, True)
    mbase, period, jump = row_load_map(SEED, True, MAPPED)
    scale = row_dropout_scale(threshold, IS_FP64)
    keep = row_keep_tile_mapped(
        seed, base, col0, tl.arange(0, BLOCK_N), threshold, mbase, period, jump, BLOCK_M, BLOCK_N, FAST_RNG, MAPPED
    )
    return keep, scale


@triton.jit
def gated_act_fwd_kernel(
    GATE,  # (M, F) gate, or with PACKED (M, 2F) = [gate | up]
    UP,  # (M, F) up, gate's dtype; with PACKED GATE again, never read
    SEED,  # (1,) int64 seed, or (4,) with the shard map (MAPPED); read only with DROPOUT
    OUT,  # (M, F) out, gate's dtype
    M,
    F,
    NUMEL,
    threshold,
    IS_FP64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PACKED: tl.constexpr,
    DROPOUT: tl.constexpr,
    FAST_RNG: tl.constexpr,
    RTNE_BF16: tl.constexpr,
    ACT: tl.constexpr,
    MAPPED: tl.constexpr,
):
    """out = keep ? (act(gate) * up) * scale : 0, scale = 65536 / (65536 - t), in the accumulation dtype (fp32; fp64
    for fp64). PACKED: up is GATE's second half (UP is not read)."""
    offs, in_offs, mask, base, col0 = gated_tile_offsets(M, F, NUMEL, PACKED, BLOCK_M, BLOCK_N)
    g, u = gated_load_inputs(GATE, UP, in_offs, mask, F, PACKED, IS_FP64)
    h = act_forward(g, ACT, IS_FP64) * u
    if DROPOUT:
        keep, scale = gated_keep(SEED, base, col0, threshold, IS_FP64, BLOCK_M, BLOCK_N, FAST_RNG, MAPPED)
        h = tl.where(keep, h * scale, 0.0)
    tl.store(OUT + offs, to_out(h, OUT, RTNE_BF16), mask=mask)


@triton.jit
def gated_act_bwd_kernel(
    DY,  # (M, F) grad_out, gate's dtype
    GATE,  # (M, F) gate, or with PACKED (M, 2F) = [gate | up]
    UP,  # (M, F) up, gate's dtype; with PACKED GATE again, never read
    SEED,  # (1,) int64 seed, or (4,) with the shard map (MAPPED); read only with DROPOUT
    DGATE,  # (M, F) grad_gate, or with PACKED (M, 2F) = [grad_gate | grad_up]; gate's dtype
    DUP,  # (M, F) grad_up, gate's dtype; with PACKED the op's (0,) grad_up (or DGATE), never written
    M,
    F,
    NUMEL,
    threshold,
    IS_FP64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PACKED: tl.constexpr,
    DROPOUT: tl.constexpr,
    FAST_RNG: tl.constexpr,
    RTNE_BF16: tl.constexpr,
    ACT: tl.constexpr,
    MAPPED: tl.constexpr,
):
    """gh = keep ? grad_out * scale : 0; grad_up = gh * act(gate); grad_gate = (gh * up) * act'(gate) (ACT 0:
    gate > 0 ? gh * up : 0), in the accumulation dtype.

    grad_gate and grad_up in one pass from grad_out and the saved inputs (the activation and keep bits
    recomputed). PACKED: up is GATE's second half and grad_up DGATE's (UP and DUP are neither read nor written)."""
    offs, in_offs, mask, base, col0 = gated_tile_offsets(M, F, NUMEL, PACKED, BLOCK_M, BLOCK_N)
    dy = to_acc(tl.load(DY + offs, mask=mask, other=0.0), IS_FP64)
    g, u = gated_load_inputs(GATE, UP, in_offs, mask, F, PACKED, IS_FP64)
    if DROPOUT:
        keep, scale = gated_keep(SEED, base, col0, threshold, IS_FP64, BLOCK_M, BLOCK_N, FAST_RNG, MAPPED)
        gh = tl.where(keep, dy * scale, 0.0)
    else:
        gh = dy
    du = gh * act_forward(g, ACT, IS_FP64)
    if ACT == 0:
        dg = tl.where(g > 0.0, gh * u, 0.0)
    else:
        dg = (gh * u) * act_derivative(g, ACT, IS_FP64)
    tl.store(DGATE + in_offs, to_out(dg, DGATE, RTNE_BF16), mask=mask)
    if PACKED:
        tl.store(DGATE + (in_offs + F), to_out(du, DGATE, RTNE_BF16), mask=mask)
    else:
        tl.store(DUP + in_offs, to_out(du, DUP, RTNE_BF16), mask=mask)


# ------------------------------------------------------------------------------------------- launch helpers
def block_elements(dtype: torch.dtype, backward: bool) -> int:
    """Elements of one program's tile: FORWARD_BLOCK / BACKWARD_BLOCK, halved for fp64 (16 elements a thread)."""
    block = BACKWARD_BLOCK if backward else FORWARD_BLOCK
    return block // 2 if dtype == torch.float64 else block


def packed_tile(f: int, block: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of the one-tensor layout for F output columns and a `block`-element tile: BLOCK_N the
    power of two from min(next_pow2(F), 1024) down to 128 (MIN_BLOCK_N = 16 when F < 128) that pads F least (the
    widest of equals), BLOCK_M = block // BLOCK_N."""
    block_n = min(triton.next_power_of_2(f), 1024)
    best = block_n
    floor = 128 if f >= 128 else MIN_BLOCK_N
    while block_n > floor:
        block_n //= 2
        if triton.cdiv(f, block_n) * block_n < triton.cdiv(f, best) * best:
            best = block_n
    return max(1, block // best), best


def plan(
    m: int, f: int, dtype: torch.dtype, act: int, packed: bool, dropout: bool, backward: bool, mapped: bool = False
) -> tuple:
    """(grid, constexprs and num_warps) of a launch on (M, F) outputs (mapped: a 4-element seed, rows.seed_mapped)."""
    block = block_elements(dtype, backward)
    warps = num_warps_for(block)
    if mapped and packed and f % 8 != 0:
        # the generic RNG (a Philox call an element) with each element's index mapped: half the tile at the same
        # warps, 8 elements a thread, where 16 spill registers (bf16 backward, unaligned up half); bits unchanged
        block //= 2
    if packed:
        block_m, block_n = packed_tile(f, block)
        grid = (triton.cdiv(m, block_m), triton.cdiv(f, block_n))
        fast_rng = f % 8 == 0  # 8-element groups never straddle rows
    else:
        block_m, block_n = 1, block
        grid = (triton.cdiv(m * f, block),)
        fast_rng = True  # every block starts at a multiple of 8 of the flat index
    kwargs = dict(
        IS_FP64=dtype == torch.float64,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        PACKED=packed,
        DROPOUT=dropout,
        FAST_RNG=fast_rng,
        RTNE_BF16=INTERPRETED,
        ACT=act,
        MAPPED=mapped,
        num_warps=warps,
    )
    return grid, kwargs


def _rows(gate, packed: bool):
    last = int(gate.shape[-1])
    f = last // 2 if packed else last
    return gate.numel() // last if last else 0, f


def _launch_plan(gate, up, seed, p: float, act: int, backward: bool) -> LaunchPlan:
    """The launch of one direction (plan's grid and constexprs for these tensors)."""
    packed = up is None
    m, f = _rows(gate, packed)
    dropout = dropout_threshold(p) != 0
    grid, kwargs = plan(m, f, gate.dtype, act, packed, dropout, backward, seed_mapped(seed))
    return LaunchPlan(kernel=gated_act_bwd_kernel if backward else gated_act_fwd_kernel, grid=grid, kwargs=kwargs)


def plan_forward(gate, up, seed, out, p: float, *, act: int) -> LaunchPlan:
    """The forward's launch (launch_forward's arguments): nothing is sized from the device."""
    return _launch_plan(gate, up, seed, p, act, False)


def plan_backward(grad_out, gate, up, seed, grad_gate, grad_up, p: float, *, act: int) -> LaunchPlan:
    """The backward's launch (launch_backward's arguments): nothing is sized from the device."""
    return _launch_plan(gate, up, seed, p, act, True)


def _planned(gate, up, seed, p: float, act: int, backward: bool) -> LaunchPlan:
    """The default plan of a call, kept per (direction, M, F, dtype, act, layout, t > 0, mapped) (common.planned)."""
    packed = up is None
    m, f = _rows(gate, packed)
    dropout = dropout_threshold(p) != 0
    key = ("gated_act_bwd" if backward else "gated_act_fwd", m, f, gate.dtype, act, packed, dropout, seed_mapped(seed))
    rows = m if type(f) is int else None  # a symbolic F: planned every time, as a symbolic M
    return planned(rows, key, lambda: _launch_plan(gate, up, seed, p, act, backward))


def launch_forward(
    gate, up, seed, out, p: float, *, act: int, wrap=launch_directly, plan: Optional[LaunchPlan] = None
) -> None:
    """out = dropout_p(act(gate) * up) for contiguous gate (and up; None: gate is (M, 2F) = [gate | up]) into the
    contiguous (M, F) out, under gate's device. `plan`: plan_forward's; by default kept per call key."""
    m, f = _rows(gate, up is None)
    if m == 0 or f == 0:
        return
    plan = plan if plan is not None else _planned(gate, up, seed, p, act, False)
    u = gate if up is None else up  # never read when packed
    with device_guard(gate.device):
        wrap(plan.kernel)[plan.grid](gate, u, seed, out, m, f, m * f, dropout_threshold(p), **plan.kwargs)


def launch_backward(
    grad_out, gate, up, seed, grad_gate, grad_up, p: float, *, act: int, wrap=launch_directly, plan=None
) -> None:
    """grad_gate and grad_up of gated_act from contiguous grad_out (M, F), gate and up (None: gate is (M, 2F) and
    grad_gate receives [grad_gate | grad_up]; grad_up is then not written), into uninitialised outputs, under
    gate's device; one pass, one launch. `plan`: plan_backward's; by default kept per call key."""
    m, f = _rows(gate, up is None)
    if m == 0 or f == 0:
        return
    plan = plan if plan is not None else _planned(gate, up, seed, p, act, True)
    u = gate if up is None else up  # never read when packed
    du = grad_up if grad_up is not None else grad_gate  # never written when packed (grad_up is (0,) there)
    t = dropout_threshold(p)
    with device_guard(gate.device):
        wrap(plan.kernel)[plan.grid](grad_out, gate, u, seed, grad_gate, du, m, f, m * f, t, **plan.kwargs)
