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
    """`cuda`-marked tests skip cleanly without a GPU or without the CUDA build of the extension."""
    if not _HAS_CUDA:
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "cuda" in item.keywords or "triton_gpu" in item.keywords:
                item.add_marker(skip)


# hypothesis profiles (tests/test_fuzz.py): `ci` by default; `--hypothesis-profile=long` for a deeper run
try:
    from hypothesis import settings as _hsettings

    _hsettings.register_profile("ci", max_examples=500, deadline=None, derandomize=True, print_blob=True)
    _hsettings.register_profile("long", max_examples=5000, deadline=None, print_blob=True)
    _hsettings.register_profile("dev", max_examples=50, deadline=None)
    _hsettings.load_profile(os.environ.get("GPUOPT_HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # pragma: no cover
    pass
