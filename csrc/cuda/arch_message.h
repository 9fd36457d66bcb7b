// The error for a GPU that this build has no CUDA code for (instead of CUDA's "no kernel image is available"),
// apart from the CUDA runtime so the CPU tests can check its wording (tools/cuda_emu/emulated_ops.cpp).
#pragma once
#include <string>

namespace gpuopt::cuda {

// The TORCH_CUDA_ARCH_LIST the CUDA kernels were compiled for (setup.py passes it).
#ifndef GPUOPT_CUDA_ARCH_LIST
#define GPUOPT_CUDA_ARCH_LIST "unknown"
#endif
inline const char* built_arch_list() { return GPUOPT_CUDA_ARCH_LIST; }

// major.minor: the GPU's compute capability; device: its index; name: its name; built_for: the build's arch list.
inline std::string missing_arch_message(int major, int minor, int device, const std::string& name,
                                        const std::string& built_for) {
  const std::string cc = std::to_string(major) + "." + std::to_string(minor);
  return "gpuopt: this build of gpuopt_ops._C has no CUDA code for compute capability " + cc +
         " (cuda:" + std::to_string(device) + ", " + name + "): it was built with TORCH_CUDA_ARCH_LIST=\"" + built_for +
         "\". Rebuild it for this GPU with `TORCH_CUDA_ARCH_LIST=\"" + cc +
         "\" pip install --no-build-isolation .` (a build on this machine without TORCH_CUDA_ARCH_LIST targets "
         "its GPUs), or use the Triton kernels: backend=\"triton\".";
}

}  // namespace gpuopt::cuda
