"""The one list of backends the tests run the ops on.

Every test that runs an op on "each backend" takes its parameters from `backend_params()`. Adding a backend is one
entry in BACKENDS. A backend that cannot run on this machine still appears, skipped with its reason, so the test
report shows what did not run:

- `cpu`: the C++ CPU kernels; always.
- `cuda`: the CUDA kernels on a GPU (marker `cuda`; conftest skips it without a GPU).
- `triton`: the Triton kernels compiled for a GPU (marker `triton_gpu`).
- `triton-interpret`: the same Triton kernels on CPU tensors under Triton's interpreter (TRITON_INTERPRET=1, which
  conftest sets when there is no GPU). Slow: tests keep its shapes small.

Besides these, `cuda-emulated` (EMULATED, marker `cuda_emulated`) runs the CUDA source on CPU tensors under
tools/cuda_emu (torch.ops.gpuopt_emu). It is not in the default list (the existing tests cover it in
tests/test_emulator.py); tests of newer ops name it: `backend_params(*DEFAULT, "cuda-emulated")`.

A backend may lack an op that a newer branch adds (a kernel not written yet): `require_op(backend, name)` skips
the test with that reason, so a missing kernel shows up in the report and joins by itself once registered.
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
    namespace: str = "gpuopt"  # torch.ops.<namespace>: "gpuopt_emu" for the emulated CUDA source

    def _ops(self):
        if self.namespace == "gpuopt_emu":
            from helpers import load_emulated_ops  # built once and cached (tools/cuda_emu)

            return load_emulated_ops()
        return getattr(torch.ops, self.namespace)

    def op(self, name: str):
        """The raw op `name` ("layer_norm_dropout_relu", "bias_relu_backward", ...) of this backend."""
        return getattr(self._ops(), self.prefix + name)

    def missing_op(self, name: str) -> Optional[str]:
        """Why this backend cannot run the op `name` (and its backward), or None when it can."""
        key = {"cpu": "CPU", "cuda": "CUDA"}[self.device] if not self.triton else None
        if self.namespace == "gpuopt_emu":
            key = "CPU"  # the emulator's kernels take CPU tensors
        for op in (name, f"{name}_backward"):
            qualified = f"{self.namespace}::{self.prefix}{op}"
            try:
                self._ops()
                registered = hasattr(self._ops(), self.prefix + op)
            except Exception as err:  # the emulator cannot be built here
                return f"backend {self.name}: cannot load its ops ({type(err).__name__}: {err})"
            if not registered:
                return f"backend {self.name}: {qualified} is not registered (no kernel for it yet)"
            if key and not torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key):
                return f"backend {self.name}: {qualified} has no {key} kernel (not implemented yet)"
        return None

    @property
    def triton(self) -> bool:
        return self.prefix == "triton_"

    @property
    def interpreted(self) -> bool:
        return self.triton and self.device == "cpu"

    @property
    def runs_slowly(self) -> bool:
        """Kernel source run on the CPU by a model of the GPU (Triton's interpreter, the emulated CUDA source): the
        fast lane gives these backends fewer cases than the full suite."""
        return self.interpreted or self.namespace == "gpuopt_emu"

    def gradcheck(self, fn, inputs, **kwargs) -> bool:
        """torch.autograd.gradcheck of fn at inputs. The backends that run slowly take gradcheck's fast mode: one
        random projection u^T J v of the analytical and the numerical Jacobian compared, two kernel runs an input
        instead of two an input element (the Triton interpreter: 0.16 s against 1.55 s for the gated pair at 3 x
        5); every element of these backends' gradients is compared with the reference's in test_correctness.py,
        and the CPU and GPU backends check the whole Jacobian here."""
        return torch.autograd.gradcheck(fn, inputs, fast_mode=self.runs_slowly, **kwargs)

    def __repr__(self) -> str:
        return self.name


BACKENDS = [
    Backend("cpu", "cpu", "cpu", ""),
    Backend("cuda", "cuda", "cuda", "", marks=(pytest.mark.cuda,), gpu=True),
    Backend("triton", "triton", "cuda", "triton_", marks=(pytest.mark.triton_gpu,), gpu=True),
    Backend("triton-interpret", "triton", "cpu", "triton_", skip_reason=_interpreter_reason),
]
# The CUDA source on CPU tensors under tools/cuda_emu; not in the default list (see the module docstring).
EMULATED = Backend("cuda-emulated", "cuda", "cpu", "", marks=(pytest.mark.cuda_emulated,), namespace="gpuopt_emu")
DEFAULT = tuple(b.name for b in BACKENDS)
BY_NAME = {b.name: b for b in (*BACKENDS, EMULATED)}


def require_op(backend: Backend, name: str) -> None:
    """Skips the running test, with the reason, when `backend` has no kernel of gpuopt op `name` (or its
    backward): a branch that adds the kernel makes the test run without any change here."""
    reason = backend.missing_op(name)
    if reason:
        pytest.skip(reason)


def backend_params(*names: str, slow_in_full_suite: bool = False):
    """pytest params of the backends named (default: all), each with its marks, or skipped with its reason;
    slow_in_full_suite: the slow backends' cases (runs_slowly) in the full suite only (marked `slow`)."""
    chosen = [BY_NAME[n] for n in names] if names else BACKENDS
    params = []
    for b in chosen:
        marks = list(b.marks) + ([pytest.mark.slow] if slow_in_full_suite and b.runs_slowly else [])
        reason = b.skip_reason()
        if reason:
            marks.append(pytest.mark.skip(reason=f"backend {b.name}: {reason}"))
        params.append(pytest.param(b, id=b.name, marks=marks))
    return params


def marks_for(param, full_suite_only: bool) -> list:
    """The marks of a backend_params entry, plus `slow` when the case is to run in the full suite only."""
    return [*param.marks, pytest.mark.slow] if full_suite_only else list(param.marks)


def cpu_backends():
    """The backends that run here without a GPU (for tests that compare two of them)."""
    return [b for b in BACKENDS if not b.gpu and b.skip_reason() is None]
