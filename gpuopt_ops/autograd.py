"""Autograd of the gpuopt ops, one `register_*_autograd(forward_op, backward_op)` per op family.

The C++ / CUDA ops (gpuopt_ops.ops) and their Triton twins (gpuopt_ops.triton_ops) register the same formulas
through these functions; this module imports neither, so neither depends on the other to load.
"""

from __future__ import annotations

import torch


def register_ldr_autograd(forward_op, backward_op) -> None:
    """Autograd of a layer_norm_dropout_relu op (C++ or Triton): backward is the `_backward` op.

    Saved for backward: x, weight, bias, mean, rstd, seed (DESIGN 1.8); the mask is recomputed from the seed.
    The mean/rstd outputs are statistics, not differentiable results: gradients flowing into them are ignored.
    """
    register_norm_dropout_autograd(forward_op, backward_op)


def register_norm_dropout_autograd(forward_op, backward_op) -> None:
    """Autograd of a norm_dropout op (C++ or Triton): layer_norm_dropout_relu's, plus the rms / relu flags, which
    the backward op takes after p (layer_norm_dropout_relu has none)."""

    def setup_context(ctx, inputs, output):
        x, weight, bias, seed, p, eps = inputs[:6]
        _, mean, rstd = output
        ctx.save_for_backward(x, weight, bias, mean, rstd, seed)
        ctx.p = p
        ctx.flags = tuple(inputs[6:8])  # (rms, relu) of norm_dropout; () for layer_norm_dropout_relu
        # no zero gradients made for mean / rstd (ignored): two allocations and two fill kernels a backward fewer
        ctx.set_materialize_grads(False)

    def backward(ctx, grad_out, _grad_mean, _grad_rstd):
        x, weight, bias, mean, rstd, seed = ctx.saved_tensors
        if grad_out is None:  # only mean / rstd reached the loss: the gradients are those of a zero grad_out
            grad_out = torch.zeros_like(x, memory_format=torch.contiguous_format)
        grad_x, grad_w, grad_b = backward_op(grad_out, x, weight, bias, mean, rstd, seed, ctx.p, *ctx.flags)
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        return (
            grad_x if need_x else None,
            grad_w if weight is not None and need_w else None,
            grad_b if bias is not None and need_b else None,
            *(None,) * (3 + len(ctx.flags)),  # seed, p, eps and the flags
        )

    torch.library.register_autograd(forward_op, backward, setup_context=setup_context)
    _forbid_double_backward(f"{forward_op}_backward")


def _forbid_double_backward(qualname: str) -> None:
    """The `_backward` ops are not differentiable: an error instead of PyTorch's silently-zero fallback."""

    def backward(ctx, *grads):
        raise RuntimeError(
            f"{qualname.replace('::', '.')}: double backward (the gradient of a gradient) is not "
            "supported by the gpuopt ops; compute second derivatives with the unfused PyTorch ops"
        )

    torch.library.register_autograd(qualname, backward, setup_context=lambda ctx, inputs, output: None)


def register_bias_relu_autograd(forward_op, backward_op) -> None:
    """Autograd of a bias_relu op: only the output is saved; the ReLU mask is out > 0.

    The backward op returns grad_bias in the accumulation dtype (fp32 for bf16/fp16 x); it is cast once to the
    bias's dtype, so an fp32 bias under AMP gets the unrounded sum. Only the bias's dtype is kept, not the bias.
    """

    def setup_context(ctx, inputs, output):
        _, bias = inputs
        ctx.save_for_backward(output)
        ctx.bias_dtype = bias.dtype

    def backward(ctx, grad_out):
        (out,) = ctx.saved_tensors
        grad_x, grad_b = backward_op(grad_out, out)
        return grad_x, grad_b.to(ctx.bias_dtype)

    torch.library.register_autograd(forward_op, backward, setup_context=setup_context)
    _forbid_double_backward(f"{forward_op}_backward")


