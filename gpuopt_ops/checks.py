"""Input checks of the gpuopt ops in Python: the fake kernels and the Triton ops call these.

The messages are word for word those of csrc/checks.cpp, so every backend and the fake kernel fail alike.
"""

from __future__ import annotations

from typing import Optional

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
ACTIVATIONS = {"relu": 0, "gelu": 1, "gelu_tanh": 2, "silu": 3}  # bias_act's act codes (DESIGN 1.5)


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


def check_device(op: str, name: str, t: torch.Tensor, x: torch.Tensor, x_name: str = "x") -> None:
    if t.device != x.device:
        _fail(op, f"{name} must be on {x.device} like {x_name}, got {t.device}")


def check_same(op: str, name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    check_device(op, name, t, ref)
    if t.dtype != ref.dtype:
        _fail(op, f"{name} must have dtype {ref.dtype} like {ref_name}, got {t.dtype}")
    torch._check(
        t.dim() == ref.dim() and all(a == b for a, b in zip(t.shape, ref.shape)),
        lambda: f"gpuopt.{op}: {name} must have shape {_shape(ref)} like {ref_name}, got {_shape(t)}",
    )


def check_param(op: str, name: str, t: torch.Tensor, x: torch.Tensor, n, x_name: str = "x") -> None:
    check_device(op, name, t, x, x_name)
    if t.dtype != x.dtype and t.dtype != torch.float32:
        _fail(op, f"{name} must have dtype {x.dtype} (like {x_name}) or torch.float32, got {t.dtype}")
    torch._check(
        t.dim() == 1 and t.shape[0] == n,
        lambda: f"gpuopt.{op}: {name} must have shape ({n},) to match the last dimension of {x_name}, got {_shape(t)}",
    )


def check_vector(
    op: str, name: str, t: torch.Tensor, x: torch.Tensor, m, dtype: torch.dtype, x_name: str = "x"
) -> None:
    check_device(op, name, t, x, x_name)
    if t.dtype != dtype:
        _fail(op, f"{name} must have dtype {dtype}, got {t.dtype}")
    torch._check(
        t.dim() == 1 and t.shape[0] == m,
        lambda: f"gpuopt.{op}: {name} must have shape ({m},) (one entry per row of {x_name}), got {_shape(t)}",
    )


def check_params(op: str, x: torch.Tensor, x_name: str, weight, bias, n) -> torch.dtype:
    """weight / bias of the row tensor x: returns the parameter dtype (x's when both are absent)."""
    param_dtype = x.dtype
    if weight is not None:
        check_param(op, "weight", weight, x, n, x_name)
        param_dtype = weight.dtype
    if bias is not None:
        check_param(op, "bias", bias, x, n, x_name)
        if weight is not None and bias.dtype != weight.dtype:
            _fail(op, f"bias must have the dtype of weight ({weight.dtype}), got {bias.dtype}")
        param_dtype = bias.dtype
    return param_dtype


def check_seed_p(op: str, seed: torch.Tensor, x: torch.Tensor, x_name: str, p: float, unit: int = 8) -> None:
    """seed: one int64 on x's device, or a shard map [seed, base, period, jump] that follows the rule of
    `shard_map_follows_the_rule` for `unit` (N for the row ops, 8 for gated_act); a map is checked where it can be
    read without waiting for a device (a real CPU tensor), as the C++ checks do."""
    check_device(op, "seed", seed, x, x_name)
    if seed.dtype != torch.int64:
        _fail(op, f"seed must have dtype torch.int64, got {seed.dtype}")
    torch._check(
        seed.numel() == 1 or (seed.numel() == 4 and seed.is_contiguous()),
        lambda: (
            f"gpuopt.{op}: seed must have 1 element (the seed) or 4 contiguous ones (seed, base, period, jump: "
            f"a shard's numbering), got shape {_shape(seed)}"
        ),
    )
    if not (0.0 <= p <= 1.0):  # also rejects NaN
        _fail(op, f"p must be in [0, 1], got {p:g}")
    if seed.numel() == 4 and seed.device.type == "cpu" and p > 0 and not _is_fake(seed):
        _, base, period, jump = (int(v) for v in seed.tolist())
        if not shard_map_follows_the_rule(base, period, jump, unit):
            _fail(
                op,
                f"the seed's shard map (base {base}, period {period}, jump {jump}) must have base >= 0, period >= 1, "
                f"jump >= 0, base a multiple of {unit} and, unless jump is 0, period and jump too",
            )


def shard_map_follows_the_rule(base: int, period: int, jump: int, unit: int) -> bool:
    """DESIGN 2.4: a map keeps each row (unit N) or group of 8 (unit 8) in consecutive elements."""
    if base < 0 or period < 1 or jump < 0 or base % unit:
        return False
    return jump == 0 or (period % unit == 0 and jump % unit == 0)


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t) or t.device.type == "meta"


