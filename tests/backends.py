"""The backends a test can run the ops on, here: C++ CPU always, CUDA and Triton on a GPU, Triton under the
interpreter on CPU (TRITON_INTERPRET=1, set by conftest when there is no GPU)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

import gpuopt_ops  # noqa: F401

ops = torch.ops.gpuopt


@dataclass
class Backend:
    name: str
    device: str
    ldr: Callable
    ldr_backward: Callable
    bias_relu: Callable
    bias_relu_backward: Callable
    fp64: bool = True


def _triton_available() -> bool:
    try:
        from gpuopt_ops import triton_ops  # noqa: F401
    except Exception:
        return False
    return True


def get_backend(name: str) -> Backend:
    if name in ("cpu", "cuda"):
        return Backend(name, name, ops.layer_norm_dropout_relu, ops.layer_norm_dropout_relu_backward,
                       ops.bias_relu, ops.bias_relu_backward)
    from gpuopt_ops import triton_ops  # noqa: F401

    device = "cuda" if name == "triton" else "cpu"
    return Backend(name, device, ops.triton_layer_norm_dropout_relu, ops.triton_layer_norm_dropout_relu_backward,
                   ops.triton_bias_relu, ops.triton_bias_relu_backward)  # fp64 too: the Triton kernels take it


def backend_params():
    """pytest params: cpu; cuda and triton marked for the GPU; triton-interpret when the interpreter is on."""
    params = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda),
              pytest.param("triton", marks=pytest.mark.triton_gpu)]
    if os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available() and _triton_available():
        params.append("triton-interpret")
    return params
