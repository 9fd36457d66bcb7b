import os

# Triton kernels run on CPU tensors under the interpreter when there is no GPU. The variable is read when
# @triton.jit decorates a kernel, so it must be set before anything imports triton.
try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except Exception:  # pragma: no cover
    _HAS_CUDA = False
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """`cuda`- and `triton_gpu`-marked tests skip cleanly without a GPU."""
    if not _HAS_CUDA:
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "cuda" in item.keywords or "triton_gpu" in item.keywords:
                item.add_marker(skip)


# hypothesis profiles (tests/test_fuzz.py): `dev` by default (small, derandomized: the same examples every run),
# `ci` under CI=true (more examples where they are cheap: the C++ and GPU backends; the interpreter keeps its own
# small count), `long` for a deep random search: `pytest tests/test_fuzz.py --hypothesis-profile=long`.
try:
    from hypothesis import settings as _hsettings

    _hsettings.register_profile("dev", max_examples=100, deadline=None, derandomize=True, print_blob=True)
    _hsettings.register_profile("ci", max_examples=500, deadline=None, derandomize=True, print_blob=True)
    _hsettings.register_profile("long", max_examples=5000, deadline=None, print_blob=True)
    _default = "ci" if os.environ.get("CI", "").lower() in ("1", "true", "yes") else "dev"
    _hsettings.load_profile(os.environ.get("GPUOPT_HYPOTHESIS_PROFILE", _default))
except ImportError:  # pragma: no cover
    pass


@pytest.fixture
def triton_looped(monkeypatch):
    """Forces the Triton looped (long-row) kernels for N > 16, with 16-column chunks, so that small rows exercise
    them; returns the kernels' module."""
    pytest.importorskip("triton")
    from gpuopt_ops.triton_kernels import layer_norm_dropout_relu as ldr_kernels

    for name in ("FWD_MAX_FUSED_N", "FWD_MAX_FUSED_N_FP64", "BWD_MAX_FUSED_N", "BWD_MAX_FUSED_N_FP64"):
        monkeypatch.setattr(ldr_kernels, name, 16)
    return ldr_kernels
