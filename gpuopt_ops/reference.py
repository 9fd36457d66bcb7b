"""Pure-PyTorch references of the gpuopt ops, shared by the tests and the benchmarks.

The Philox4x32-10 here is a second, independent implementation of the dropout RNG of DESIGN 2 (numpy uint64
arithmetic instead of the C++ header), checked against the Random123 known-answer vectors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

import numpy as np
import torch

from .checks import ACTIVATIONS

PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(counter: Sequence[int], key: Sequence[int]) -> tuple[int, int, int, int]:
    """One Philox4x32-10 call on Python ints (for the known-answer tests)."""
    out = philox4x32_10_array(*(np.array([c], dtype=np.uint64) for c in counter), np.uint64(key[0]), np.uint64(key[1]))
    return tuple(int(w[0]) for w in out)


def philox4x32_10_array(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on arrays of uint32 values held in np.uint64 (products of two uint32 fit exactly)."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & _MASK32 for c in (c0, c1, c2, c3))
    k0, k1 = np.uint64(int(k0) & 0xFFFFFFFF), np.uint64(int(k1) & 0xFFFFFFFF)
    m0, m1 = np.uint64(PHILOX_M0), np.uint64(PHILOX_M1)
    for _ in range(10):
        p0 = m0 * c0
        p1 = m1 * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & _MASK32, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & _MASK32)
        k0 = np.uint64((int(k0) + PHILOX_W0) & 0xFFFFFFFF)
        k1 = np.uint64((int(k1) + PHILOX_W1) & 0xFFFFFFFF)
    return c0, c1, c2, c3


def dropout_threshold(p: float) -> int:
    """t = round(p * 65536), half up, identical to csrc/fused_math.h."""
    return int(min(max(math.floor(p * 65536.0 + 0.5), 0), 65536))


def dropout_scale(p: float, dtype: torch.dtype = torch.float32) -> float:
    """Scale of kept values for inputs of `dtype`: 65536 / (65536 - t) in the op's accumulation dtype (fp64 for
    fp64, else rounded to fp32), 0 when everything is dropped."""
    t = dropout_threshold(p)
    if t == 65536:
        return 0.0
    scale = 65536.0 / (65536 - t)
    return scale if dtype == torch.float64 else float(np.float32(scale))


def dropout_uniform16(seed: int, idx: np.ndarray) -> np.ndarray:
    """The 16-bit lane u of each element's linear index idx (int64 array) under `seed`."""
    idx = np.asarray(idx, dtype=np.int64)
    s = int(seed) & 0xFFFFFFFFFFFFFFFF
    g = (idx >> 3).astype(np.uint64)
    words = philox4x32_10_array(
        g & _MASK32, g >> np.uint64(32), np.zeros_like(g), np.zeros_like(g), s & 0xFFFFFFFF, s >> 32
    )
    lane = (idx & 7).astype(np.int64)
    stacked = np.stack(words)  # (4, n)
    word = np.take_along_axis(stacked, (lane >> 1)[None, :], axis=0)[0]
    return np.where(lane & 1, word >> np.uint64(16), word & np.uint64(0xFFFF)).astype(np.int64)


def dropout_keep_mask(seed, m: int, n: int, p: float, device=None) -> torch.Tensor:
    """Boolean (m, n) keep mask of the dropout of DESIGN 2.2-2.4 for the contiguous (m, n) view. seed: an int, or a seed
    tensor (1 element, or 4: a shard map, see `shard_index`)."""
    t = dropout_threshold(p)
    if t == 0:
        return torch.ones(m, n, dtype=torch.bool, device=device)
    u = dropout_uniform16(seed_value(seed), shard_index(seed, m * n))
    return torch.from_numpy(u >= t).reshape(m, n).to(device)