def check_ldr_common(
    op: str, x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], seed: torch.Tensor, p: float
):
    """Returns (M, N, param_dtype)."""
    check_input(op, "x", x)
    n = x.shape[-1]
    m = x.numel() // n
    param_dtype = check_params(op, x, "x", weight, bias, n)
    check_seed_p(op, seed, x, "x", p, x.shape[-1])
    return m, n, param_dtype


def _check_eps(op: str, eps: float) -> None:
    if not (eps > 0.0 and eps != float("inf")):
        _fail(op, f"eps must be a finite number > 0, got {eps:g}")


def check_ldr_forward(x, weight, bias, seed, p: float, eps: float, op: str = "layer_norm_dropout_relu"):
    m, n, param_dtype = check_ldr_common(op, x, weight, bias, seed, p)
    _check_eps(op, eps)
    return m, n, param_dtype


def check_rms_mean(op: str, mean: torch.Tensor, x: torch.Tensor, x_name: str = "x") -> None:
    """An RMSNorm op's `mean`: an empty (0,) tensor in the accumulation dtype."""
    check_device(op, "mean", mean, x, x_name)
    acc = acc_dtype(x.dtype)
    if mean.dtype != acc:
        _fail(op, f"mean must have dtype {acc}, got {mean.dtype}")
    torch._check(
        mean.dim() == 1 and mean.shape[0] == 0,
        lambda: f"gpuopt.{op}: mean must have shape (0,) when rms is true, got {_shape(mean)}",
    )


def check_ldr_backward(grad_out, x, weight, bias, mean, rstd, seed, p: float, rms=False, op=None):
    op = op or "layer_norm_dropout_relu_backward"
    m, n, param_dtype = check_ldr_common(op, x, weight, bias, seed, p)
    check_same(op, "grad_out", grad_out, "x", x)
    if rms:
        check_rms_mean(op, mean, x)
    else:
        check_vector(op, "mean", mean, x, m, acc_dtype(x.dtype))
    check_vector(op, "rstd", rstd, x, m, acc_dtype(x.dtype))
    return m, n, param_dtype


def check_norm_dropout(x, weight, bias, seed, p: float, eps: float, rms: bool, relu: bool):
    """norm_dropout: layer_norm_dropout_relu's checks under its own name. Returns (M, N, param_dtype)."""
    return check_ldr_forward(x, weight, bias, seed, p, eps, op="norm_dropout")


def check_norm_dropout_backward(grad_out, x, weight, bias, mean, rstd, seed, p: float, rms: bool, relu: bool):
    """mean is (M,) for LayerNorm, (0,) when rms. Returns (M, N, param_dtype)."""
    return check_ldr_backward(grad_out, x, weight, bias, mean, rstd, seed, p, rms=rms, op="norm_dropout_backward")


def check_act(op: str, act: int) -> None:
    if not (0 <= act <= 3):
        _fail(op, f"act must be 0 (relu), 1 (gelu), 2 (gelu_tanh) or 3 (silu), got {act}")


def _check_bias_op(op: str, name: str, t, grad_out=None, bias=None):
    """(M, N) of a bias op's row tensor `t` (x, out or saved), after checking it, then grad_out (like t) and the
    bias ((N,), like x), each where given, in the C++ checks' order."""
    check_input(op, name, t)
    if grad_out is not None:
        check_same(op, "grad_out", grad_out, name, t)
    n = t.shape[-1]
    if bias is not None:
        check_param(op, "bias", bias, t, n)
    return t.numel() // n, n


def check_bias_act(x, bias, act: int):
    check_act("bias_act", act)
    return _check_bias_op("bias_act", "x", x, bias=bias)


def check_bias_act_backward(grad_out, saved, bias, act: int):
    check_act("bias_act_backward", act)
    return _check_bias_op("bias_act_backward", "saved", saved, grad_out, bias)


def check_bias_relu(x, bias):
    return _check_bias_op("bias_relu", "x", x, bias=bias)


def check_bias_relu_backward(grad_out, out):
    return _check_bias_op("bias_relu_backward", "out", out, grad_out)


def _check_gated_inputs(op: str, gate, up, seed, p: float, act: int):
    """Returns (M, F): rows, and the output's last dimension."""
    check_act(op, act)
    check_input(op, "gate", gate)
    last = gate.shape[-1]
    if up is not None:
        check_same(op, "up", up, "gate", gate)
        f = last
    else:
        torch._check(
            last % 2 == 0,
            lambda: (
                f"gpuopt.{op}: gate must have an even last dimension (its halves are [gate | up]) when up is None,"
                f" got shape {_shape(gate)}"
            ),
        )
        f = last // 2
    check_seed_p(op, seed, gate, "gate", p)
    return gate.numel() // last, f


