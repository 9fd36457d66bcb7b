"""Triton kernels of bias-add -> activation (bias_act; bias_relu is its act 0), forward, and backward with the
dbias reduction fused, + launch helpers.

Pure ``@triton.jit`` code; the torch.library registrations are in gpuopt_ops/triton_ops.py. The activation is
the constexpr ACT (csrc/fused_math.h's codes: 0 relu, 1 gelu, 2 gelu_tanh, 3 silu), with fused_math.h's math
in fp32 (fp64 for fp64 x): z = x + b; relu: out = (z <= 0) ? 0 : z, so a NaN propagates as in torch.relu, and
grad_x = grad_out * [out > 0] from the saved output; the others recompute z from the saved x and bias:
gelu = z * (0.5 + 0.5 erf(z / sqrt 2)), gelu_tanh = z * sigmoid(2u) (= 0.5 z (1 + tanh u)), silu =
z * sigmoid(z), sigmoid(v) = 1 / (1 + exp(-v)) (fp32: the hardware's 2^x and reciprocal, within a few ulp; the
normal cdf from fused_math.h's fitted erfc form, one exponential shared with the pdf),
grad_x = grad_out * act'(z). grad_bias = sum over rows of grad_x, returned in the accumulation dtype (fp32, fp64
for fp64): AMP's fp32 bias gets the unrounded sum.

Tuning (from N on the host, no autotune):

- Forward: 2-D grid (row tiles, column tiles), tile BLOCK_M x BLOCK_N with BLOCK_N the power of two from
  min(next_pow2(N), 1024) down to 128 that pads N least (the widest of those: 256 at N = 768) and
  BLOCK_M = clamp(4096 // BLOCK_N, 1, 64) (>= 4096 elements per program), num_warps from the tile
  (4096 elements -> 8 warps, 16 per thread).
- Backward: grid (column tiles, G row groups), column tiles x G ~ SMs x resident programs per SM (from the
  registers and shared memory of the compiled kernel, common.programs_per_sm; 8 groups on the interpreter);
  program (c, g) walks row tiles g, g + G, ... of column tile c, writes grad_x and accumulates dbias
  element-wise in a [BLOCK_M, BLOCK_N] register tile reduced once at the end into a (G, N) fp32 partial buffer,
  which the parallel stage 2 ``sum_partials_kernel`` (one program per 32 columns) reduces in a fixed order.
  Deterministic: no float atomics. Every launch runs under x's device. grad_x and grad_bias come in
  uninitialised (torch.empty): every element is written (grad_bias zeroed here when M = 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from .common import (
    INTERPRETED,
    acc_dtype,
    column_groups,
    device_guard,
    device_sm_count,
    launch_directly,
    num_warps_for,
    persistent_programs,
    planned,
    programs_per_sm,
    run_sum_partials,
    sum_partials_plan,
    to_acc,
    to_out,
)
from .plans import LaunchPlan

ACT_RELU, ACT_GELU, ACT_GELU_TANH, ACT_SILU = 0, 1, 2, 3

# The compiled kernels take the hardware's approximate reciprocal, as fused_math.h's ActMath::rcp; the interpreter
# has no inline assembly and divides.
_HW_RCP = tl.constexpr(not INTERPRETED)


@triton.jit
def _rcp(v):
    """1 / v for fp32 v: rcp.approx.ftz.f32 (one MUFU.RCP, within 1 ulp; Triton's fp32 `/` is div.full.f32,
    seven more instructions of range checks and scaling an element)."""
    if _HW_RCP:
        r = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [v], dtype=tl.float32, is_pure=True, pack=1)
    else:
        r = 1.0 / v
    return r


@triton.jit
def _const(value, IS_FP64: tl.constexpr):
    """value in the accumulation dtype, exact in fp64 (a Python float literal would be an fp32 constant)."""
    return to_acc(tl.full([], value, tl.float64), IS_FP64)


@triton.jit
def _sigmoid(v, IS_FP64: tl.constexpr):
    """1 / (1 + exp(-v)); fp32 through the hardware's 2^x (tl.exp2) and reciprocal (_rcp)."""
    if IS_FP64:
        r = 1.0 / (1.0 + tl.exp(-v))
    else:
        r = _rcp(1.0 + tl.exp2(v * -1.4426950408889634))
    return r


