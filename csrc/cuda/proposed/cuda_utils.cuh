// Device helpers shared by the CUDA kernels: deterministic warp / block sums, 16-byte vector access, dropout
// keep bits of a vector, and cached per-device launch facts (SM count, resident blocks of a kernel).
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "fused_math.h"
#include "philox.h"

namespace gpuopt {
namespace cuda {

constexpr int kWarpSize = 32;

// ---------------------------------------------------------------------------------------------------------------
// Reductions. The butterfly (xor) order leaves every lane with bitwise the same sum, because a + b == b + a
// exactly; the order of the additions depends only on the block size, so a given launch is deterministic.

template <typename T>
__device__ __forceinline__ T warp_reduce_sum(T v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over a 1-D block whose blockDim.x is a multiple of 32 (<= 1024); every thread must call it and gets the
// total. `shared` holds >= 32 values. The trailing barrier lets the caller reuse `shared` for the next sum.
template <typename T>
__device__ __forceinline__ T block_reduce_sum(T v, T* shared) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_reduce_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : T(0);
  v = warp_reduce_sum(v);  // every warp redoes the last step, so no broadcast round trip is needed
  __syncthreads();
  return v;
}

// Two sums in one pass (one pair of barriers). `shared` holds >= 64 values.
template <typename T>
__device__ __forceinline__ void block_reduce_sum2(T& a, T& b, T* shared) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  a = warp_reduce_sum(a);
  b = warp_reduce_sum(b);
  if (lane == 0) {
    shared[warp] = a;
    shared[kWarpSize + warp] = b;
  }
  __syncthreads();
  a = lane < warps ? shared[lane] : T(0);
  b = lane < warps ? shared[kWarpSize + lane] : T(0);
  a = warp_reduce_sum(a);
  b = warp_reduce_sum(b);
  __syncthreads();
}

// ---------------------------------------------------------------------------------------------------------------
// Vector access. Pack<T, VEC> is VEC consecutive elements with 16-byte alignment, so a pack of 8 fp16/bf16 is
// one 128-bit access and a pack of 8 fp32 (fp64) is two (four). Callers guarantee the 16-byte alignment.

template <typename T, int VEC>
struct alignas(16) Pack {
  T v[VEC];
};

template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> load_pack(const T* __restrict__ p) {
  static_assert(sizeof(T) * VEC % 16 == 0, "a vector pack must be a whole number of 16-byte words");
  return *reinterpret_cast<const Pack<T, VEC>*>(p);
}

// Loads VEC elements starting at p into acc_t registers; VEC == 1 is a plain scalar load (no alignment).
template <int VEC, typename acc_t, typename T>
__device__ __forceinline__ void load_acc(const T* __restrict__ p, acc_t (&out)[VEC]) {
  if constexpr (VEC == 1) {
    out[0] = static_cast<acc_t>(p[0]);
  } else {
    const Pack<T, VEC> pk = load_pack<T, VEC>(p);
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] = static_cast<acc_t>(pk.v[j]);
  }
}

// Like load_acc at p + offset, but p may be null (an absent weight or bias): then every value is `absent`.
template <int VEC, typename acc_t, typename T>
__device__ __forceinline__ void load_param(const T* __restrict__ p, int64_t offset, acc_t absent,
                                           acc_t (&out)[VEC]) {
  if (p == nullptr) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] = absent;
  } else {
    load_acc<VEC>(p + offset, out);
  }
}

// Stores VEC acc_t values at p, converted to T (round to nearest even).
template <int VEC, typename T, typename acc_t>
__device__ __forceinline__ void store_acc(T* __restrict__ p, const acc_t (&in)[VEC]) {
  if constexpr (VEC == 1) {
    p[0] = static_cast<T>(in[0]);
  } else {
    static_assert(sizeof(T) * VEC % 16 == 0, "a vector pack must be a whole number of 16-byte words");
    Pack<T, VEC> pk;
#pragma unroll
    for (int j = 0; j < VEC; ++j) pk.v[j] = static_cast<T>(in[j]);
    *reinterpret_cast<Pack<T, VEC>*>(p) = pk;
  }
}

