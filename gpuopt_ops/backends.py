"""Which implementation runs an op: `resolve_backend`, the one check of a `backend=` argument.

The functions, the modules, `fuse` and the training loop all take `backend="auto" | "cuda" | "cpu" | "triton"`
and all validate it here, so a bad name or a backend that cannot run on a device fails with the same message
everywhere.
"""

from __future__ import annotations

import os
from typing import Optional, Union

import torch

BACKENDS = ("auto", "cuda", "cpu", "triton")


@torch.compiler.assume_constant_result
def has_kernel(op: str, dispatch_key: str) -> bool:
    """Whether this build registered a kernel of gpuopt::<op> for `dispatch_key` ("CPU", "CUDA").

    Fixed once the extension is loaded, so torch.compile takes it as a constant: traced code (a module's forward
    resolving its backend) calls it without a graph break."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"gpuopt::{op}", dispatch_key)


def triton_interpreted() -> bool:
    """Whether the Triton kernels were decorated under TRITON_INTERPRET=1 (so they run on CPU tensors)."""
    from . import triton_ops  # imported lazily: triton is optional

    return triton_ops.INTERPRETED


def resolve_backend(backend: str, device: Optional[Union[torch.device, str]] = None, op: Optional[str] = None) -> str:
    """Checks `backend` and returns the one that runs on `device`.

    - `backend` must be one of BACKENDS (ValueError otherwise).
    - Without a device only the name is checked and returned as given ("auto" stays "auto"): what a module's
      constructor can know before it sees a tensor.
    - With a device, "auto" becomes "cuda" on CUDA devices and "cpu" elsewhere, and the backend must be able to
      run there: "cpu" needs a CPU device, "cuda" a CUDA device and a build with CUDA kernels, "triton" an
      importable triton and a CUDA device, or a CPU device with the kernels under Triton's interpreter. The
      error says what to do instead (ValueError for a wrong device, RuntimeError for a missing capability).

    `op` names the caller in the messages (e.g. "bias_relu" gives "gpuopt.bias_relu: ...").
    """
    prefix = f"gpuopt.{op}: " if op else ""
    if backend not in BACKENDS:
        raise ValueError(f"{prefix}backend must be one of {BACKENDS}, got {backend!r}")
    if device is None:
        return backend
    device = torch.device(device)
    if backend == "auto":
        return "cuda" if device.type == "cuda" else "cpu"
    if backend == "cpu" and device.type != "cpu":
        raise ValueError(
            f"{prefix}backend='cpu' needs a CPU tensor, got x on {device}; use backend='auto', 'cuda' or 'triton'"
        )
    if backend == "cuda":
        if device.type != "cuda":
            raise ValueError(
                f"{prefix}backend='cuda' needs a CUDA tensor, got x on {device}; use backend='auto' or 'cpu'"
            )
        if not has_kernel(op or "layer_norm_dropout_relu", "CUDA"):
            raise RuntimeError(
                f"{prefix}this gpuopt build has no CUDA kernels (it was built CPU-only, "
                "without nvcc or with GPUOPT_CPU_ONLY=1). Rebuild with a CUDA toolkit "
                "(pip install --no-build-isolation -e .) or use backend='triton'."
            )
    if backend == "triton":
        try:
            import triton  # noqa: F401
        except ImportError as err:
            raise RuntimeError(
                f"{prefix}backend='triton' needs the triton package, which cannot be "
                f"imported ({err}); install triton or use backend='cpu' (or 'cuda' on a GPU)"
            ) from err
        if device.type not in ("cuda", "cpu"):
            raise ValueError(
                f"{prefix}backend='triton' needs a CUDA tensor (or a CPU tensor under "
                f"TRITON_INTERPRET=1), got x on {device}"
            )
        if device.type == "cpu":
            hint = (
                "set TRITON_INTERPRET=1 before importing triton (and gpuopt_ops.triton_ops) to run the Triton "
                "kernels on CPU tensors under Triton's interpreter, or use backend='cpu'"
            )
            if os.environ.get("TRITON_INTERPRET", "0") != "1":
                raise RuntimeError(f"{prefix}backend='triton' got x on cpu without TRITON_INTERPRET=1: {hint}")
            if not triton_interpreted():
                raise RuntimeError(
                    f"{prefix}backend='triton' got x on cpu, but the Triton kernels were imported "
                    f"before TRITON_INTERPRET=1 was set, so they are compiled for the GPU: {hint}"
                )
    return backend
