"""The one list of backends the tests run the ops on.

Every test that runs an op on "each backend" takes its parameters from `backend_params()`. Adding a backend is one
entry in BACKENDS. A backend that cannot run on this machine still appears, skipped with its reason, so the test
report shows what did not run:

- `cpu`: the C++ CPU kernels; always.
- `cuda`: the CUDA kernels on a GPU (marker `cuda`; conftest skips it without a GPU).
- `triton`: the Triton kernels compiled for a GPU (marker `triton_gpu`).
- `triton-interpret`: the same Triton kernels on CPU tensors under Triton's interpreter (TRITON_INTERPRET=1, which
  conftest sets when there is no GPU). Slow: tests keep its shapes small.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

import pytest
import torch

import gpuopt_ops  # noqa: F401  (registers torch.ops.gpuopt.*)


def _triton_importable() -> bool:
    try:
        from gpuopt_ops import triton_ops  # noqa: F401
    except Exception:
        return False
    return True


def _interpreter_reason() -> Optional[str]:
    if torch.cuda.is_available():
        return "a GPU is present: the Triton kernels run compiled (backend `triton`)"
    if os.environ.get("TRITON_INTERPRET") != "1":
        return "TRITON_INTERPRET=1 is not set"
    if not _triton_importable():
        return "triton cannot be imported"
    return None


@dataclass(frozen=True)
class Backend:
    name: str  # the test id
    api: str  # the backend= argument of the public functions, modules and fuse
    device: str  # where its tensors live
    prefix: str  # torch.ops.gpuopt.<prefix><op>: "" for the C++ ops, "triton_" for the Triton twins
    marks: tuple = ()
    skip_reason: Callable[[], Optional[str]] = field(default=lambda: None, compare=False)
    gpu: bool = False

    def op(self, name: str):
        """The raw op `name` ("layer_norm_dropout_relu", "bias_relu_backward", ...) of this backend."""
        return getattr(torch.ops.gpuopt, self.prefix + name)

    @property
    def triton(self) -> bool:
        return self.prefix == "triton_"

    @property
    def interpreted(self) -> bool:
        return self.triton and self.device == "cpu"

    def __repr__(self) -> str:
        return self.name


BACKENDS = [
    Backend("cpu", "cpu", "cpu", ""),
    Backend("cuda", "cuda", "cuda", "", marks=(pytest.mark.cuda,), gpu=True),
    Backend("triton", "triton", "cuda", "triton_", marks=(pytest.mark.triton_gpu,), gpu=True),
    Backend("triton-interpret", "triton", "cpu", "triton_", skip_reason=_interpreter_reason),
]
BY_NAME = {b.name: b for b in BACKENDS}


def backend_params(*names: str):
    """pytest params of the backends named (default: all), each with its marks, or skipped with its reason."""
    chosen = [BY_NAME[n] for n in names] if names else BACKENDS
    params = []
    for b in chosen:
        marks = list(b.marks)
        reason = b.skip_reason()
        if reason:
            marks.append(pytest.mark.skip(reason=f"backend {b.name}: {reason}"))
        params.append(pytest.param(b, id=b.name, marks=marks))
    return params


def cpu_backends():
    """The backends that run here without a GPU (for tests that compare two of them)."""
    return [b for b in BACKENDS if not b.gpu and b.skip_reason() is None]
