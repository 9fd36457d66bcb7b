"""Input checks of the gpuopt ops in Python: the fake kernels and the Triton ops call these.

The messages are word for word those of csrc/checks.cpp, so every backend and the fake kernel fail alike.
"""

from __future__ import annotations

from typing import Optional

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _shape(t: torch.Tensor) -> str:
    return str(tuple(int(s) if isinstance(s, int) else s for s in t.shape))


def _fail(op: str, msg: str) -> None:
    raise RuntimeError(f"gpuopt.{op}: {msg}")


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """dtype of the statistics and accumulations: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_input(op: str, name: str, t: torch.Tensor) -> None:
    if t.dtype not in FLOAT_DTYPES:
        _fail(op, f"{name} must be float32, float16, bfloat16 or float64, got {t.dtype}")
    if t.dim() < 1:
        _fail(op, f"{name} must have at least 1 dimension, got a 0-dim tensor")
    torch._check(
        t.shape[-1] > 0, lambda: f"gpuopt.{op}: {name} must have a non-empty last dimension, got shape {_shape(t)}"
    )


def check_device(op: str, name: str, t: torch.Tensor, x: torch.Tensor) -> None:
    if t.device != x.device:
        _fail(op, f"{name} must be on {x.device} like x, got {t.device}")


def check_same(op: str, name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    check_device(op, name, t, ref)
    if t.dtype != ref.dtype:
        _fail(op, f"{name} must have dtype {ref.dtype} like {ref_name}, got {t.dtype}")
    torch._check(
        t.dim() == ref.dim() and all(a == b for a, b in zip(t.shape, ref.shape)),
        lambda: f"gpuopt.{op}: {name} must have shape {_shape(ref)} like {ref_name}, got {_shape(t)}",
    )


def check_param(op: str, name: str, t: torch.Tensor, x: torch.Tensor, n) -> None:
    check_device(op, name, t, x)
    if t.dtype != x.dtype and t.dtype != torch.float32:
        _fail(op, f"{name} must have dtype {x.dtype} (like x) or torch.float32, got {t.dtype}")
    torch._check(
        t.dim() == 1 and t.shape[0] == n,
        lambda: f"gpuopt.{op}: {name} must have shape ({n},) to match the last dimension of x, got {_shape(t)}",
    )


def check_vector(op: str, name: str, t: torch.Tensor, x: torch.Tensor, m, dtype: torch.dtype) -> None:
    check_device(op, name, t, x)
    if t.dtype != dtype:
        _fail(op, f"{name} must have dtype {dtype}, got {t.dtype}")
    torch._check(
        t.dim() == 1 and t.shape[0] == m,
        lambda: f"gpuopt.{op}: {name} must have shape ({m},) (one entry per row of x), got {_shape(t)}",
    )


def check_ldr_common(
    op: str, x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], seed: torch.Tensor, p: float
):
    """Returns (M, N, param_dtype)."""
    check_input(op, "x", x)
    n = x.shape[-1]
    m = x.numel() // n
    param_dtype = x.dtype
    if weight is not None:
        check_param(op, "weight", weight, x, n)
        param_dtype = weight.dtype
    if bias is not None:
        check_param(op, "bias", bias, x, n)
        if weight is not None and bias.dtype != weight.dtype:
            _fail(op, f"bias must have the dtype of weight ({weight.dtype}), got {bias.dtype}")
        param_dtype = bias.dtype
    check_device(op, "seed", seed, x)
    if seed.dtype != torch.int64:
        _fail(op, f"seed must have dtype torch.int64, got {seed.dtype}")
    torch._check(seed.numel() == 1, lambda: f"gpuopt.{op}: seed must have exactly 1 element, got shape {_shape(seed)}")
    if not (0.0 <= p <= 1.0):  # also rejects NaN
        _fail(op, f"p must be in [0, 1], got {p:g}")
    return m, n, param_dtype


def check_ldr_forward(x, weight, bias, seed, p: float, eps: float):
    op = "layer_norm_dropout_relu"
    m, n, param_dtype = check_ldr_common(op, x, weight, bias, seed, p)
    if not (eps > 0.0 and eps != float("inf")):
        _fail(op, f"eps must be a finite number > 0, got {eps:g}")
    return m, n, param_dtype


def check_ldr_backward(grad_out, x, weight, bias, mean, rstd, seed, p: float):
    op = "layer_norm_dropout_relu_backward"
    m, n, param_dtype = check_ldr_common(op, x, weight, bias, seed, p)
    check_same(op, "grad_out", grad_out, "x", x)
    check_vector(op, "mean", mean, x, m, acc_dtype(x.dtype))
    check_vector(op, "rstd", rstd, x, m, acc_dtype(x.dtype))
    return m, n, param_dtype


def check_bias_relu(x, bias):
    op = "bias_relu"
    check_input(op, "x", x)
    n = x.shape[-1]
    check_param(op, "bias", bias, x, n)
    return x.numel() // n, n


def check_bias_relu_backward(grad_out, out):
    op = "bias_relu_backward"
    check_input(op, "out", out)
    check_same(op, "grad_out", grad_out, "out", out)
    n = out.shape[-1]
    return out.numel() // n, n


def check_act(op: str, act: int) -> None:
    if not (0 <= act <= 3):
        _fail(op, f"act must be 0 (relu), 1 (gelu), 2 (gelu_tanh) or 3 (silu), got {act}")


def check_bias_act(x, bias, act: int):
    op = "bias_act"
    check_act(op, act)
    check_input(op, "x", x)
    n = x.shape[-1]
    check_param(op, "bias", bias, x, n)
    return x.numel() // n, n


def check_bias_act_backward(grad_out, saved, bias, act: int):
    op = "bias_act_backward"
    check_act(op, act)
    check_input(op, "saved", saved)
    check_same(op, "grad_out", grad_out, "saved", saved)
    n = saved.shape[-1]
    check_param(op, "bias", bias, saved, n)
    return saved.numel() // n, n
