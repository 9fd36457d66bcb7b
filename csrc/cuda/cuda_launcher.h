// The GPU Backend of torch_ops.h and its Launcher (launch.cuh), on the LibTorch stable ABI: x's device made
// current (accelerator::DeviceGuard), launches on torch's current stream for that device (the AOTI C shim),
// occupancy and SM count cached per (device, kernel, block size, dynamic shared memory), scratch memory from torch's caching allocator
// (torch::stable::empty; freed when the op returns: stream-ordered, so safe once the launches are enqueued).
// Before a kernel's first launch on a device, the runtime is asked whether the build has code for that GPU, so
// a GPU outside TORCH_CUDA_ARCH_LIST gets cuda/arch_message.h's error instead of "no kernel image".
#pragma once
#ifndef USE_CUDA
#define USE_CUDA  // the CUDA part of the AOTI C shim (aoti_torch_get_current_cuda_stream)
#endif
#include <cuda_runtime.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/arch_message.h"
#include "cuda/launch.cuh"
#include "torch_stable.h"

namespace gpuopt {

#define GPUOPT_CUDA_CHECK(expr)                                                                                    \
  do {                                                                                                             \
    const cudaError_t gpuopt_err_ = (expr);                                                                        \
    GPUOPT_CHECK(gpuopt_err_ == cudaSuccess, "gpuopt: CUDA error: ", cudaGetErrorString(gpuopt_err_), " (", #expr, \
                 ")");                                                                                             \
  } while (0)

// A device attribute, read once per (attribute, device).
inline int cached_device_attribute(cudaDeviceAttr attr, int device) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, int> cache;
  std::lock_guard<std::mutex> lock(mutex);
  const std::pair<int, int> key{static_cast<int>(attr), device};
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int v = 0;
  GPUOPT_CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, device));
  cache.emplace(key, v);
  return v;
}

inline int cached_sm_count(int device) {
  return std::max(cached_device_attribute(cudaDevAttrMultiProcessorCount, device), 1);
}

// The shared memory one block may have on `device` (static + dynamic, the opt-in maximum), bytes.
inline int64_t cached_shared_per_block(int device) {
  return cached_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
}

// Throws the arch error when the build has no code for `device`.
inline void check_kernel_image(const void* kernel, int device) {
  cudaFuncAttributes attr{};
  const cudaError_t err = cudaFuncGetAttributes(&attr, kernel);
  if (err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction ||
      err == cudaErrorInvalidKernelImage) {
    (void)cudaGetLastError();  // not sticky: clear it so torch's next CUDA call does not see it
    cudaDeviceProp prop{};
    GPUOPT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    fail(cuda::missing_arch_message(prop.major, prop.minor, device, prop.name, cuda::built_arch_list()));
  }
  if (err == cudaErrorUnsupportedPtxVersion) {
    (void)cudaGetLastError();
    fail(
        str_cat("gpuopt: the GPU driver is older than the CUDA toolkit gpuopt_ops._C was built with, so it "
                "cannot compile the build's PTX for this GPU (",
                cudaGetErrorString(err),
                "). Update the driver, "
                "rebuild with TORCH_CUDA_ARCH_LIST set to this GPU's compute capability, or use "
                "backend=\"triton\"."));
  }
  GPUOPT_CUDA_CHECK(err);
}

// What a launch of `kernel` on `device` needs first, under one lock and one lookup per launch: the arch check
// (check_kernel_image, once per kernel and device) and, past CUDA's default 48 KiB, the kernel's dynamic shared
// memory limit (raised once per kernel and device to the most any launch asked for).
inline void prepare_launch(const void* kernel, int64_t dynamic_shared, int device) {
  struct State {
    bool image_checked = false;
    int64_t dynamic_allowed = 48 * 1024;
  };
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, State> states;
  std::lock_guard<std::mutex> lock(mutex);
  State& state = states[{kernel, device}];
  if (!state.image_checked) {
    check_kernel_image(kernel, device);  // throws (the state stays unchecked) when the build has no code for it
    state.image_checked = true;
  }
  if (dynamic_shared > state.dynamic_allowed) {
    GPUOPT_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dynamic_shared)));
    state.dynamic_allowed = dynamic_shared;
  }
}

inline int cached_blocks_per_sm(const void* kernel, int threads, int64_t dynamic_shared, int device) {
  using Key = std::tuple<const void*, int, int64_t, int>;
  static std::mutex mutex;
  static std::map<Key, int> cache;
  const Key key{kernel, threads, dynamic_shared, device};
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  prepare_launch(kernel, dynamic_shared, device);
  int per_sm = 0;
  GPUOPT_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, static_cast<size_t>(dynamic_shared)));
  GPUOPT_CHECK(per_sm > 0, "gpuopt: internal error: a kernel cannot run with ", threads,
               " threads per block on this device (too many registers or too much shared memory)");
  std::lock_guard<std::mutex> lock(mutex);
  cache.emplace(key, per_sm);
  return per_sm;
}

inline cudaStream_t current_stream(int device) {
  void* stream = nullptr;
  GPUOPT_CHECK(aoti_torch_get_current_cuda_stream(device, &stream) == AOTI_TORCH_SUCCESS,
               "gpuopt: internal error: cannot get the current CUDA stream of cuda:", device);
  return static_cast<cudaStream_t>(stream);
}

struct CudaLauncher {
  int device;
  cudaStream_t stream;
  Tensor like;  // scratch goes on its device
  std::vector<Tensor> scratch_tensors;

  explicit CudaLauncher(const Tensor& x) : device(x.get_device_index()), stream(current_stream(device)), like(x) {}

  int sm_count() const { return cached_sm_count(device); }
  int64_t shared_per_block() const { return cached_shared_per_block(device); }

  template <class P>
  int blocks_per_sm(void (*kernel)(P), int threads, int64_t dynamic_shared = 0) const {
    return cached_blocks_per_sm(reinterpret_cast<const void*>(kernel), threads, dynamic_shared, device);
  }

  template <class P>
  void run(const char* name, void (*kernel)(P), dim3 grid, dim3 block, int, const P& params,
           int64_t dynamic_shared = 0) {
    prepare_launch(reinterpret_cast<const void*>(kernel), dynamic_shared, device);
    kernel<<<grid, block, static_cast<size_t>(dynamic_shared), stream>>>(params);
    const cudaError_t err = cudaGetLastError();
    GPUOPT_CHECK(err == cudaSuccess, "gpuopt: launching the CUDA kernel ", name, " failed: ", cudaGetErrorString(err));
  }

  template <class T>
  T* scratch(int64_t count) {
    scratch_tensors.push_back(empty_on(like, {count * static_cast<int64_t>(sizeof(T))}, kByte));
    return reinterpret_cast<T*>(scratch_tensors.back().data_ptr());
  }
};

struct CudaBackend {
  torch::stable::accelerator::DeviceGuard guard;
  CudaLauncher launch;

  explicit CudaBackend(const Tensor& x) : guard(x.get_device_index()), launch(x) {}
  const void* in(const char*, const Tensor& t) const { return t.defined() ? t.data_ptr() : nullptr; }
  void* out(const char*, const Tensor& t) const { return t.data_ptr(); }
  CudaLauncher& launcher() { return launch; }
  void finish() {}
};

}  // namespace gpuopt
