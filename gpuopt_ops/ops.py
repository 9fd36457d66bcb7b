"""Fake kernels and autograd of the C++/CUDA ops, and the typed public functions."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional, Union

import torch

from . import autograd as A
from . import checks as V
from . import dtensor
from .backends import resolve_backend
from .checks import ACTIVATIONS

_ops = torch.ops.gpuopt


# ---------------------------------------------------------------------------------------------- fake kernels
@torch.library.register_fake("gpuopt::layer_norm_dropout_relu")
def _ldr_fake(x, weight, bias, seed, p, eps):
    m, _, _ = V.check_ldr_forward(x, weight, bias, seed, p, eps)
    acc = V.acc_dtype(x.dtype)
    return (
        torch.empty_like(x, memory_format=torch.contiguous_format),
        x.new_empty((m,), dtype=acc),
        x.new_empty((m,), dtype=acc),
    )


@torch.library.register_fake("gpuopt::layer_norm_dropout_relu_backward")
def _ldr_backward_fake(grad_out, x, weight, bias, mean, rstd, seed, p):
    _, n, param_dtype = V.check_ldr_backward(grad_out, x, weight, bias, mean, rstd, seed, p)
    grad_w = x.new_empty((n,) if weight is not None else (0,), dtype=param_dtype)
    grad_b = x.new_empty((n,) if bias is not None else (0,), dtype=param_dtype)
    return torch.empty_like(x, memory_format=torch.contiguous_format), grad_w, grad_b


@torch.library.register_fake("gpuopt::norm_dropout")
def _nd_fake(x, weight, bias, seed, p, eps, rms, relu):
    m, _, _ = V.check_norm_dropout(x, weight, bias, seed, p, eps, rms, relu)
    acc = V.acc_dtype(x.dtype)
    return (
        torch.empty_like(x, memory_format=torch.contiguous_format),
        x.new_empty((0,) if rms else (m,), dtype=acc),
        x.new_empty((m,), dtype=acc),
    )


@torch.library.register_fake("gpuopt::norm_dropout_backward")
def _nd_backward_fake(grad_out, x, weight, bias, mean, rstd, seed, p, rms, relu):
    _, n, param_dtype = V.check_norm_dropout_backward(grad_out, x, weight, bias, mean, rstd, seed, p, rms, relu)
    grad_w = x.new_empty((n,) if weight is not None else (0,), dtype=param_dtype)
    grad_b = x.new_empty((n,) if bias is not None else (0,), dtype=param_dtype)
    return torch.empty_like(x, memory_format=torch.contiguous_format), grad_w, grad_b


@torch.library.register_fake("gpuopt::bias_relu")
def _bias_relu_fake(x, bias):
    V.check_bias_relu(x, bias)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("gpuopt::bias_relu_backward")
def _bias_relu_backward_fake(grad_out, out):
    _, n = V.check_bias_relu_backward(grad_out, out)
    return torch.empty_like(out, memory_format=torch.contiguous_format), out.new_empty(
        (n,), dtype=V.acc_dtype(out.dtype)
    )


@torch.library.register_fake("gpuopt::dropout_add_norm")
def _dan_fake(x, residual, weight, bias, seed, p, eps, rms, residual_in_fp32):
    m, _, _, s_dtype = V.check_dropout_add_norm(x, residual, weight, bias, seed, p, eps, rms, residual_in_fp32)
    acc = V.acc_dtype(x.dtype)
    return (
        torch.empty_like(x, memory_format=torch.contiguous_format),
        torch.empty_like(x, dtype=s_dtype, memory_format=torch.contiguous_format),
        x.new_empty((0,) if rms else (m,), dtype=acc),
        x.new_empty((m,), dtype=acc),
    )


@torch.library.register_fake("gpuopt::dropout_add_norm_backward")
def _dan_backward_fake(grad_out, grad_sum, sum, weight, bias, mean, rstd, seed, p, rms, has_residual):
    _, n, param_dtype, s_dtype = V.check_dropout_add_norm_backward(
        grad_out, grad_sum, sum, weight, bias, mean, rstd, seed, p, rms, has_residual
    )
    grad_res = (
        torch.empty_like(grad_out, dtype=s_dtype, memory_format=torch.contiguous_format)
        if has_residual
        else grad_out.new_empty((0,), dtype=s_dtype)
    )
    return (
        torch.empty_like(grad_out, memory_format=torch.contiguous_format),
        grad_res,
        grad_out.new_empty((n,) if weight is not None else (0,), dtype=param_dtype),
        grad_out.new_empty((n,) if bias is not None else (0,), dtype=param_dtype),
    )


@torch.library.register_fake("gpuopt::bias_act")
def _bias_act_fake(x, bias, act):
    V.check_bias_act(x, bias, act)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("gpuopt::bias_act_backward")
def _bias_act_backward_fake(grad_out, saved, bias, act):
    _, n = V.check_bias_act_backward(grad_out, saved, bias, act)
    return torch.empty_like(saved, memory_format=torch.contiguous_format), saved.new_empty(
        (n,), dtype=V.acc_dtype(saved.dtype)
    )


@torch.library.register_fake("gpuopt::gated_act")
def _gated_act_fake(gate, up, seed, p, act):
    _, f = V.check_gated_act(gate, up, seed, p, act)
    return gate.new_empty((*gate.shape[:-1], f))


@torch.library.register_fake("gpuopt::gated_act_backward")
def _gated_act_backward_fake(grad_out, gate, up, seed, p, act):
    V.check_gated_act_backward(grad_out, gate, up, seed, p, act)
    grad_up = gate.new_empty((0,)) if up is None else torch.empty_like(up, memory_format=torch.contiguous_format)
    return torch.empty_like(gate, memory_format=torch.contiguous_format), grad_up


# ---------------------------------------------------------------------------------------------- autograd
A.register_ldr_autograd("gpuopt::layer_norm_dropout_relu", _ops.layer_norm_dropout_relu_backward)
A.register_norm_dropout_autograd("gpuopt::norm_dropout", _ops.norm_dropout_backward)
A.register_dropout_add_norm_autograd("gpuopt::dropout_add_norm", _ops.dropout_add_norm_backward)
A.register_bias_relu_autograd("gpuopt::bias_relu", _ops.bias_relu_backward)
A.register_bias_act_autograd("gpuopt::bias_act", _ops.bias_act_backward)
A.register_gated_act_autograd("gpuopt::gated_act", _ops.gated_act_backward)


# ---------------------------------------------------------------------------------------------- public API
def _triton_ops():
    from . import triton_ops  # imported lazily: triton is optional

    return triton_ops


def _flatten_normalized(x: torch.Tensor, normalized_shape, weight, bias):
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    normalized_shape = tuple(normalized_shape)
    k = len(normalized_shape)
    if k == 0 or x.dim() < k or tuple(x.shape[x.dim() - k :]) != normalized_shape:
        raise ValueError(
            f"gpuopt.layer_norm_dropout_relu: normalized_shape {normalized_shape} must be the "
            f"trailing dimensions of x, got x of shape {tuple(x.shape)}"
        )
    n = math.prod(normalized_shape)
    x2 = x if k == 1 else x.reshape(*x.shape[: x.dim() - k], n)
    w = weight.reshape(n) if weight is not None and k > 1 else weight
    b = bias.reshape(n) if bias is not None and k > 1 else bias
    return x2, w, b


SEED_HIGH = 2**62  # seeds are drawn from [0, 2**62)


def draw_seed(device: torch.device, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """A dropout seed drawn from torch's generator on `device`, as a 1-element int64 tensor on that device.

    Drawn on the device itself: no host sync, and CUDA graphs replay a new draw each time.
    """
    return torch.randint(0, SEED_HIGH, (1,), device=device, dtype=torch.int64, generator=generator)


def layer_norm_dropout_relu(
    x: torch.Tensor,
    normalized_shape: Union[int, Sequence[int]],
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    p: float = 0.1,
    training: bool = True,
    eps: float = 1e-5,
    generator: Optional[torch.Generator] = None,
    backend: str = "auto",
) -> torch.Tensor:
    """relu(dropout(layer_norm(x, normalized_shape, weight, bias, eps), p)) in one fused kernel.

    Dropout keeps an element with probability 1 - p quantized to a multiple of 2**-16 (DESIGN 2.3) and is
    off when training=False. The dropout seed is drawn from `generator` (default: torch's default generator
    on x's device), so torch.manual_seed reproduces a run.
    """
    backend = resolve_backend(backend, x.device, "layer_norm_dropout_relu")
    x2, w, b = _flatten_normalized(x, normalized_shape, weight, bias)
    p_eff, seed = _dropout_seed(x2, p, training, generator, "layer_norm_dropout_relu", x2.shape[-1])
    op = _triton_ops().triton_layer_norm_dropout_relu if backend == "triton" else _ops.layer_norm_dropout_relu
    out, _, _ = op(x2, w, b, seed, p_eff, float(eps))
    return out.view(x.shape) if out.shape != x.shape else out


def _dropout_seed(
    x: torch.Tensor, p: float, training: bool, generator, op: str, unit: int, out_shape=None, last_ok=False
) -> tuple[float, torch.Tensor]:
    """(p in effect, the seed): a fresh seed when dropping (training and p > 0), else a zero tensor. For a DTensor
    x the zero seed is a replicated DTensor on x's mesh, and a fresh one a shard seed (gpuopt_ops.dtensor:
    each rank's seed and the numbering of its box, so each shard draws the whole tensor's masks)."""
    p_eff = float(p) if training else 0.0
    zero = torch.zeros(1, dtype=torch.int64, device=x.device)
    if not dtensor.is_dtensor(x):
        return p_eff, draw_seed(x.device, generator) if p_eff > 0.0 else zero
    if p_eff == 0.0:
        return p_eff, dtensor.replicated_like(x, zero)
    drawn = dtensor.replicated_like(x, draw_seed(x.device, generator))
    return p_eff, dtensor.shard_seed(op, x, drawn, unit, out_shape, last_ok)


NORMS = ("layer", "rms")
NORM_ACTIVATIONS = (None, "relu")  # norm_dropout's activation after the dropout


def norm_dropout(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    *,
    norm: str = "layer",
    activation: Optional[str] = None,
    p: float = 0.0,
    training: bool = True,
    eps: float = 1e-5,
    generator: Optional[torch.Generator] = None,
    backend: str = "auto",
) -> torch.Tensor:
    """act(dropout(norm(x) * weight + bias, p)) over the last dimension in one fused kernel: norm = "layer"
    (LayerNorm) or "rms" (RMSNorm), activation None (identity) or "relu"; weight and bias of shape
    (x.shape[-1],), each optional. norm="layer", activation="relu" is layer_norm_dropout_relu, bit for bit.

    Dropout keeps an element with probability 1 - p quantized to a multiple of 2**-16 (DESIGN 2.3) and is off
    when training=False; the seed is drawn from `generator` as in layer_norm_dropout_relu (same seed, same mask).
    """
    if norm not in NORMS:
        raise ValueError(f"gpuopt.norm_dropout: norm must be one of {NORMS}, got {norm!r}")
    if activation not in NORM_ACTIVATIONS:
        raise ValueError(f"gpuopt.norm_dropout: activation must be None or 'relu', got {activation!r}")
    backend = resolve_backend(backend, x.device, "norm_dropout")
    p_eff, seed = _dropout_seed(x, p, training, generator, "norm_dropout", x.shape[-1])
    op = _triton_ops().triton_norm_dropout if backend == "triton" else _ops.norm_dropout
    out, _, _ = op(x, weight, bias, seed, p_eff, float(eps), norm == "rms", activation == "relu")
    return out


def bias_relu(x: torch.Tensor, bias: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """relu(x + bias), bias of shape (x.shape[-1],) broadcast over the rows; backward fuses the dbias sum."""
    backend = resolve_backend(backend, x.device, "bias_relu")
    op = _triton_ops().triton_bias_relu if backend == "triton" else _ops.bias_relu
    return op(x, bias)


def dropout_add_norm(
    x: torch.Tensor,
    residual: Optional[torch.Tensor] = None,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    *,
    norm: str = "layer",
    p: float = 0.0,
    training: bool = True,
    eps: float = 1e-5,
    prenorm: bool = False,
    residual_in_fp32: bool = False,
    generator: Optional[torch.Generator] = None,
    backend: str = "auto",
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """norm(dropout(x, p) + residual) over the last dimension in one fused kernel, norm = "layer" (LayerNorm) or
    "rms" (RMSNorm), each with an optional weight and bias of shape (x.shape[-1],).

    Returns out, or (out, sum) when prenorm: sum = dropout(x) + residual (the next block's residual), in fp32 when
    residual_in_fp32 and x is fp16/bf16 (the residual must then be fp32 too), else in x's dtype. Dropout keeps an
    element with probability 1 - p quantized to a multiple of 2**-16 (DESIGN 2.3) and is off when training=False;
    the seed is drawn from `generator` (default: torch's default generator on x's device), as in
    layer_norm_dropout_relu, so the same seed gives the same mask as that op.
    """
    if norm not in NORMS:
        raise ValueError(f"gpuopt.dropout_add_norm: norm must be one of {NORMS}, got {norm!r}")
    backend = resolve_backend(backend, x.device, "dropout_add_norm")
    p_eff, seed = _dropout_seed(x, p, training, generator, "dropout_add_norm", x.shape[-1])
    op = _triton_ops().triton_dropout_add_norm if backend == "triton" else _ops.dropout_add_norm
    out, s, _, _ = op(x, residual, weight, bias, seed, p_eff, float(eps), norm == "rms", bool(residual_in_fp32))
    return (out, s) if prenorm else out


def bias_act(x: torch.Tensor, bias: torch.Tensor, act: str = "gelu", backend: str = "auto") -> torch.Tensor:
    """act(x + bias), bias of shape (x.shape[-1],) broadcast over the rows; act is "relu", "gelu" (erf form, as
    F.gelu), "gelu_tanh" (as F.gelu(approximate="tanh")) or "silu". Backward fuses the dbias sum."""
    code = _act_code("bias_act", act)
    backend = resolve_backend(backend, x.device, "bias_act")
    op = _triton_ops().triton_bias_act if backend == "triton" else _ops.bias_act
    return op(x, bias, code)


def _act_code(op: str, act) -> int:
    code = ACTIVATIONS.get(act) if isinstance(act, str) else None
    if code is None:
        raise ValueError(f"gpuopt.{op}: act must be one of {', '.join(map(repr, ACTIVATIONS))}, got {act!r}")
    return code


def gated_act(
    gate: torch.Tensor,
    up: Optional[torch.Tensor] = None,
    *,
    act: str = "silu",
    p: float = 0.0,
    training: bool = True,
    generator: Optional[torch.Generator] = None,
    backend: str = "auto",
) -> torch.Tensor:
    """dropout(act(gate) * up, p) in one fused kernel: SwiGLU (act "silu"), GeGLU ("gelu" erf form, "gelu_tanh"),
    ReGLU ("relu"). gate and up have the same shape; with up=None, gate's last dimension holds [gate | up] (a fused
    gate_up projection's output, 2F wide) and the result's is F. The backward saves only the inputs and recomputes
    the activation. Dropout (off by default) uses the project's definition (DESIGN 2): the same seed gives the
    same mask as every other gpuopt op at the same linear index of the output."""
    code = _act_code("gated_act", act)
    backend = resolve_backend(backend, gate.device, "gated_act")
    out_shape = (*gate.shape[:-1], gate.shape[-1] // 2) if up is None else tuple(gate.shape)
    p_eff, seed = _dropout_seed(gate, p, training, generator, "gated_act", 8, out_shape, up is not None)
    op = _triton_ops().triton_gated_act if backend == "triton" else _ops.gated_act
    return op(gate, up, seed, p_eff, code)
