// The GPU Backend of ops_glue.h and its Launcher (launch.cuh): x's device made current, launches on its current
// stream, occupancy and SM count cached per (device, kernel, block size), scratch memory from torch's caching
// allocator (freed when the op returns: stream-ordered, so safe once the launches are enqueued).
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "cuda/launch.cuh"

namespace gpuopt {

inline int cached_sm_count(int device) {
  static std::mutex mutex;
  static std::map<int, int> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(device);
  if (it != cache.end()) return it->second;
  int n = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  n = std::max(n, 1);
  cache.emplace(device, n);
  return n;
}

inline int cached_blocks_per_sm(const void* kernel, int threads, int device) {
  using Key = std::tuple<const void*, int, int>;
  static std::mutex mutex;
  static std::map<Key, int> cache;
  const Key key{kernel, threads, device};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  TORCH_CHECK(per_sm > 0, "gpuopt: internal error: a kernel cannot run with ", threads,
              " threads per block on this device (too many registers or too much shared memory)");
  cache.emplace(key, per_sm);
  return per_sm;
}

struct CudaLauncher {
  int device;
  cudaStream_t stream;
  at::TensorOptions byte_options;
  std::vector<at::Tensor> scratch_tensors;

  explicit CudaLauncher(const at::Tensor& like)
      : device(like.get_device()),
        stream(c10::cuda::getCurrentCUDAStream(like.get_device()).stream()),
        byte_options(like.options().dtype(at::kByte)) {}

  int sm_count() const { return cached_sm_count(device); }

  template <class P>
  int blocks_per_sm(void (*kernel)(P), int threads) const {
    return cached_blocks_per_sm(reinterpret_cast<const void*>(kernel), threads, device);
  }

  template <class P>
  void run(const char*, void (*kernel)(P), dim3 grid, dim3 block, int, const P& params) {
    kernel<<<grid, block, 0, stream>>>(params);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  template <class T>
  T* scratch(int64_t count) {
    scratch_tensors.push_back(at::empty({count * static_cast<int64_t>(sizeof(T))}, byte_options));
    return reinterpret_cast<T*>(scratch_tensors.back().data_ptr());
  }
};

struct CudaBackend {
  c10::cuda::CUDAGuard guard;
  CudaLauncher launch;

  explicit CudaBackend(const at::Tensor& x) : guard(x.device()), launch(x) {}
  const void* in(const char*, const at::Tensor& t) const { return t.defined() ? t.data_ptr() : nullptr; }
  void* out(const char*, const at::Tensor& t) const { return t.data_ptr(); }
  CudaLauncher& launcher() { return launch; }
  void finish() {}
};

}  // namespace gpuopt
