"""Triton kernels of the gpuopt ops (pure @triton.jit code and launch helpers; no torch.library here).

The registrations as torch.ops.gpuopt.triton_* are in gpuopt_ops/triton_ops.py. Without a GPU the kernels run
on CPU tensors under Triton's interpreter: set TRITON_INTERPRET=1 before this package is imported (triton.jit
reads it when it decorates a kernel).
"""

from . import bias_act, common, dropout_add_norm, gated_act, norm_dropout, plans, rows  # noqa: F401

__all__ = ["bias_act", "common", "dropout_add_norm", "gated_act", "norm_dropout", "plans", "rows"]