inline bool is_aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---------------------------------------------------------------------------------------------------------------
// Dropout keep bits of VEC consecutive elements idx0 .. idx0 + VEC - 1: bit j set <=> element idx0 + j is kept.
// VEC == 8 needs idx0 % 8 == 0 and costs exactly one Philox call (the element group); VEC == 1 costs one call
// per element. threshold 0 (p = 0) and 65536 (p = 1) need no RNG at all.
template <int VEC>
__device__ __forceinline__ uint32_t dropout_keep_bits(int64_t seed, int64_t idx0, uint32_t threshold) {
  static_assert(VEC == 1 || VEC == 8, "keep bits come in vectors of 8 (one Philox group) or single elements");
  constexpr uint32_t kAll = (1u << VEC) - 1u;
  if (threshold == 0u) return kAll;
  if (threshold >= 65536u) return 0u;
  if constexpr (VEC == 8) {
    const Philox4x32 r = dropout_group_random(seed, idx0 >> 3);
    uint32_t bits = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) bits |= static_cast<uint32_t>(dropout_keep(philox_lane(r, j), threshold)) << j;
    return bits;
  } else {
    return static_cast<uint32_t>(dropout_keep(dropout_uniform16(seed, idx0), threshold));
  }
}

// The seed is read on the device (no host sync, so CUDA graphs capture the op), and only when the RNG is used.
__device__ __forceinline__ int64_t read_seed(const int64_t* __restrict__ seed, uint32_t threshold) {
  return (threshold != 0u && threshold < 65536u) ? seed[0] : int64_t(0);
}

template <typename acc_t>
__device__ __forceinline__ acc_t inverse_sqrt(acc_t v) {
  return acc_t(1) / sqrt(v);  // IEEE sqrt and division (no rsqrt approximation), as on the CPU
}

// ---------------------------------------------------------------------------------------------------------------
// Host side: cached per-device facts used to size grids. Grid sizes depend only on (shape, dtypes, device), so
// the same inputs on the same device give the same reduction order and therefore the same bits.

inline int sm_count(int device) {
  constexpr int kMaxDevices = 64;
  static int cache[kMaxDevices] = {};
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (device >= 0 && device < kMaxDevices && cache[device] > 0) return cache[device];
  int count = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  count = std::max(count, 1);
  if (device >= 0 && device < kMaxDevices) cache[device] = count;
  return count;
}

// Blocks of `kernel` with `threads` threads and `smem` dynamic shared bytes that fit on the whole device at
// once (occupancy x SMs). The device must be current (the launchers hold a CUDAGuard).
inline int64_t resident_blocks_impl(const void* kernel, int threads, size_t smem, int device) {
  using Key = std::tuple<const void*, int, size_t, int>;
  static std::map<Key, int64_t> cache;
  static std::mutex mutex;
  const Key key{kernel, threads, smem, device};
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  int per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  TORCH_CHECK(per_sm > 0, "gpuopt: internal error: a kernel cannot be launched with ", threads,
              " threads per block on this device");
  const int64_t blocks = static_cast<int64_t>(per_sm) * sm_count(device);
  std::lock_guard<std::mutex> lock(mutex);
  cache.emplace(key, blocks);
  return blocks;
}

