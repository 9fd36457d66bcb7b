"""Triton kernels of bias-add -> ReLU (forward, and backward with the dbias reduction fused) + launch helpers.

Pure ``@triton.jit`` code; the torch.library registrations are in gpuopt_ops/triton_ops.py. Math of
csrc/fused_math.h: out = (x + b <= 0) ? 0 : x + b in fp32 (fp64 for fp64 x), so a NaN propagates as in
torch.relu; grad_x = grad_out * [out > 0]; grad_bias = sum over rows of grad_x, returned in the accumulation
dtype (fp32, fp64 for fp64): AMP's fp32 bias gets the unrounded sum.

Tuning (from N on the host, no autotune):

- Forward: 2-D grid (row tiles, column tiles), tile BLOCK_M x BLOCK_N with BLOCK_N = min(next_pow2(N), 1024)
  and BLOCK_M = clamp(4096 // BLOCK_N, 1, 64) (>= 4096 elements per program), num_warps from the tile
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

from typing import Optional

import torch
import triton
import triton.language as tl

from .common import (
    INTERPRETED,
    column_groups,
    device_guard,
    device_sm_count,
    launch_directly,
    launch_sum_partials,
    num_warps_for,
    persistent_programs,
    programs_per_sm,
    to_acc,
    to_out,
)


@triton.jit
def bias_relu_fwd_kernel(
    X, B, OUT, M, N, IS_FP64: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, RTNE_BF16: tl.constexpr
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    mask = (rows < M)[:, None] & cmask[None, :]
    offs = rows[:, None] * N + cols[None, :]
    x = to_acc(tl.load(X + offs, mask=mask, other=0.0), IS_FP64)
    b = to_acc(tl.load(B + cols, mask=cmask, other=0.0), IS_FP64)
    y = x + b[None, :]
    out = tl.where(y <= 0.0, 0.0, y)
    tl.store(OUT + offs, to_out(out, OUT, RTNE_BF16), mask=mask)


@triton.jit
def bias_relu_bwd_kernel(
    DY, OUT, DX, PDB, M, N, IS_FP64: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, RTNE_BF16: tl.constexpr
):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    pid = tl.program_id(1)
    num_groups = tl.num_programs(1)
    cmask = cols < N
    acc = to_acc(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IS_FP64)
    num_tiles = tl.cdiv(M, BLOCK_M)
    for tile in range(pid, num_tiles, num_groups):
        rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # < M < 2**31: no int32 overflow
        mask = (rows < M)[:, None] & cmask[None, :]
        offs = rows[:, None] * N + cols[None, :]
        g = to_acc(tl.load(DY + offs, mask=mask, other=0.0), IS_FP64)
        o = tl.load(OUT + offs, mask=mask, other=0.0)
        d = tl.where(o > 0.0, g, 0.0)
        tl.store(DX + offs, to_out(d, DX, RTNE_BF16), mask=mask)
        acc += d  # element-wise: one reduction over the tile's rows at the end, not one per tile
    tl.store(PDB + pid.to(tl.int64) * N + cols, tl.sum(acc, axis=0), mask=cmask)


def _tile(n: int):
    block_n = min(triton.next_power_of_2(n), 1024)
    block_m = max(1, min(64, 4096 // block_n))
    return block_m, block_n


def launch_forward(x, bias, out, *, wrap=launch_directly, sm_count: Optional[int] = None, facts=None) -> None:
    """out = relu(x + bias) for contiguous x viewed as (M, N), under x's device (sm_count and facts unused: one
    program per tile)."""
    n = int(x.shape[-1])
    m = x.numel() // n
    if m == 0:
        return
    block_m, block_n = _tile(n)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    with device_guard(x.device):
        wrap(bias_relu_fwd_kernel)[grid](
            x,
            bias,
            out,
            m,
            n,
            IS_FP64=x.dtype == torch.float64,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            RTNE_BF16=INTERPRETED,
            num_warps=num_warps_for(block_m * block_n),
        )


def backward_tile(n: int):
    """(BLOCK_M, BLOCK_N, num_warps) of the backward: 256 columns x up to 16 rows, 8 warps (16 per thread)."""
    block_n = min(triton.next_power_of_2(n), 256)
    block_m = max(1, min(64, 4096 // block_n))
    return block_m, block_n, num_warps_for(block_m * block_n)


def launch_backward(
    grad_out, out, grad_x, grad_b, *, wrap=launch_directly, sm_count: Optional[int] = None, facts=None
) -> None:
    """grad_x = grad_out * [out > 0] and grad_b = its column sums (grad_b in the accumulation dtype), contiguous
    inputs into uninitialised outputs, under out's device. The grid (column tiles x G row groups) holds at most SMs x
    the resident programs per SM of the compiled kernel (common.programs_per_sm; sm_count: the device's,
    DEFAULT_SM_COUNT for meta tensors), G chosen by common.column_groups so that the grid fills whole waves, so
    G, and the bits of grad_b, are fixed by (shape, dtype, device)."""
    n = int(out.shape[-1])
    m = out.numel() // n
    if m == 0:
        grad_b.zero_()  # a sum over no rows
        return
    is_fp64 = out.dtype == torch.float64
    block_m, block_n, warps = backward_tile(n)
    col_tiles = triton.cdiv(n, block_n)
    sms = sm_count if sm_count is not None else device_sm_count(out.device)
    with device_guard(out.device):
        partial = torch.empty((n,), dtype=torch.float64 if is_fp64 else torch.float32, device=out.device)
        args = [grad_out, out, grad_x, partial, m, n]
        kwargs = dict(IS_FP64=is_fp64, BLOCK_M=block_m, BLOCK_N=block_n, RTNE_BF16=INTERPRETED, num_warps=warps)
        resident = sms * programs_per_sm(bias_relu_bwd_kernel, out.device, args, kwargs, facts)
        groups = persistent_programs(triton.cdiv(m, block_m), out.device, 1, column_groups(col_tiles, resident, sms))
        args[3] = partial = torch.empty((groups, n), dtype=partial.dtype, device=out.device)
        wrap(bias_relu_bwd_kernel)[(col_tiles, groups)](*args, **kwargs)
        launch_sum_partials(partial, (grad_b,), groups, n, wrap=wrap)