@triton.jit
def _normal(z, IS_FP64: tl.constexpr):
    """(cdf, pdf) of the standard normal distribution at z: csrc/fused_math.h's act_normal. fp64: erf and exp;
    fp32: erfc(a) = t exp(-a^2) Q(t), a = |z| / sqrt 2, t = 1 / (1 + 0.3895 a) (the fitted Q of fused_math.h),
    the exponential shared with the pdf."""
    if IS_FP64:
        cdf = 0.5 + 0.5 * tl.math.erf(z * _const(0.70710678118654752440, IS_FP64))
        pdf = _const(0.39894228040143267794, IS_FP64) * tl.exp(-0.5 * z * z)
    else:
        w = tl.abs(z) * 0.84932180028801907  # a sqrt(log2 e): exp(-a^2) = 2^(-w^2)
        t = _rcp(1.0 + w * 0.32428002104592329)
        e = tl.exp2(-(w * w))
        q = -1.144559701e-01 * t + 4.480553714e-01
        q = q * t - 3.249990437e-01
        q = q * t + 3.299435548e-01
        q = q * t + 4.366446383e-02
        q = q * t + 1.177916199e-01
        half_erfc = q * t * e
        cdf = tl.where(z < 0.0, half_erfc, 1.0 - half_erfc)
        pdf = 0.39894228040143267794 * e
    return cdf, pdf


@triton.jit
def _gelu_tanh_arg(z, IS_FP64: tl.constexpr):
    """2u = 2 sqrt(2/pi) (z + 0.044715 z^3): 0.5 (1 + tanh u) = sigmoid(2u)."""
    return _const(1.5957691216057307118, IS_FP64) * (z + _const(0.044715, IS_FP64) * z * z * z)


@triton.jit
def act_forward(z, ACT: tl.constexpr, IS_FP64: tl.constexpr):
    if ACT == 0:
        r = tl.where(z <= 0.0, 0.0, z)
    elif ACT == 1:
        cdf, _ = _normal(z, IS_FP64)
        r = z * cdf
    elif ACT == 2:
        r = z * _sigmoid(_gelu_tanh_arg(z, IS_FP64), IS_FP64)
    else:
        r = z * _sigmoid(z, IS_FP64)
    return r


@triton.jit
def act_derivative(z, ACT: tl.constexpr, IS_FP64: tl.constexpr):
    """act'(z) for ACT 1-3 (relu's backward reads the output's mask)."""
    if ACT == 1:
        cdf, pdf = _normal(z, IS_FP64)
        r = cdf + z * pdf
    elif ACT == 2:
        s = _sigmoid(_gelu_tanh_arg(z, IS_FP64), IS_FP64)
        du = _const(1.5957691216057307118, IS_FP64) * (1.0 + _const(0.134145, IS_FP64) * z * z)
        r = s + z * s * (1.0 - s) * du
    else:
        s = _sigmoid(z, IS_FP64)
        r = s * (1.0 + z * (1.0 - s))
    return r


