// Kernels of the emulator's self-test (tests/test_emulator_runtime.py), in plain CUDA style, and torch-free
// host wrappers that run them on DeviceBuffers. Compiles as C++17 with only cuda_emu.h (the test checks that);
// runtime_selftest.cpp exposes the wrappers as torch ops. Comments "// @name" mark lines the test's expected
// messages refer to.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_emu.h"

namespace selftest {

constexpr unsigned kFull = 0xffffffffu;

// ---------------------------------------------------------------------------------------------------------------
// Block sums: a shared-memory tree, and two warp-shuffle forms (xor butterfly; down + idx broadcast).

__global__ void __launch_bounds__(1024) block_sum_tree(const float* __restrict__ x, float* __restrict__ out) {
  GPUOPT_SHARED_ARRAY(float, s, 1024);
  const unsigned t = threadIdx.x;
  const size_t row = static_cast<size_t>(blockIdx.x) * blockDim.x;
  s[t] = x[row + t];
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  out[row + t] = s[0];
}

template <typename T>
__device__ __forceinline__ T warp_sum_xor(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFull, v, offset);
  return v;
}

template <typename T>
__device__ __forceinline__ T warp_sum_down(T v) {
  for (unsigned offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(kFull, v, offset);
  return __shfl_sync(kFull, v, 0);  // only lane 0 holds the sum
}

template <typename T, bool kDown>
__global__ void __launch_bounds__(1024) block_sum_warp(const float* __restrict__ x, float* __restrict__ out) {
  GPUOPT_SHARED_ARRAY(T, partial, 32);
  const unsigned t = threadIdx.x, lane = t % 32, warp = t / 32, warps = blockDim.x / 32;
  const size_t row = static_cast<size_t>(blockIdx.x) * blockDim.x;
  T v = static_cast<T>(x[row + t]);
  v = kDown ? warp_sum_down(v) : warp_sum_xor(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : T(0);
  v = kDown ? warp_sum_down(v) : warp_sum_xor(v);
  out[row + t] = static_cast<float>(v);
}

// The tree over dynamic shared memory, each value 64 bytes apart (1024 threads: 64 KiB, past the static limit),
// written and read as 16-byte vectors.
__global__ void __launch_bounds__(1024) block_sum_dynamic(const float* __restrict__ x, float* __restrict__ out) {
  GPUOPT_DYNAMIC_SHARED(float, s);
  const unsigned t = threadIdx.x;
  const size_t row = static_cast<size_t>(blockIdx.x) * blockDim.x;
  const float v = x[row + t];
  uint4 q;
  std::memcpy(&q, &v, sizeof v);
  q.y = q.z = q.w = 0;
  gpuopt_emu_store16(s + 16 * t, q);
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (t < stride) s[16 * t] += s[16 * (t + stride)];
    __syncthreads();
  }
  out[row + t] = s[0];
}

// method: "tree", "xor" (float), "xor_double", "down" (float), "dynamic" (the tree in dynamic shared memory)
inline void block_sum(const float* x, float* out, int blocks, int threads, const std::string& method) {
  const size_t n = static_cast<size_t>(blocks) * threads;
  gpuopt_emu::DeviceBuffer dx("x", x, n * sizeof(float)), dout("out", n * sizeof(float));
  const dim3 grid(blocks), block(threads);
  if (method == "tree") {
    GPUOPT_EMU_LAUNCH(block_sum_tree, grid, block, 1024, dx.data_as<float>(), dout.data_as<float>());
  } else if (method == "xor") {
    GPUOPT_EMU_LAUNCH((block_sum_warp<float, false>), grid, block, 1024, dx.data_as<float>(), dout.data_as<float>());
  } else if (method == "xor_double") {
    GPUOPT_EMU_LAUNCH((block_sum_warp<double, false>), grid, block, 1024, dx.data_as<float>(),
                      dout.data_as<float>());
  } else if (method == "down") {
    GPUOPT_EMU_LAUNCH((block_sum_warp<float, true>), grid, block, 1024, dx.data_as<float>(), dout.data_as<float>());
  } else if (method == "dynamic") {
    gpuopt_emu::launch_kernel_shared("block_sum_dynamic", grid, block, 1024, size_t(threads) * 64, block_sum_dynamic,
                                     dx.data_as<float>(), dout.data_as<float>());
  } else {
    throw std::invalid_argument("block_sum: unknown method " + method);
  }
  dout.copy_to_host(out, n * sizeof(float));
}

// ---------------------------------------------------------------------------------------------------------------
// One warp op per thread of a 1-D block, all lanes with the full mask (or per-half masks for "xor_halves").

enum class Shfl { idx, up, down, xor_, xor_halves, xor_split_sites };

template <typename T>
__global__ void shuffle_kernel(const T* __restrict__ in, T* __restrict__ out, Shfl op, int arg, int width) {
  const unsigned t = threadIdx.x + blockIdx.x * blockDim.x;
  const unsigned lane = threadIdx.x % 32;
  const T v = in[t];
  T r = v;
  switch (op) {
    case Shfl::idx: r = __shfl_sync(kFull, v, arg, width); break;
    case Shfl::up: r = __shfl_up_sync(kFull, v, static_cast<unsigned>(arg), width); break;
    case Shfl::down: r = __shfl_down_sync(kFull, v, static_cast<unsigned>(arg), width); break;
    case Shfl::xor_: r = __shfl_xor_sync(kFull, v, arg, width); break;
    case Shfl::xor_halves:  // two independent 16-lane groups of one warp
      r = __shfl_xor_sync(lane < 16 ? 0x0000ffffu : 0xffff0000u, v, arg, width);
      break;
    case Shfl::xor_split_sites:  // the same op and mask reached from two call sites (legal since Volta)
      if (lane % 2 == 0) r = __shfl_xor_sync(kFull, v, arg, width);
      else r = __shfl_xor_sync(kFull, v, arg, width);
      break;
  }
  out[t] = r;
}

inline Shfl parse_shfl(const std::string& op) {
  static const std::map<std::string, Shfl> ops = {{"idx", Shfl::idx},   {"up", Shfl::up},
                                                  {"down", Shfl::down}, {"xor", Shfl::xor_},
                                                  {"xor_halves", Shfl::xor_halves},
                                                  {"xor_split_sites", Shfl::xor_split_sites}};
  auto it = ops.find(op);
  if (it == ops.end()) throw std::invalid_argument("shuffle: unknown op " + op);
  return it->second;
}

template <typename T>
void shuffle(const T* in, T* out, int threads, const std::string& op, int arg, int width) {
  gpuopt_emu::DeviceBuffer din("in", in, threads * sizeof(T)), dout("out", threads * sizeof(T));
  GPUOPT_EMU_LAUNCH(shuffle_kernel<T>, dim3(1), dim3(threads), 1024, din.data_as<T>(), dout.data_as<T>(),
                    parse_shfl(op), arg, width);
  dout.copy_to_host(out, threads * sizeof(T));
}

// Votes: out[t] = ballot / all / any over the full warp, and __syncthreads_count / _and / _or over the block.
__global__ void vote_kernel(const int* __restrict__ pred, int64_t* __restrict__ out) {
  const unsigned t = threadIdx.x;
  const int p = pred[t];
  int64_t* o = out + 6 * static_cast<size_t>(t);
  o[0] = static_cast<int64_t>(__ballot_sync(kFull, p));
  o[1] = __all_sync(kFull, p);
  o[2] = __any_sync(kFull, p);
  o[3] = __syncthreads_count(p);
  o[4] = __syncthreads_and(p);
  o[5] = __syncthreads_or(p);
  __syncwarp();
}

inline void vote(const int* pred, int64_t* out, int threads) {
  gpuopt_emu::DeviceBuffer dp("pred", pred, threads * sizeof(int)), dout("out", threads * 6 * sizeof(int64_t));
  GPUOPT_EMU_LAUNCH(vote_kernel, dim3(1), dim3(threads), 1024, dp.data_as<int>(), dout.data_as<int64_t>());
  dout.copy_to_host(out, threads * 6 * sizeof(int64_t));
}

// ---------------------------------------------------------------------------------------------------------------
// Shared memory: what a block reads before writing (the poison), the arrays' addresses and alignment.

__global__ void shared_poison_kernel(uint32_t* __restrict__ fbits, uint64_t* __restrict__ dbits,
                                     int* __restrict__ nan, int64_t* __restrict__ addr) {
  GPUOPT_SHARED_ARRAY(float, f, 256);
  GPUOPT_SHARED_ARRAY(double, d, 256);
  const unsigned t = threadIdx.x;
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + t;
  const float fv = f[t];
  const double dv = d[t];
  std::memcpy(&fbits[i], &fv, 4);
  std::memcpy(&dbits[i], &dv, 8);
  nan[i] = std::isnan(fv) && std::isnan(dv);
  addr[2 * i] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(f));
  addr[2 * i + 1] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(d));
  __syncthreads();
  f[t] = static_cast<float>(blockIdx.x * 1000 + t);  // what the next block must not see
  d[t] = static_cast<double>(blockIdx.x * 1000 + t);
  __syncthreads();
}