template <typename Kernel>
int64_t resident_blocks(Kernel* kernel, int threads, size_t smem, int device) {
  return resident_blocks_impl(reinterpret_cast<const void*>(kernel), threads, smem, device);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Threads of a 1-D row block whose threads take `per_thread` of `work` items each: a multiple of 32 in [32, 1024].
inline int row_block_threads(int64_t work, int64_t per_thread) {
  const int64_t threads = ceil_div(ceil_div(work, per_thread), kWarpSize) * kWarpSize;
  return static_cast<int>(std::min<int64_t>(1024, std::max<int64_t>(kWarpSize, threads)));
}

// 2-D column-reduction kernels (grad_x plus per-column sums over rows): blocks of kTileX x kTileY threads, each
// thread VEC adjacent columns, kTileY rows at a time. The grid is col_tiles x chunks blocks, flattened into
// blockIdx.x (tile = blockIdx.x % col_tiles); chunk k owns rows [k * rows_per_chunk, (k + 1) * rows_per_chunk).
constexpr int kTileX = 32;
constexpr int kTileY = 8;

struct TileGrid {
  int64_t col_tiles, chunks, rows_per_chunk;
  unsigned blocks() const { return static_cast<unsigned>(col_tiles * chunks); }
};

// About one wave of `resident` blocks, and at least 32 rows per chunk so that the (chunks, N) partials stay a
// small fraction of the data. Depends only on (M, N, VEC, device).
inline TileGrid tile_grid(int64_t M, int64_t N, int vec, int64_t resident) {
  TileGrid t;
  t.col_tiles = ceil_div(N, static_cast<int64_t>(kTileX) * vec);
  const int64_t chunks = std::max<int64_t>(1, std::min(ceil_div(resident, t.col_tiles), ceil_div(M, 32)));
  t.rows_per_chunk = ceil_div(M, chunks);
  t.chunks = ceil_div(M, t.rows_per_chunk);  // no empty chunk
  TORCH_CHECK(t.col_tiles * t.chunks <= INT32_MAX, "gpuopt: N = ", N, " is too large for the CUDA grid");
  return t;
}

// ---------------------------------------------------------------------------------------------------------------
// Stage 2 of every deterministic column reduction: out[c] = sum over g = 0 .. rows-1 of partial[g * N + c],
// always in the same order. A 32 x 32 block takes 32 columns: thread (tx, ty) sums rows ty, ty + 32, ... of
// column tx in order (each warp reads 32 consecutive columns of one partial row), then thread (tx, 0) adds the
// 32 results in ty order. Up to two (partial, out) pairs per launch, picked by blockIdx.y (never a row index).
template <typename acc_t, typename out_t>
struct ColumnSumArgs {
  const acc_t* partial0;
  out_t* out0;
  const acc_t* partial1;
  out_t* out1;
};

constexpr int kColumnSumTile = 32;

template <typename acc_t, typename out_t>
__global__ __launch_bounds__(kColumnSumTile* kColumnSumTile) void column_sum_kernel(ColumnSumArgs<acc_t, out_t> args,
                                                                                     int64_t rows, int64_t N) {
  __shared__ acc_t sums[kColumnSumTile][kColumnSumTile + 1];
  const acc_t* __restrict__ partial = blockIdx.y == 0 ? args.partial0 : args.partial1;
  out_t* __restrict__ out = blockIdx.y == 0 ? args.out0 : args.out1;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColumnSumTile + tx;
  acc_t s = acc_t(0);
  if (col < N) {
    for (int64_t g = ty; g < rows; g += kColumnSumTile) s += partial[g * N + col];
  }
  sums[ty][tx] = s;
  __syncthreads();
  if (ty == 0 && col < N) {
    acc_t t = acc_t(0);
#pragma unroll
    for (int k = 0; k < kColumnSumTile; ++k) t += sums[k][tx];
    out[col] = static_cast<out_t>(t);
  }
}

// Sums the partial buffers (rows, N) of the pairs whose partial pointer is non-null into their outputs (N,).
template <typename acc_t, typename out_t>
void launch_column_sum(ColumnSumArgs<acc_t, out_t> args, int64_t rows, int64_t N, cudaStream_t stream) {
  if (args.partial0 == nullptr) {
    args.partial0 = args.partial1;
    args.out0 = args.out1;
    args.partial1 = nullptr;
    args.out1 = nullptr;
  }
  const unsigned count = (args.partial0 != nullptr ? 1u : 0u) + (args.partial1 != nullptr ? 1u : 0u);
  if (count == 0) return;
  const int64_t tiles = ceil_div(N, kColumnSumTile);
  TORCH_CHECK(tiles <= INT32_MAX, "gpuopt: N = ", N, " is too large for the column reduction grid");
  column_sum_kernel<acc_t, out_t><<<dim3(static_cast<unsigned>(tiles), count), dim3(kColumnSumTile, kColumnSumTile),
                                    0, stream>>>(args, rows, N);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace gpuopt
