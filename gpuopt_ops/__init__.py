"""gpuopt: fused LayerNorm-Dropout-ReLU, norm-dropout, bias-activation, dropout-add-norm and gated-activation
operators for PyTorch.

`import gpuopt_ops` loads the compiled extension (which defines torch.ops.gpuopt.*) and registers the fake
kernels and autograd formulas, and, when `import triton` succeeds, the Triton twins torch.ops.gpuopt.triton_*
(gpuopt_ops.triton_ops).
"""

import torch

__version__ = "0.2.0"  # = pyproject.toml's (tests/test_packaging.py checks)

try:
    from . import _C  # noqa: F401  (registers the schemas and the CPU/CUDA kernels)
except ImportError as err:  # no build here (a source tree on sys.path), or a torch older than 2.11
    raise ImportError(
        f"gpuopt_ops: cannot load the compiled extension gpuopt_ops._C ({err}). It is built on the LibTorch "
        f"stable ABI for torch >= 2.11; this is torch {torch.__version__}, "
        f"imported from {__file__}. Install the wheel (`pip install dist/gpuopt-*.whl`) or build in place "
        "(`pip install --no-build-isolation -e .`), and import gpuopt_ops from outside a source tree that has "
        "no build."
    ) from err

from . import (
    compile_backend,  # noqa: E402
    dtensor,  # noqa: E402
    ops,  # noqa: E402
)
from .backends import BACKENDS, resolve_backend  # noqa: E402
from .fuse import fuse, unfuse  # noqa: E402
from .ops import (  # noqa: E402
    bias_act,
    bias_relu,
    draw_seed,
    dropout_add_norm,
    gated_act,
    layer_norm_dropout_relu,
    norm_dropout,
)

compile_backend.register()  # torch.compile(model, backend="gpuopt")
dtensor.register()  # DTensor sharding rules of torch.ops.gpuopt.* (tensor / sequence parallelism)


def _load_triton_twins() -> None:
    """Registers torch.ops.gpuopt.triton_* whenever triton imports. Without triton (CPU-only installs) they are
    simply absent; a triton that is installed but fails to import only warns. Errors of gpuopt's own Triton
    layer surface. TRITON_INTERPRET is read when the kernels are decorated, i.e. here: set it before
    `import gpuopt_ops` to run them on CPU tensors (if triton was already imported without it, the kernels are
    compiled for the GPU, as before)."""
    import warnings

    try:
        import triton  # noqa: F401
    except ImportError:
        return
    except Exception as err:  # a broken triton install must not break the CPU/CUDA ops
        warnings.warn(
            f"gpuopt_ops: `import triton` failed ({type(err).__name__}: {err}); the "
            "torch.ops.gpuopt.triton_* ops are not registered",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    from . import triton_ops  # noqa: F401


_load_triton_twins()

__all__ = [
    "layer_norm_dropout_relu",
    "bias_relu",
    "bias_act",
    "dropout_add_norm",
    "norm_dropout",
    "gated_act",
    "draw_seed",
    "fuse",
    "unfuse",
    "resolve_backend",
    "BACKENDS",
    "ops",
    "compile_backend",
]