inline void shared_poison(uint32_t* fbits, uint64_t* dbits, int* nan, int64_t* addr, int blocks, int threads) {
  const size_t n = static_cast<size_t>(blocks) * threads;
  gpuopt_emu::DeviceBuffer df("fbits", n * 4), dd("dbits", n * 8), dn("nan", n * sizeof(int)), da("addr", n * 16);
  GPUOPT_EMU_LAUNCH(shared_poison_kernel, dim3(blocks), dim3(threads), 256, df.data_as<uint32_t>(),
                    dd.data_as<uint64_t>(), dn.data_as<int>(), da.data_as<int64_t>());
  df.copy_to_host(fbits, n * 4);
  dd.copy_to_host(dbits, n * 8);
  dn.copy_to_host(nan, n * sizeof(int));
  da.copy_to_host(addr, n * 16);
}

// ---------------------------------------------------------------------------------------------------------------
// Built-in indices in a 3-D block / 2-D grid, read again after every switch point. Per thread 8 values:
// threadIdx.x, .y, .z; linear id re-read after a barrier; after a shuffle; the warp leader's linear id (idx
// shuffle); the linear block id after a barrier; mismatches of threadIdx/blockIdx re-read around 16 barriers.

__global__ void indices_kernel(int64_t* __restrict__ out) {
  const unsigned nt = blockDim.x * blockDim.y * blockDim.z;
  const unsigned lin = threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y;
  const unsigned blk = blockIdx.x + blockIdx.y * gridDim.x + blockIdx.z * gridDim.x * gridDim.y;
  int64_t* o = out + 8 * (static_cast<size_t>(blk) * nt + lin);
  o[0] = threadIdx.x;
  o[1] = threadIdx.y;
  o[2] = threadIdx.z;
  __syncthreads();
  o[3] = threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y;
  const unsigned leader = __shfl_sync(kFull, lin, 0);
  o[4] = threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y;
  o[5] = leader;
  __syncthreads();
  o[6] = blockIdx.x + blockIdx.y * gridDim.x + blockIdx.z * gridDim.x * gridDim.y;
  int64_t bad = 0;
  for (int k = 0; k < 16; ++k) {
    const unsigned before = threadIdx.x, before_b = blockIdx.x;
    if (k % 2) __syncthreads();
    else __syncwarp();
    bad += (threadIdx.x != before) + (blockIdx.x != before_b) + (threadIdx.x != o[0]);
  }
  o[7] = bad;
}