def _dropped(v: torch.Tensor, seed, p: float, dtype: torch.dtype) -> torch.Tensor:
    """v with the dropout of DESIGN 2 applied at each element's linear index (rows of v.shape[-1]): a kept element times
    the op's scale for inputs of `dtype` (fp32 unless fp64, whatever v's dtype), a dropped one zero."""
    n = v.shape[-1]
    keep = dropout_keep_mask(seed, v.numel() // n, n, p, device=v.device).reshape(v.shape)
    return torch.where(keep, v * dropout_scale(p, dtype), torch.zeros((), dtype=v.dtype, device=v.device))


def seed_value(seed: torch.Tensor | int) -> int:
    return int(seed.reshape(-1)[0].item()) if isinstance(seed, torch.Tensor) else int(seed)


def shard_index(seed: torch.Tensor | int, numel: int) -> np.ndarray:
    """The dropout index of each element 0 .. numel - 1 of an op's output: i itself, or under a 4-element seed
    [seed, base, period, jump] (a shard of a larger tensor) i + base + (i // period) * jump, the element's linear
    index in the whole tensor."""
    i = np.arange(numel, dtype=np.int64)
    if not isinstance(seed, torch.Tensor) or seed.numel() == 1:
        return i
    _, base, period, jump = (int(v) for v in seed.reshape(-1).tolist())
    return i + base + (i // period) * jump


def layer_norm_dropout_relu(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    seed,
    p: float,
    eps: float = 1e-5,
    compute_dtype: Optional[torch.dtype] = None,
):
    """relu(dropout(layer_norm(x) * weight + bias)) over the last dim, built from unfused PyTorch ops.

    compute_dtype=None computes in x's dtype (what plain PyTorch would do); torch.float64 gives the
    high-precision reference. Differentiable: the tests take its gradients as the reference gradients.
    Returns (out, mean, rstd) with out in compute_dtype.
    """
    return norm_dropout(x, weight, bias, seed, p, eps, rms=False, relu=True, compute_dtype=compute_dtype)


def norm_dropout(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    seed,
    p: float,
    eps: float = 1e-5,
    rms: bool = False,
    relu: bool = True,
    compute_dtype: Optional[torch.dtype] = None,
):
    """act(dropout(norm(x) * weight + bias)) over the last dim from unfused PyTorch ops: norm is LayerNorm or
    RMSNorm (rms), act ReLU (relu) or the identity. As layer_norm_dropout_relu's reference otherwise; mean is
    empty for rms."""
    y, mean, rstd = _affine_norm(x.to(compute_dtype or x.dtype), weight, bias, eps, rms)
    y = _dropped(y, seed, p, x.dtype)
    return (torch.relu(y) if relu else y), mean, rstd


def _affine_norm(xc: torch.Tensor, weight, bias, eps: float, rms: bool):
    """(norm(xc) * weight + bias, mean, rstd) over the last dim in xc's dtype: LayerNorm (two-pass variance) or
    RMSNorm (mean empty); the parameters, each optional, are cast to xc's dtype."""
    if rms:
        rstd = torch.rsqrt((xc * xc).mean(-1, keepdim=True) + eps)
        y = xc * rstd
        mean = xc.new_empty((0,))
    else:
        mu = xc.mean(-1, keepdim=True)
        rstd = torch.rsqrt(((xc - mu) ** 2).mean(-1, keepdim=True) + eps)
        y = (xc - mu) * rstd
        mean = mu.reshape(-1)
    if weight is not None:
        y = y * weight.to(xc.dtype)
    if bias is not None:
        y = y + bias.to(xc.dtype)
    return y, mean, rstd.reshape(-1)


def dropout_add_norm(
    x: torch.Tensor,
    residual: Optional[torch.Tensor],
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    seed,
    p: float,
    eps: float = 1e-5,
    rms: bool = False,
    residual_in_fp32: bool = False,
    compute_dtype: Optional[torch.dtype] = None,
):
    """norm(dropout(x) + residual) over the last dim from unfused PyTorch ops (the op's contract, DESIGN 1.6).

    s = dropout(x) + residual is computed in compute_dtype (None: x's dtype, what plain PyTorch does;
    torch.float64: the high-precision reference) and rounded to S (fp32 when residual_in_fp32 and x is fp16/bf16,
    else x's dtype), as the op stores `sum`; the norm reads that stored s. Differentiable (the rounding passes the
    gradient through). Returns (out, sum, mean, rstd): out in compute_dtype, sum in S, mean empty for rms.
    """
    dt = compute_dtype or x.dtype
    s_dtype = torch.float32 if residual_in_fp32 and x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    xc = x.to(dt)
    d = xc if dropout_threshold(p) == 0 else _dropped(xc, seed, p, x.dtype)
    s = d + residual.to(dt) if residual is not None else d
    stored = s.to(s_dtype)
    y, mean, rstd = _affine_norm(stored.to(dt), weight, bias, eps, rms)
    return y, stored, mean, rstd


def eager_dropout_add_norm(x, residual, weight, bias, p: float, training: bool = True, eps: float = 1e-5, rms=False):
    """What a user writes without gpuopt (the benchmarks' `eager` provider): torch's own dropout RNG.
    Returns (out, sum)."""
    s = torch.nn.functional.dropout(x, p, training) if p > 0 and training else x  # p = 0: a plain add + norm
    if residual is not None:
        s = s + residual
    n = (x.shape[-1],)
    if not rms:
        return torch.nn.functional.layer_norm(s, n, weight, bias, eps), s
    out = torch.nn.functional.rms_norm(s, n, weight, eps)
    out = out + bias if bias is not None else out
    return out, s


def bias_relu(x: torch.Tensor, bias: torch.Tensor, compute_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    dt = compute_dtype or x.dtype
    return torch.relu(x.to(dt) + bias.to(dt))


def bias_act(
    x: torch.Tensor, bias: torch.Tensor, act: int, compute_dtype: Optional[torch.dtype] = None
) -> torch.Tensor:
    """act(x + bias) with torch's own activations (act codes of bias_act: 0 relu, 1 gelu, 2 gelu_tanh, 3 silu)."""
    dt = compute_dtype or x.dtype
    return activation(x.to(dt) + bias.to(dt), act)


def activation(z: torch.Tensor, act: int) -> torch.Tensor:
    """torch's own activation of an act code (0 relu, 1 gelu, 2 gelu_tanh, 3 silu: `ACTIVATIONS`)."""
    if act == 0:
        return torch.relu(z)
    if act == 1:
        return torch.nn.functional.gelu(z)
    if act == 2:
        return torch.nn.functional.gelu(z, approximate="tanh")
    if act == 3:
        return torch.nn.functional.silu(z)
    raise ValueError(f"unknown act {act}")


def gated_act(
    gate: torch.Tensor,
    up: Optional[torch.Tensor],
    act: int,
    seed=0,
    p: float = 0.0,
    compute_dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    """dropout(act(gate) * up) from unfused PyTorch ops (act codes of bias_act); up None: gate holds [gate | up] in
    its last dimension. The mask is DESIGN 2.2's at the output's linear index. Differentiable."""
    dt = compute_dtype or gate.dtype
    if up is None:
        gate, up = gate.chunk(2, dim=-1)
    h = activation(gate.to(dt), act) * up.to(dt)
    if dropout_threshold(p) == 0:
        return h
    return _dropped(h, seed, p, gate.dtype)


def eager_gated_act(gate, up, act: str = "silu", p: float = 0.0, training: bool = True):
    """What a user writes without gpuopt (the benchmarks' `eager` provider): torch's activation, a multiply and
    torch's own dropout RNG."""
    if up is None:
        gate, up = gate.chunk(2, dim=-1)
    h = activation(gate, ACTIVATIONS[act]) * up
    return torch.nn.functional.dropout(h, p, training) if p > 0 and training else h


def eager_layer_norm_dropout_relu(x, weight, bias, p: float, training: bool = True, eps: float = 1e-5):
    """What a user writes without gpuopt (the benchmarks' `eager` provider); torch's own dropout RNG."""
    y = torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    return torch.relu(torch.nn.functional.dropout(y, p, training))


def eager_bias_relu(x, bias):
    return torch.relu(x + bias)
