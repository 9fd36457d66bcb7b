"""Build of gpuopt_ops._C: CUDA + CPU kernels when nvcc is found, CPU-only otherwise (or GPUOPT_CPU_ONLY=1)."""

import glob
import os
import shutil
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"
DEFAULT_ARCH_LIST = "8.0;9.0+PTX"


def _log(msg: str) -> None:
    print(f"gpuopt setup: {msg}", file=sys.stderr, flush=True)


def _find_cuda_home():
    """Return (cuda_home, reason). cuda_home is None when no usable toolkit was found."""
    if os.environ.get("GPUOPT_CPU_ONLY", "0") not in ("", "0"):
        return None, "GPUOPT_CPU_ONLY is set"
    env_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if env_home:
        nvcc = Path(env_home) / "bin" / "nvcc"
        if not nvcc.is_file():
            raise SystemExit(
                f"gpuopt setup: CUDA_HOME={env_home} has no bin/nvcc (looked for {nvcc}). "
                "Point CUDA_HOME at a CUDA toolkit (the folder holding bin/nvcc and include/cuda_runtime.h), "
                "unset it to search /usr/local/cuda and PATH, or set GPUOPT_CPU_ONLY=1 for a CPU-only build."
            )
        if not (Path(env_home) / "include" / "cuda_runtime.h").is_file():
            raise SystemExit(
                f"gpuopt setup: CUDA_HOME={env_home} has bin/nvcc but no include/cuda_runtime.h. "
                "Point CUDA_HOME at a complete toolkit or set GPUOPT_CPU_ONLY=1."
            )
        return env_home, f"CUDA_HOME={env_home}"
    default = Path("/usr/local/cuda")
    if (default / "bin" / "nvcc").is_file():
        return str(default), "/usr/local/cuda"
    which = shutil.which("nvcc")
    if which:
        # /usr/local/bin/nvcc may be a wrapper script: ask nvcc itself where its toolkit is is not portable,
        # so resolve symlinks and take the parent of bin/.
        real = Path(which).resolve()
        home = real.parent.parent
        if (home / "include" / "cuda_runtime.h").is_file():
            return str(home), f"nvcc on PATH ({which} -> {real})"
    return None, "no nvcc found (looked at $CUDA_HOME, /usr/local/cuda/bin/nvcc and nvcc on PATH)"


def _extensions():
    from torch.utils import cpp_extension

    cuda_home, reason = _find_cuda_home()
    sources = [str(CSRC / "ops.cpp"), str(CSRC / "checks.cpp")] + sorted(glob.glob(str(CSRC / "cpu" / "*.cpp")))
    cxx_flags = ["-O3", "-fopenmp", "-DNDEBUG", "-Wno-unknown-pragmas"]
    link_flags = ["-fopenmp"]
    include_dirs = [str(CSRC)]
    if cuda_home is None:
        _log(f"building the CPU-only extension ({reason}); CUDA kernels are not built.")
        return [
            cpp_extension.CppExtension(
                "gpuopt_ops._C",
                sources,
                include_dirs=include_dirs,
                extra_compile_args={"cxx": cxx_flags},
                extra_link_args=link_flags,
                py_limited_api=False,
            )
        ], cpp_extension

    os.environ["CUDA_HOME"] = cuda_home
    cpp_extension.CUDA_HOME = cuda_home  # torch reads it at import time; keep it in step with what we found
    if not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_ARCH_LIST
    _log(f"building CUDA + CPU kernels with the toolkit at {cuda_home} (found via {reason}), "
         f"TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']}")
    sources += sorted(glob.glob(str(CSRC / "cuda" / "*.cu")))
    nvcc_flags = ["-O3", "-DNDEBUG", "-lineinfo", "--expt-relaxed-constexpr"]
    return [
        cpp_extension.CUDAExtension(
            "gpuopt_ops._C",
            sources,
            include_dirs=include_dirs,
            extra_compile_args={"cxx": cxx_flags + ["-DGPUOPT_WITH_CUDA"], "nvcc": nvcc_flags},
            extra_link_args=link_flags,
            py_limited_api=False,
        )
    ], cpp_extension


def _build_info():
    import torch

    return f'TORCH_VERSION = "{torch.__version__}"\n'


ext_modules, cpp_extension = _extensions()
(ROOT / "gpuopt_ops" / "_build_info.py").write_text(
    "# Written by setup.py: the torch the extension was compiled against.\n" + _build_info()
)

setup(
    # The Triton kernels live in triton_kernels/ at the repository root but install as gpuopt_ops.triton_kernels:
    # the top-level name `triton_kernels` belongs to Triton's own package (imported by vLLM) and to PyPI's
    # triton-kernels.
    packages=["gpuopt_ops", "gpuopt_ops.triton_kernels"],
    package_dir={"gpuopt_ops.triton_kernels": "triton_kernels"},
    ext_modules=ext_modules,
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
)