inline void indices(int64_t* out, dim3 grid, dim3 block) {
  const size_t n = static_cast<size_t>(grid.x) * grid.y * grid.z * block.x * block.y * block.z;
  gpuopt_emu::DeviceBuffer dout("out", n * 8 * sizeof(int64_t));
  GPUOPT_EMU_LAUNCH(indices_kernel, grid, block, 1024, dout.data_as<int64_t>());
  dout.copy_to_host(out, n * 8 * sizeof(int64_t));
}

// ---------------------------------------------------------------------------------------------------------------
// Block order: thread 0 of each block appends its linear block id.

__global__ void order_kernel(int* __restrict__ counter, int* __restrict__ order) {
  if (threadIdx.x == 0) order[(*counter)++] = static_cast<int>(blockIdx.x + blockIdx.y * gridDim.x);
}

inline void block_order(int* order, int gx, int gy) {
  gpuopt_emu::DeviceBuffer dc("counter", sizeof(int)), dorder("order", static_cast<size_t>(gx) * gy * sizeof(int));
  dc.fill(0);
  GPUOPT_EMU_LAUNCH(order_kernel, dim3(gx, gy), dim3(64), 64, dc.data_as<int>(), dorder.data_as<int>());
  dorder.copy_to_host(order, dorder.bytes());
}

