"""Build of gpuopt_ops._C: CUDA + CPU kernels when nvcc is found, CPU-only otherwise (or GPUOPT_CPU_ONLY=1).

_C is built against the LibTorch stable ABI (TORCH_TARGET_VERSION = 2.11) and Python's limited API (abi3,
3.10), so one wheel serves torch >= 2.11 and Python >= 3.10:
    pip wheel --no-build-isolation --no-deps . -w dist/     ->  dist/gpuopt-<version>-cp310-abi3-linux_x86_64.whl
GPU code: TORCH_CUDA_ARCH_LIST when set; otherwise the capabilities of the GPUs this machine has (when torch sees
any); otherwise DEFAULT_ARCH_LIST (sm_80 code, which also runs on 8.6/8.9, plus sm_90 code and compute_90 PTX,
which the driver compiles for newer GPUs).
"""

import glob
import os
import shutil
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"
DEFAULT_ARCH_LIST = "8.0;9.0+PTX"
TORCH_TARGET_VERSION = "0x020b000000000000"  # 2.11.0: the oldest torch the binary loads in


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


def _arch_list():
    """(TORCH_CUDA_ARCH_LIST to build, why)."""
    env = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if env:
        return env, "from the environment"
    try:
        import torch

        caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    except Exception as err:  # no driver, no GPU, a CPU-only torch
        caps, why = [], f"no GPU visible ({type(err).__name__})"
    else:
        why = "no GPU visible"
    if caps:
        archs = [f"{major}.{minor}" for major, minor in caps]
        archs[-1] += "+PTX"
        return ";".join(archs), "the GPUs of this machine; set TORCH_CUDA_ARCH_LIST to build for others"
    return DEFAULT_ARCH_LIST, f"the default: {why}; set TORCH_CUDA_ARCH_LIST to choose"


def _extensions():
    from torch.utils import cpp_extension

    cuda_home, reason = _find_cuda_home()
    sources = [str(CSRC / "ops.cpp"), str(CSRC / "checks.cpp")] + sorted(glob.glob(str(CSRC / "cpu" / "*.cpp")))
    # py_limited_api=True makes torch's build_ext add -DPy_LIMITED_API (its oldest supported Python, 3.10).
    # Hidden visibility: torch::stable's types are hidden, and only PyInit__C needs exporting.
    abi_flags = [f"-DTORCH_TARGET_VERSION={TORCH_TARGET_VERSION}"]
    cxx_flags = ["-O3", "-fopenmp", "-DNDEBUG", "-Wno-unknown-pragmas", "-fvisibility=hidden"] + abi_flags
    # the build's record (csrc/ops.cpp keeps it in the library; gpuopt_ops/build_info.py reads it)
    cxx_flags.append(f'-DGPUOPT_BUILT_WITH_TORCH="{_torch_version()}"')
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
                py_limited_api=True,
            )
        ], cpp_extension

    os.environ["CUDA_HOME"] = cuda_home
    cpp_extension.CUDA_HOME = cuda_home  # torch reads it at import time; keep it in step with what we found
    arch_list, arch_reason = _arch_list()
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list
    _log(
        f"building CUDA + CPU kernels with the toolkit at {cuda_home} (found via {reason}), "
        f"TORCH_CUDA_ARCH_LIST={arch_list} ({arch_reason})"
    )
    sources += sorted(glob.glob(str(CSRC / "cuda" / "*.cu")))
    cxx_flags.append(f'-DGPUOPT_CUDA_ARCH_LIST="{arch_list}"')
    nvcc_flags = [
        "-O3",
        "-DNDEBUG",
        "-lineinfo",
        "--expt-relaxed-constexpr",
        f'-DGPUOPT_CUDA_ARCH_LIST="{arch_list}"',
        "-Xcompiler",
        "-fvisibility=hidden",
    ] + abi_flags
    return [
        cpp_extension.CUDAExtension(
            "gpuopt_ops._C",
            sources,
            include_dirs=include_dirs,
            extra_compile_args={"cxx": cxx_flags + ["-DGPUOPT_WITH_CUDA"], "nvcc": nvcc_flags},
            extra_link_args=link_flags,
            py_limited_api=True,
        )
    ], cpp_extension


def _torch_version() -> str:
    import torch

    return torch.__version__


# Run by pip / setuptools (both execute this file as __main__); tests import it for _arch_list.
if __name__ == "__main__":
    ext_modules, cpp_extension = _extensions()

    setup(
        # The Triton kernels live in triton_kernels/ at the repository root but install as gpuopt_ops.triton_kernels:
        # the top-level name `triton_kernels` belongs to Triton's own package (imported by vLLM) and to PyPI's
        # triton-kernels.
        packages=["gpuopt_ops", "gpuopt_ops.train", "gpuopt_ops.triton_kernels"],
        package_dir={"gpuopt_ops.triton_kernels": "triton_kernels"},
        ext_modules=ext_modules,
        cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
        options={"bdist_wheel": {"py_limited_api": "cp310"}},  # one wheel, tagged cp310-abi3, for Python >= 3.10
    )