def register_dropout_add_norm_autograd(forward_op, backward_op) -> None:
    """Autograd of a dropout_add_norm op (C++ or Triton): backward is the `_backward` op.

    Saved for backward: sum, weight, bias, mean, rstd, seed (DESIGN 1.8); never a mask (recomputed from the seed).
    The gradient reaching the `sum` output (the prenorm output's other users) is passed as grad_sum, None when
    nothing flows there; a missing grad of `out` (only `sum` used) is zeros. mean/rstd are not differentiable.
    """

    def setup_context(ctx, inputs, output):
        x, residual, weight, bias, seed, p, eps, rms, residual_in_fp32 = inputs
        _, s, mean, rstd = output
        ctx.save_for_backward(s, weight, bias, mean, rstd, seed)
        ctx.p, ctx.rms, ctx.has_residual, ctx.x_dtype = p, rms, residual is not None, x.dtype
        ctx.set_materialize_grads(False)

    def backward(ctx, grad_out, grad_sum, _grad_mean, _grad_rstd):
        s, weight, bias, mean, rstd, seed = ctx.saved_tensors
        if grad_out is None:
            grad_out = torch.zeros_like(s, dtype=ctx.x_dtype)
        need_x, need_r, need_w, need_b = ctx.needs_input_grad[:4]
        # grad_x and grad_residual are separate tensors even where they hold the same values (p = 0, S = x's
        # dtype): one tensor given to two leaves makes autograd copy it for the second .grad, which costs more
        # than the op writing both.
        grad_x, grad_res, grad_w, grad_b = backward_op(
            grad_out, grad_sum, s, weight, bias, mean, rstd, seed, ctx.p, ctx.rms, ctx.has_residual
        )
        return (
            grad_x if need_x else None,
            grad_res if ctx.has_residual and need_r else None,
            grad_w if weight is not None and need_w else None,
            grad_b if bias is not None and need_b else None,
            None,
            None,
            None,
            None,
            None,
        )

    torch.library.register_autograd(forward_op, backward, setup_context=setup_context)
    _forbid_double_backward(f"{forward_op}_backward")


def register_bias_act_autograd(forward_op, backward_op) -> None:
    """Autograd of a bias_act op: relu (act 0) saves the output (mask out > 0), the other activations save x (the
    backward recomputes z = x + bias); the bias is saved for every act (its values are unused for relu).

    The backward op returns grad_bias in the accumulation dtype; it is cast once to the bias's dtype.
    """

    def setup_context(ctx, inputs, output):
        x, bias, act = inputs
        ctx.save_for_backward(output if act == 0 else x, bias)
        ctx.act = act

    def backward(ctx, grad_out):
        saved, bias = ctx.saved_tensors
        grad_x, grad_b = backward_op(grad_out, saved, bias, ctx.act)
        return grad_x, grad_b.to(bias.dtype), None

    torch.library.register_autograd(forward_op, backward, setup_context=setup_context)
    _forbid_double_backward(f"{forward_op}_backward")


def register_gated_act_autograd(forward_op, backward_op) -> None:
    """Autograd of a gated_act op: saves the inputs (gate, up) and the seed, never the activation or a mask; the
    backward recomputes both. For the [gate | up] layout (up None) grad_gate holds both halves."""

    def setup_context(ctx, inputs, output):
        gate, up, seed, p, act = inputs
        ctx.save_for_backward(gate, up, seed)
        ctx.p, ctx.act = p, act

    def backward(ctx, grad_out):
        gate, up, seed = ctx.saved_tensors
        grad_gate, grad_up = backward_op(grad_out, gate, up, seed, ctx.p, ctx.act)
        return grad_gate, (grad_up if up is not None else None), None, None, None

    torch.library.register_autograd(forward_op, backward, setup_context=setup_context)
    _forbid_double_backward(f"{forward_op}_backward")