// ---------------------------------------------------------------------------------------------------------------
// Checked 16-byte loads: thread 0 of block 0 loads 16 bytes at `x + byte_offset` of a mirror of host data
// (same misalignment modulo 256) and returns the sum of the four words; also loads from shared and local memory.

__global__ void load16_kernel(const unsigned char* __restrict__ x, int64_t byte_offset, int64_t* __restrict__ out) {
  GPUOPT_SHARED_ARRAY(uint4, staged, 2);
  if (threadIdx.x == 0) {
    const uint4 v = gpuopt_emu_load16(x + byte_offset);
    gpuopt_emu_store16(&staged[1], v);          // shared memory
    const uint4 s = gpuopt_emu_load16(&staged[1]);
    uint4 local[2];
    gpuopt_emu_store16(&local[1], s);           // local memory (the thread's stack)
    const uint4 l = gpuopt_emu_load16(&local[1]);
    out[0] = int64_t(l.x) + l.y + l.z + l.w;
  }
}

inline int64_t load16_sum(const void* host, size_t bytes, int64_t byte_offset, int64_t* misalignment) {
  gpuopt_emu::DeviceBuffer dx("x", host, bytes), dout("out", sizeof(int64_t));
  *misalignment = static_cast<int64_t>(reinterpret_cast<uintptr_t>(dx.data()) % 256);
  GPUOPT_EMU_LAUNCH(load16_kernel, dim3(2), dim3(32), 1024, dx.data_as<const unsigned char>(), byte_offset,
                    dout.data_as<int64_t>());
  return dout.to_vector<int64_t>()[0];
}

// ---------------------------------------------------------------------------------------------------------------
// Misbehaving kernels: each run_error_case(name) must throw.

__global__ void partial_barrier(float* out) {
  if (blockIdx.x == 3 && threadIdx.x >= 96) return;
  __syncthreads();  // @partial_barrier
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f;
}

__global__ void divergent_barrier(float* out) {
  if (threadIdx.x < 64) {
    __syncthreads();  // @divergent_a
  } else {
    __syncthreads();  // @divergent_b
  }
  out[threadIdx.x] = 1.0f;
}

__global__ void warp_barrier_deadlock(float* out) {
  float v = static_cast<float>(threadIdx.x);
  if (threadIdx.x == 5) {
    __syncthreads();  // @deadlock_barrier
  } else {
    v = __shfl_xor_sync(kFull, v, 1);  // @deadlock_shfl
    __syncthreads();
  }
  out[threadIdx.x] = v;
}

__global__ void shfl_exited_lane(float* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_down_sync(kFull, 1.0f, 1);  // @exited_shfl
}