def check_gated_act(gate, up, seed, p: float, act: int):
    """Returns (M, F)."""
    return _check_gated_inputs("gated_act", gate, up, seed, p, act)


def check_gated_act_backward(grad_out, gate, up, seed, p: float, act: int):
    """Returns (M, F)."""
    op = "gated_act_backward"
    m, f = _check_gated_inputs(op, gate, up, seed, p, act)
    check_device(op, "grad_out", grad_out, gate, "gate")
    if grad_out.dtype != gate.dtype:
        _fail(op, f"grad_out must have dtype {gate.dtype} like gate, got {grad_out.dtype}")
    torch._check(
        grad_out.dim() == gate.dim()
        and all(a == b for a, b in zip(grad_out.shape[:-1], gate.shape[:-1]))
        and grad_out.shape[-1] == f,
        lambda: (
            f"gpuopt.{op}: grad_out must have the output's shape (gate's, last dimension {f}), got {_shape(grad_out)}"
        ),
    )
    return m, f


HALF_DTYPES = (torch.float16, torch.bfloat16)


def sum_dtype(x_dtype: torch.dtype, residual_in_fp32: bool) -> torch.dtype:
    """S, the dtype of dropout_add_norm's `sum`: fp32 when residual_in_fp32 and x is fp16/bf16, else x's dtype."""
    return torch.float32 if residual_in_fp32 and x_dtype in HALF_DTYPES else x_dtype


def check_dropout_add_norm(x, residual, weight, bias, seed, p: float, eps: float, rms: bool, residual_in_fp32: bool):
    """Returns (M, N, param_dtype, S)."""
    op = "dropout_add_norm"
    check_input(op, "x", x)
    n = x.shape[-1]
    m = x.numel() // n
    s_dtype = sum_dtype(x.dtype, residual_in_fp32)
    param_dtype = check_params(op, x, "x", weight, bias, n)
    if residual is not None:
        check_device(op, "residual", residual, x)
        if s_dtype != x.dtype:
            if residual.dtype != s_dtype:
                _fail(
                    op,
                    f"residual must have dtype torch.float32 (residual_in_fp32=True with x of dtype {x.dtype}), "
                    f"got {residual.dtype}",
                )
        elif residual.dtype == torch.float32 and x.dtype in HALF_DTYPES:
            _fail(
                op,
                f"residual must have dtype {x.dtype} like x, got torch.float32 (an fp32 residual needs "
                "residual_in_fp32=True)",
            )
        elif residual.dtype != x.dtype:
            _fail(op, f"residual must have dtype {x.dtype} like x, got {residual.dtype}")
        torch._check(
            residual.dim() == x.dim() and all(a == b for a, b in zip(residual.shape, x.shape)),
            lambda: f"gpuopt.{op}: residual must have shape {_shape(x)} like x, got {_shape(residual)}",
        )
    check_seed_p(op, seed, x, "x", p, x.shape[-1])
    _check_eps(op, eps)
    return m, n, param_dtype, s_dtype


def check_dropout_add_norm_backward(
    grad_out, grad_sum, sum, weight, bias, mean, rstd, seed, p: float, rms: bool, has_residual: bool
):
    """Returns (M, N, param_dtype, S); x's dtype is grad_out's, S is sum's."""
    op = "dropout_add_norm_backward"
    check_input(op, "grad_out", grad_out)
    n = grad_out.shape[-1]
    m = grad_out.numel() // n
    acc = acc_dtype(grad_out.dtype)
    check_device(op, "sum", sum, grad_out, "grad_out")
    if grad_out.dtype in HALF_DTYPES:
        if sum.dtype not in (grad_out.dtype, torch.float32):
            _fail(
                op,
                f"sum must have dtype {grad_out.dtype} (like grad_out) or torch.float32 (residual_in_fp32), "
                f"got {sum.dtype}",
            )
    elif sum.dtype != grad_out.dtype:
        _fail(op, f"sum must have dtype {grad_out.dtype} like grad_out, got {sum.dtype}")
    torch._check(
        sum.dim() == grad_out.dim() and all(a == b for a, b in zip(sum.shape, grad_out.shape)),
        lambda: f"gpuopt.{op}: sum must have shape {_shape(grad_out)} like grad_out, got {_shape(sum)}",
    )
    if grad_sum is not None:
        check_same(op, "grad_sum", grad_sum, "sum", sum)
    param_dtype = check_params(op, grad_out, "grad_out", weight, bias, n)
    if rms:
        check_rms_mean(op, mean, grad_out, "grad_out")
    else:
        check_vector(op, "mean", mean, grad_out, m, acc, "grad_out")
    check_vector(op, "rstd", rstd, grad_out, m, acc, "grad_out")
    check_seed_p(op, seed, grad_out, "grad_out", p, grad_out.shape[-1])
    return m, n, param_dtype, sum.dtype
