"""How the loaded gpuopt_ops._C was built, as the library itself records it (setup.py passes both values to the
compiler; csrc/ops.cpp keeps them as module constants), so the record can never disagree with the binary."""

from . import _C

TORCH_VERSION: str = _C.TORCH_VERSION  # built with; the binary loads in any torch >= 2.11 (stable ABI)
CUDA_ARCH_LIST: "str | None" = _C.CUDA_ARCH_LIST  # the TORCH_CUDA_ARCH_LIST it was built for; None: CPU-only