__global__ void warp_mismatch(float* out) {
  float v = 1.0f;
  if (threadIdx.x < 16) v = __shfl_xor_sync(kFull, v, 1);  // @mismatch_shfl
  else v = static_cast<float>(__ballot_sync(kFull, 1));    // @mismatch_ballot
  out[threadIdx.x] = v;
}

__global__ void shfl_unmasked_source(float* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0x0000ffffu, 1.0f, 20);  // @unmasked_source
}

__global__ void lane_not_in_mask(float* out) {
  out[threadIdx.x] = __shfl_sync(threadIdx.x == 3 ? 0x1u : kFull, 1.0f, 0);  // @not_in_mask
}

__global__ void bad_width(float* out) { out[threadIdx.x] = __shfl_xor_sync(kFull, 1.0f, 1, 3); }  // @bad_width

__global__ void partial_warp_mask(float* out) { out[threadIdx.x] = __shfl_xor_sync(kFull, 1.0f, 1); }  // @partial_warp

__global__ void write_past_end(float* out, int n) {
  if (blockIdx.x == 1 && threadIdx.x == 0) out[n] = 0.0f;
  else if (static_cast<int>(threadIdx.x) < n) out[threadIdx.x] = 1.0f;
}

__global__ void write_before_start(float* out) {
  if (threadIdx.x == 0) out[-2] = 0.0f;
}

__global__ void misaligned_load16(const unsigned char* x, unsigned char* y) {
  if (blockIdx.x == 1 && threadIdx.x == 5) gpuopt_emu_store16(y, gpuopt_emu_load16(x + 6));
}

__global__ void oob_load16(const unsigned char* x) {
  if (threadIdx.x == 0) (void)gpuopt_emu_load16(x + 32);
}

__global__ void oob_store16(unsigned char* y) {
  if (threadIdx.x == 0) gpuopt_emu_store16(y + 48, uint4{1, 2, 3, 4});
}

__global__ void shared_oob_load16() {
  GPUOPT_SHARED_ARRAY(float, tile, 4);
  if (threadIdx.x == 0) (void)gpuopt_emu_load16(tile + 4);
}

__global__ void shared_49k(float* out) {
  GPUOPT_SHARED_ARRAY(float, small, 1024);
  GPUOPT_SHARED_ARRAY(float, big, 11520);  // @shared_big (4 KiB + 45 KiB = 49 KiB)
  small[threadIdx.x] = 0.0f;
  big[threadIdx.x] = 0.0f;
  out[threadIdx.x] = small[threadIdx.x] + big[threadIdx.x];
}

__global__ void dynamic_oob_load16() {
  GPUOPT_DYNAMIC_SHARED(float, dyn);
  if (threadIdx.x == 0) (void)gpuopt_emu_load16(dyn + 64);  // the launch gives 256 bytes
}

__global__ void dynamic_none(float* out) {
  GPUOPT_DYNAMIC_SHARED(float, dyn);  // @dynamic_none
  out[threadIdx.x] = dyn[threadIdx.x];
}

__global__ void dynamic_plus_static(float* out) {
  GPUOPT_SHARED_ARRAY(float, tile, 1024);  // @dynamic_plus_static (4 KiB, next to 224 KiB of dynamic memory)
  tile[threadIdx.x] = 0.0f;
  out[threadIdx.x] = tile[threadIdx.x];
}

__global__ void shared_size_mismatch(float* out) {
  GPUOPT_SHARED_ARRAY(float, buf, 32 + (threadIdx.x == 7 ? 1 : 0));  // @shared_mismatch
  buf[threadIdx.x % 32] = 1.0f;
  out[threadIdx.x] = 1.0f;
}

__global__ void kernel_fail(float*) {
  if (blockIdx.x == 2 && threadIdx.x == 7) gpuopt_emu::fail("custom failure");
}

__global__ void kernel_throw(float*) {
  if (threadIdx.x == 9) throw std::out_of_range("index 9 is out of range");
}

__global__ void noop_kernel(float*) {}