@triton.jit
def bias_act_fwd_kernel(
    X,  # (M, N) x
    B,  # (N,) bias, x's dtype or fp32
    OUT,  # (M, N) out, x's dtype
    M,
    N,
    IS_FP64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    RTNE_BF16: tl.constexpr,
    ACT: tl.constexpr,
):
    """out = act(x + b) in the accumulation dtype (fp32; fp64 for fp64 x), act by ACT: 0 relu (z <= 0 ? 0 : z, a NaN
    passes), 1 gelu z * cdf(z), 2 gelu_tanh z * sigmoid(2u), 3 silu z * sigmoid(z) (act_forward).

    Grid (row tiles, column tiles): a program takes one [BLOCK_M, BLOCK_N] tile."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    mask = (rows < M)[:, None] & cmask[None, :]
    offs = rows[:, None] * N + cols[None, :]
    x = to_acc(tl.load(X + offs, mask=mask, other=0.0), IS_FP64)
    b = to_acc(tl.load(B + cols, mask=cmask, other=0.0), IS_FP64)
    out = act_forward(x + b[None, :], ACT, IS_FP64)
    tl.store(OUT + offs, to_out(out, OUT, RTNE_BF16), mask=mask)


@triton.jit
def bias_act_bwd_kernel(
    DY,  # (M, N) grad_out, x's dtype
    OUT,  # (M, N) the saved tensor, x's dtype: out for ACT 0, x for the others
    DX,  # (M, N) grad_x, x's dtype
    PDB,  # (G, N) grad_bias partial rows in the accumulation dtype (fp32; fp64 for fp64), G: the grid's row groups
    M,
    N,
    IS_FP64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    RTNE_BF16: tl.constexpr,
    B,  # (N,) bias, x's dtype or fp32, for ACT 1-3; OUT again for ACT 0, never read
    ACT: tl.constexpr,
):
    """grad_x = out > 0 ? grad_out : 0 (ACT 0: the mask from the saved output) or grad_out * act'(x + b) (ACT 1-3);
    PDB[g, j] = the sum of grad_x[r, j], unrounded, over the rows r of row tiles g, g + G, ... (the grad_bias partials).

    Grid (column tiles, G row groups). OUT: the saved tensor, the output for ACT 0 (B unused: the launcher passes
    OUT), x for the others (B: the bias). Every argument is passed at every launch (Inductor's analysis of the kernel
    takes no defaults)."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    pid = tl.program_id(1)
    num_groups = tl.num_programs(1)
    cmask = cols < N
    if ACT != 0:
        b = to_acc(tl.load(B + cols, mask=cmask, other=0.0), IS_FP64)
    acc = to_acc(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IS_FP64)
    num_tiles = tl.cdiv(M, BLOCK_M)
    for tile in range(pid, num_tiles, num_groups):
        rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # < M < 2**31: no int32 overflow
        mask = (rows < M)[:, None] & cmask[None, :]
        offs = rows[:, None] * N + cols[None, :]
        g = to_acc(tl.load(DY + offs, mask=mask, other=0.0), IS_FP64)
        o = tl.load(OUT + offs, mask=mask, other=0.0)
        if ACT == 0:
            d = tl.where(o > 0.0, g, 0.0)
        else:
            d = g * act_derivative(to_acc(o, IS_FP64) + b[None, :], ACT, IS_FP64)
        tl.store(DX + offs, to_out(d, DX, RTNE_BF16), mask=mask)
        acc += d  # element-wise: one reduction over the tile's rows at the end, not one per tile
    tl.store(PDB + pid.to(tl.int64) * N + cols, tl.sum(acc, axis=0), mask=cmask)


