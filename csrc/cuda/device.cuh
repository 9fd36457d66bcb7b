// The only place where the kernel headers meet a compiler: nvcc for the GPU, or the host C++ compiler under the
// CPU emulation of CUDA's execution model (tools/cuda_emu, GPUOPT_CUDA_EMULATOR). Everything the kernels
// need beyond plain C++ comes from here: element types and their conversions, 16-byte vector access, shared
// memory declarations, warp shuffles. No ATen / c10 (the emulator branch takes its 16-bit types from the
// emulator's own header).
#pragma once
#include <cstdint>
#include <cstring>

#include "dtypes.h"

#if defined(GPUOPT_CUDA_EMULATOR)

#include "cuda_emu.h"        // tools/cuda_emu (-I): threads as fibers, barriers, shuffles, guarded buffers
#include "cuda_emu_types.h"  // tools/cuda_emu (-I): half_t / bfloat16_t on the host

#define GPUOPT_DEV inline
#define GPUOPT_HOST_DEV inline

namespace gpuopt {
namespace dev {

using half_t = ::gpuopt_emu::half_t;
using bfloat16_t = ::gpuopt_emu::bfloat16_t;

inline float to_acc(half_t v) { return ::gpuopt_emu::to_float(v); }
inline float to_acc(bfloat16_t v) { return ::gpuopt_emu::to_float(v); }
// fp32 -> half_t / bfloat16_t, round to nearest even.
template <typename T>
inline T round_rn(float v) {
  return ::gpuopt_emu::from_float<T>(v);
}

// 16 bytes at p, which must be 16-byte aligned; the emulator checks the alignment and the bounds.
inline uint4 load16(const void* p) { return gpuopt_emu_load16(p); }
inline void store16(void* p, const uint4& v) { gpuopt_emu_store16(p, v); }
inline uint4 load16_shared(const void* p) { return gpuopt_emu_load16(p); }
inline int opaque_block_dim_x() { return static_cast<int>(blockDim.x); }

}  // namespace dev
}  // namespace gpuopt

#else  // nvcc

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define GPUOPT_DEV __device__ __forceinline__
#define GPUOPT_HOST_DEV __host__ __device__ __forceinline__
#define GPUOPT_SHARED_ARRAY(T, name, count) __shared__ T name[count]
// The launch's dynamic shared memory (the third <<<>>> parameter), 16-byte aligned.
#define GPUOPT_DYNAMIC_SHARED(T, name)                                    \
  extern __shared__ __align__(16) unsigned char gpuopt_dynamic_shared_[]; \
  T* name = reinterpret_cast<T*>(gpuopt_dynamic_shared_)

namespace gpuopt {
namespace dev {

using half_t = __half;
using bfloat16_t = __nv_bfloat16;

// torch's nvcc flags disable the implicit __half / __nv_bfloat16 conversions: convert explicitly.
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
// fp32 -> __half / __nv_bfloat16, round to nearest even.
template <typename T>
__device__ __forceinline__ T round_rn(float v);
template <>
__device__ __forceinline__ __half round_rn<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 round_rn<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// A volatile asm load: the compiler keeps the kernels' 16-byte loads in program order (each kernel writes a row's
// loads back to back before the math that uses them), where its scheduler would otherwise sink a load of a
// register-hungry kernel below the first math to reuse registers (a second round trip a row). Only global
// memory the kernel does not write is read this way.
__device__ __forceinline__ uint4 load16(const void* p) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ void store16(void* p, const uint4& v) { *reinterpret_cast<uint4*>(p) = v; }
// 16 bytes of shared memory (or memory the kernel writes): an ordinary load the compiler may schedule.
__device__ __forceinline__ uint4 load16_shared(const void* p) { return *reinterpret_cast<const uint4*>(p); }
// blockDim.x, read where it is called (volatile: the compiler neither hoists nor reuses it).
__device__ __forceinline__ int opaque_block_dim_x() {
  int v;
  asm volatile("mov.u32 %0, %%ntid.x;" : "=r"(v));
  return v;
}

}  // namespace dev
}  // namespace gpuopt

#endif

namespace gpuopt {
namespace dev {

GPUOPT_DEV float to_acc(float v) { return v; }
GPUOPT_DEV double to_acc(double v) { return v; }

// acc_t -> storage type, round to nearest even: the 16-bit types from fp32 by round_rn (one definition for each
// compiler, above), fp32 and fp64 as they are.
template <typename T>
struct FromAcc {
  static GPUOPT_DEV T from(float v) { return round_rn<T>(v); }
};
template <>
struct FromAcc<float> {
  static GPUOPT_DEV float from(float v) { return v; }
};
template <>
struct FromAcc<double> {
  static GPUOPT_DEV double from(double v) { return v; }
};

template <typename T, typename A>
GPUOPT_DEV T from_acc(A v) {
  return FromAcc<T>::from(v);
}

// Accumulation type: dtypes.h's, fp64 for fp64 storage, fp32 otherwise (DESIGN.md).
template <typename T>
using acc_t_of = acc_type_t<T>;

}  // namespace dev
}  // namespace gpuopt