__global__ void nested_launch(float* out) {
  if (threadIdx.x == 0) GPUOPT_EMU_LAUNCH(noop_kernel, dim3(1), dim3(1), 1, out);
}

// Fatal errors (the process dies; the test runs them in a subprocess).
__global__ void wild_write(float* out) {
  float* volatile wild = reinterpret_cast<float*>(uintptr_t(64));  // far outside every guard: the null page
  if (threadIdx.x == 3) wild[0] = 1.0f;
  out[threadIdx.x] = 1.0f;
}

__device__ int recurse(int depth) {
  volatile char frame[1024];
  frame[0] = static_cast<char>(depth);
  return depth >= (1 << 30) ? 0 : recurse(depth + 1) + frame[0];
}

__global__ void stack_overflow(float* out) {
  if (blockIdx.x == 1 && threadIdx.x == 2) out[0] = static_cast<float>(recurse(0));
}

inline void run_error_case(const std::string& name) {
  gpuopt_emu::DeviceBuffer out("out", 1024 * 4 * sizeof(float));
  float* o = out.data_as<float>();
  if (name == "partial_barrier") {
    GPUOPT_EMU_LAUNCH(partial_barrier, dim3(4), dim3(128), 1024, o);
  } else if (name == "divergent_barrier") {
    GPUOPT_EMU_LAUNCH(divergent_barrier, dim3(1), dim3(128), 1024, o);
  } else if (name == "warp_barrier_deadlock") {
    GPUOPT_EMU_LAUNCH(warp_barrier_deadlock, dim3(1), dim3(64), 1024, o);
  } else if (name == "shfl_exited_lane") {
    GPUOPT_EMU_LAUNCH(shfl_exited_lane, dim3(1), dim3(32), 1024, o);
  } else if (name == "warp_mismatch") {
    GPUOPT_EMU_LAUNCH(warp_mismatch, dim3(1), dim3(32), 1024, o);
  } else if (name == "shfl_unmasked_source") {
    GPUOPT_EMU_LAUNCH(shfl_unmasked_source, dim3(1), dim3(32), 1024, o);
  } else if (name == "lane_not_in_mask") {
    GPUOPT_EMU_LAUNCH(lane_not_in_mask, dim3(1), dim3(32), 1024, o);
  } else if (name == "bad_width") {
    GPUOPT_EMU_LAUNCH(bad_width, dim3(1), dim3(32), 1024, o);
  } else if (name == "partial_warp_mask") {
    GPUOPT_EMU_LAUNCH(partial_warp_mask, dim3(1), dim3(48), 1024, o);
  } else if (name == "write_past_end") {
    gpuopt_emu::DeviceBuffer small("out", 100 * sizeof(float));
    GPUOPT_EMU_LAUNCH(write_past_end, dim3(2), dim3(128), 1024, small.data_as<float>(), 100);
  } else if (name == "write_before_start") {
    gpuopt_emu::DeviceBuffer small("out", 100 * sizeof(float));
    GPUOPT_EMU_LAUNCH(write_before_start, dim3(1), dim3(32), 1024, small.data_as<float>());
  } else if (name == "misaligned_load16") {
    gpuopt_emu::DeviceBuffer x("x", 64), y("y", 64);
    GPUOPT_EMU_LAUNCH(misaligned_load16, dim3(2), dim3(32), 1024, x.data_as<const unsigned char>(),
                      y.data_as<unsigned char>());
  } else if (name == "oob_load16") {
    gpuopt_emu::DeviceBuffer x("x", 40);
    GPUOPT_EMU_LAUNCH(oob_load16, dim3(1), dim3(32), 1024, x.data_as<const unsigned char>());
  } else if (name == "oob_store16") {
    gpuopt_emu::DeviceBuffer y("y", 56);
    GPUOPT_EMU_LAUNCH(oob_store16, dim3(1), dim3(32), 1024, y.data_as<unsigned char>());
  } else if (name == "shared_oob_load16") {
    GPUOPT_EMU_LAUNCH(shared_oob_load16, dim3(1), dim3(32), 1024);
  } else if (name == "shared_49k") {
    GPUOPT_EMU_LAUNCH(shared_49k, dim3(1), dim3(256), 1024, o);
  } else if (name == "dynamic_oob_load16") {
    gpuopt_emu::launch_kernel_shared("dynamic_oob_load16", dim3(1), dim3(32), 1024, 256, dynamic_oob_load16);
  } else if (name == "dynamic_none") {
    GPUOPT_EMU_LAUNCH(dynamic_none, dim3(1), dim3(32), 1024, o);
  } else if (name == "dynamic_plus_static") {
    gpuopt_emu::launch_kernel_shared("dynamic_plus_static", dim3(1), dim3(32), 1024, 224 * 1024, dynamic_plus_static,
                                     o);
  } else if (name == "dynamic_228k") {
    gpuopt_emu::launch_kernel_shared("noop_kernel", dim3(1), dim3(32), 1024, 228 * 1024, noop_kernel, o);
  } else if (name == "shared_size_mismatch") {
    GPUOPT_EMU_LAUNCH(shared_size_mismatch, dim3(1), dim3(32), 1024, o);
  } else if (name == "kernel_fail") {
    GPUOPT_EMU_LAUNCH(kernel_fail, dim3(4), dim3(32), 1024, o);
  } else if (name == "kernel_throw") {
    GPUOPT_EMU_LAUNCH(kernel_throw, dim3(1), dim3(32), 1024, o);
  } else if (name == "nested_launch") {
    GPUOPT_EMU_LAUNCH(nested_launch, dim3(1), dim3(32), 1024, o);
  } else if (name == "wild_write") {
    GPUOPT_EMU_LAUNCH(wild_write, dim3(1), dim3(32), 1024, o);
  } else if (name == "stack_overflow") {
    GPUOPT_EMU_LAUNCH(stack_overflow, dim3(2), dim3(32), 1024, o);
  } else if (name == "threads_1025") {
    GPUOPT_EMU_LAUNCH(noop_kernel, dim3(1), dim3(1025), 1024, o);
  } else if (name == "threads_513x2") {
    GPUOPT_EMU_LAUNCH(noop_kernel, dim3(1), dim3(513, 2), 1024, o);
  } else if (name == "block_z_65") {
    GPUOPT_EMU_LAUNCH(noop_kernel, dim3(1), dim3(1, 1, 65), 1024, o);
  } else if (name == "grid_y_65536") {
    GPUOPT_EMU_LAUNCH(noop_kernel, dim3(1, 65536), dim3(32), 1024, o);
  } else if (name == "grid_z_65536") {
    GPUOPT_EMU_LAUNCH(noop_kernel, dim3(1, 1, 65536), dim3(32), 1024, o);
  } else if (name == "grid_x_2pow31") {
    GPUOPT_EMU_LAUNCH(noop_kernel, dim3(2147483648u), dim3(32), 1024, o);
  } else if (name == "grid_zero") {
    GPUOPT_EMU_LAUNCH(noop_kernel, dim3(0), dim3(32), 1024, o);
  } else if (name == "block_zero") {
    GPUOPT_EMU_LAUNCH(noop_kernel, dim3(1), dim3(32, 0), 1024, o);
  } else if (name == "launch_bounds") {
    GPUOPT_EMU_LAUNCH(noop_kernel, dim3(1), dim3(512), 256, o);
  } else {
    throw std::invalid_argument("run_error_case: unknown case " + name);
  }
}

// "kernel grid block ok" per launch since the last clear, one a line.
inline std::string launch_log_text() {
  std::string out;
  auto fmt = [](const dim3& d) {
    return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
  };
  for (const auto& r : gpuopt_emu::launch_log()) {
    out += r.kernel + " " + fmt(r.grid) + " " + fmt(r.block) + (r.ok ? " ok" : " failed") + "\n";
  }
  return out;
}

}  // namespace selftest