def _tile(n: int):
    """(BLOCK_M, BLOCK_N) of the forward: the widest power-of-two column tile from min(next_pow2(N), 1024) down to
    128 that pads N least (N = 768: 256 columns, where 1024 would leave a quarter of every tile masked off), and
    4096 // BLOCK_N rows (at most 64)."""
    block_n = min(triton.next_power_of_2(n), 1024)
    best = block_n
    while block_n > 128:
        block_n //= 2
        if triton.cdiv(n, block_n) * block_n < triton.cdiv(n, best) * best:
            best = block_n
    return max(1, min(64, 4096 // best)), best


def plan_forward(x, bias, out, *, act: int = 0) -> LaunchPlan:
    """The forward's launch (launch_forward's arguments): a program a [BLOCK_M, BLOCK_N] tile (_tile), grid (row
    tiles, column tiles); nothing is sized from the device."""
    n = int(x.shape[-1])
    m = x.numel() // n
    block_m, block_n = _tile(n)
    kwargs = dict(
        IS_FP64=x.dtype == torch.float64,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        RTNE_BF16=INTERPRETED,
        ACT=act,
        num_warps=num_warps_for(block_m * block_n),
    )
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    return LaunchPlan(kernel=bias_act_fwd_kernel, grid=grid, kwargs=kwargs)


def launch_forward(x, bias, out, *, act: int = 0, wrap=launch_directly, plan: Optional[LaunchPlan] = None) -> None:
    """out = act(x + bias) (act 0: relu) for contiguous x viewed as (M, N), under x's device. `plan`:
    plan_forward's; by default kept per (M, N, dtype, act) (common.planned)."""
    n = int(x.shape[-1])
    m = x.numel() // n
    if m == 0:
        return
    if plan is None:
        plan = planned(m, ("bias_act_fwd", m, n, x.dtype, act), lambda: plan_forward(x, bias, out, act=act))
    with device_guard(x.device):
        wrap(plan.kernel)[plan.grid](x, bias, out, m, n, **plan.kwargs)


def backward_tile(n: int):
    """(BLOCK_M, BLOCK_N, num_warps) of the backward: 256 columns x up to 16 rows, 8 warps (16 per thread)."""
    block_n = min(triton.next_power_of_2(n), 256)
    block_m = max(1, min(64, 4096 // block_n))
    return block_m, block_n, num_warps_for(block_m * block_n)


@dataclass(frozen=True, kw_only=True)
class BiasActBackwardPlan:
    """The backward's launches: bias_act_bwd_kernel on `grid` (column tiles x `groups` row groups) with `kwargs`,
    writing `groups` partial rows of grad_b in `acc`, then stage 2 (`stage2`: common.sum_partials_plan)."""

    grid: tuple
    kwargs: dict
    groups: int
    acc: torch.dtype
    stage2: tuple


def plan_backward(
    grad_out, out, grad_x, grad_b, *, bias=None, act: int = 0, sm_count: Optional[int] = None, facts=None
) -> BiasActBackwardPlan:
    """The backward's launches (launch_backward's arguments): the grid (column tiles x G row groups) holds at
    most SMs x the resident programs per SM of the compiled kernel (common.programs_per_sm, asked with a
    one-element stand-in for the partial buffer: only its dtype counts), G chosen by common.column_groups so that
    the grid fills whole waves, so G, and the bits of grad_b, are fixed by (shape, dtype, device). Knobs: sm_count
    (default: the device's, DEFAULT_SM_COUNT for meta tensors), `facts` (replaces the compiled-kernel query)."""
    n = int(out.shape[-1])
    m = out.numel() // n
    is_fp64 = out.dtype == torch.float64
    acc = acc_dtype(out.dtype)
    block_m, block_n, warps = backward_tile(n)
    col_tiles = triton.cdiv(n, block_n)
    sms = sm_count if sm_count is not None else device_sm_count(out.device)
    with device_guard(out.device):
        stand_in = torch.empty((1,), dtype=acc, device=out.device)
        args = [grad_out, out, grad_x, stand_in, m, n]
        kwargs = dict(IS_FP64=is_fp64, BLOCK_M=block_m, BLOCK_N=block_n, RTNE_BF16=INTERPRETED, num_warps=warps)
        kwargs.update(B=bias if act != 0 else out, ACT=act)  # relu reads no bias
        resident = sms * programs_per_sm(bias_act_bwd_kernel, out.device, args, kwargs, facts)
    groups = persistent_programs(triton.cdiv(m, block_m), out.device, 1, column_groups(col_tiles, resident, sms))
    del kwargs["B"]  # a tensor of the call, not of the plan
    stage2 = sum_partials_plan(groups, n, 1, acc.itemsize)
    return BiasActBackwardPlan(grid=(col_tiles, groups), kwargs=kwargs, groups=groups, acc=acc, stage2=stage2)


def launch_backward(grad_out, out, grad_x, grad_b, *, bias=None, act: int = 0, wrap=launch_directly, plan=None) -> None:
    """grad_x = grad_out * [out > 0] (act 0; `out` the saved output) or grad_out * act'(out + bias) (act 1-3;
    `out` the saved x) and grad_b = its column sums (grad_b in the accumulation dtype), contiguous
    inputs into uninitialised outputs, under out's device. `plan`: plan_backward's; by default kept per (M, N,
    dtypes, act, device) (common.planned): a repeated call allocates the (G, N) partial buffer and makes its two
    launches, nothing else."""
    n = int(out.shape[-1])
    m = out.numel() // n
    if m == 0:
        grad_b.zero_()  # a sum over no rows
        return
    b = bias if act != 0 else out  # relu reads no bias
    if plan is None:
        key = ("bias_act_bwd", m, n, grad_out.dtype, out.dtype, grad_x.dtype, b.dtype, act, out.device)
        plan = planned(m, key, lambda: plan_backward(grad_out, out, grad_x, grad_b, bias=bias, act=act))
    with device_guard(out.device):
        partial = torch.empty((plan.groups * n,), dtype=plan.acc, device=out.device)
        wrap(bias_act_bwd_kernel)[plan.grid](grad_out, out, grad_x, partial, m, n, B=b, **plan.kwargs)
        run_sum_partials(partial, (grad_b,), plan.stage2, wrap=wrap)
