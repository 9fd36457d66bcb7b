// Device helpers shared by the kernels: groups of 8 elements (one Philox call, DESIGN.md) loaded and stored as
// 16-byte vectors when aligned, deterministic warp and row sums, dropout keep bits. Raw pointers only.
#pragma once
#include <cstdint>
#include <type_traits>

#include "cuda/device.cuh"
#include "cuda/launch_config.h"
#include "fused_math.h"
#include "philox.h"

namespace gpuopt {
namespace dev {

using cuda::ceil_div;  // launch_config.h
using cuda::kGroup;    // elements per group: one Philox call, one or more 16-byte vectors
using cuda::kWarpSize;

GPUOPT_HOST_DEV int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Elements of the group starting at column c0 < N of a row of N: 8, or fewer for the last group of a row.
GPUOPT_HOST_DEV int group_size(int64_t N, int64_t c0) { return static_cast<int>(min64(kGroup, N - c0)); }

// f(u, i + u * stride) for each u < U whose index is below `end`, unrolled: one phase of the kernels that take U
// rows (or groups) of their stride at a time, all their loads first and then their math.
template <int U, class F>
GPUOPT_DEV void for_each_below(int64_t i, int64_t stride, int64_t end, F&& f) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t iu = i + u * stride;
    if (iu < end) f(u, iu);
  }
}

// Loads the group of 8 elements at p, `valid` of which exist (the rest read as 0), into acc_t registers.
// vec: p is 16-byte aligned and all 8 exist, so the group is sizeof(T) / 2 16-byte loads.
template <typename T, typename A>
GPUOPT_DEV void load_group(const T* __restrict__ p, int valid, bool vec, A (&v)[kGroup]) {
  if (vec) {
    constexpr int kWords = kGroup * sizeof(T) / 16;
    uint4 raw[kWords];
#pragma unroll
    for (int w = 0; w < kWords; ++w) raw[w] = load16(reinterpret_cast<const char*>(p) + 16 * w);
    T s[kGroup];
    memcpy(s, raw, sizeof(s));  // a register move, not a copy through memory
#pragma unroll
    for (int j = 0; j < kGroup; ++j) v[j] = to_acc(s[j]);
  } else {
#pragma unroll
    for (int j = 0; j < kGroup; ++j) v[j] = j < valid ? to_acc(p[j]) : A(0);
  }
}

// The raw storage of a group (rows kept in registers stay in their 16-bit form: half the registers of fp32).
template <typename T>
struct Group {
  T v[kGroup];
};

template <typename T>
GPUOPT_DEV void load_raw_group(const T* __restrict__ p, int valid, bool vec, Group<T>& g) {
  if (vec) {
    constexpr int kWords = kGroup * sizeof(T) / 16;
    uint4 raw[kWords];
#pragma unroll
    for (int w = 0; w < kWords; ++w) raw[w] = load16(reinterpret_cast<const char*>(p) + 16 * w);
    memcpy(g.v, raw, sizeof(raw));
  } else {
#pragma unroll
    for (int j = 0; j < kGroup; ++j) g.v[j] = j < valid ? p[j] : from_acc<T>(acc_t_of<T>(0));
  }
}

template <typename T, typename A>
GPUOPT_DEV void store_group(T* __restrict__ p, int valid, bool vec, const A (&v)[kGroup]) {
  T s[kGroup];
#pragma unroll
  for (int j = 0; j < kGroup; ++j) s[j] = from_acc<T>(v[j]);
  if (vec) {
    constexpr int kWords = kGroup * sizeof(T) / 16;
    uint4 raw[kWords];
    memcpy(raw, s, sizeof(raw));
#pragma unroll
    for (int w = 0; w < kWords; ++w) store16(reinterpret_cast<char*>(p) + 16 * w, raw[w]);
  } else {
#pragma unroll
    for (int j = 0; j < kGroup; ++j)
      if (j < valid) p[j] = s[j];
  }
}

// A weight or bias group; p == nullptr (no weight / bias) gives `absent` everywhere.
template <typename T, typename A>
GPUOPT_DEV void load_param_group(const T* __restrict__ p, int64_t c0, int valid, bool vec, A absent, A (&v)[kGroup]) {
  if (p == nullptr) {
#pragma unroll
    for (int j = 0; j < kGroup; ++j) v[j] = absent;
  } else {
    load_group(p + c0, valid, vec, v);
  }
}

// A raw group's 8 values in the accumulation type. bf16 pairs come straight from their 32-bit words (a shift and
// a mask), so the compiler does not first move each 16-bit value into a register of its own.
template <typename T, typename A>
GPUOPT_DEV void unpack_group(const Group<T>& g, A (&out)[kGroup]) {
#if !defined(GPUOPT_CUDA_EMULATOR)
  if constexpr (std::is_same<T, __nv_bfloat16>::value && sizeof(A) == 4) {
    uint32_t w[kGroup / 2];
    memcpy(w, g.v, sizeof(w));
#pragma unroll
    for (int i = 0; i < kGroup / 2; ++i) {
      out[2 * i] = __uint_as_float(w[i] << 16);
      out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  } else  // NOLINT(readability/braces): the else of the CUDA-only branch above
#endif
  {
#pragma unroll
    for (int j = 0; j < kGroup; ++j) out[j] = static_cast<A>(to_acc(g.v[j]));
  }
}

// Makes a held group opaque to the compiler (an empty asm that may have rewritten its words, no instruction): a
// conversion of it after this point is computed again from the held words instead of being kept from an earlier
// one, or hoisted out of the row loop, in more registers.
template <typename T>
GPUOPT_DEV void opaque(Group<T>& g) {
#if defined(__CUDA_ARCH__)
  static_assert(sizeof(Group<T>) % 4 == 0, "whole 32-bit words");
  uint32_t w[sizeof(Group<T>) / 4];
  memcpy(w, g.v, sizeof(w));
#pragma unroll
  for (int i = 0; i < int(sizeof(w) / 4); ++i) asm volatile("" : "+r"(w[i]));
  memcpy(g.v, w, sizeof(w));
#else
  (void)g;
#endif
}

// opaque() for a held group of parameter values (a weight's or bias's kGroup elements in their own type).
template <typename T>
GPUOPT_DEV void opaque(T (&a)[kGroup]) {
#if defined(__CUDA_ARCH__)
  static_assert(sizeof(a) % 4 == 0, "whole 32-bit words");
  uint32_t w[sizeof(a) / 4];
  memcpy(w, a, sizeof(w));
#pragma unroll
  for (int i = 0; i < int(sizeof(w) / 4); ++i) asm volatile("" : "+r"(w[i]));
  memcpy(a, w, sizeof(w));
#else
  (void)a;
#endif
}

// The raw group of a weight or bias at column c0, as load_raw_group (p == nullptr: `absent` everywhere).
template <typename T>
GPUOPT_DEV void load_raw_param(const T* __restrict__ p, int64_t c0, int valid, bool vec, T absent, Group<T>& g) {
  if (p == nullptr) {
#pragma unroll
    for (int j = 0; j < kGroup; ++j) g.v[j] = absent;
  } else {
    load_raw_group(p + c0, valid, vec, g);
  }
}

// Butterfly sum over the 32 lanes: every lane ends with bitwise the same value (a + b == b + a exactly).
template <typename A>
GPUOPT_DEV A warp_sum(A v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the blockDim.x threads of a row (a multiple of 32); every thread of the row gets it. One warp per
// row needs no shared memory; more warps (then blockDim.y == 1) meet in `shared`, >= 32 values per sum. The
// caller alternates between two such buffers on consecutive calls, so no trailing barrier is needed: a buffer
// is rewritten only after the barrier of the call in between, which every thread passes after reading it.
// kWarpRow: the kernel is compiled for one warp a row, so the block part is not even compiled in.
template <bool kWarpRow = false, typename A>
GPUOPT_DEV A row_sum(A v, A* shared) {
  v = warp_sum(v);
  if (kWarpRow || blockDim.x == kWarpSize) return v;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / kWarpSize) ? shared[lane] : A(0);
  return warp_sum(v);
}

// Two sums at once (one barrier); `shared` holds >= 64 values per call, alternated like row_sum's.
template <bool kWarpRow = false, typename A>
GPUOPT_DEV void row_sum2(A& a, A& b, A* shared) {
  a = warp_sum(a);
  b = warp_sum(b);
  if (kWarpRow || blockDim.x == kWarpSize) return;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) {
    shared[warp] = a;
    shared[kWarpSize + warp] = b;
  }
  __syncthreads();
  const bool in = lane < static_cast<int>(blockDim.x / kWarpSize);
  a = warp_sum(in ? shared[lane] : A(0));
  b = warp_sum(in ? shared[kWarpSize + lane] : A(0));
}

// Keep bits (bit j <=> element idx0 + j kept) of the group of 8 elements at linear index idx0, `valid` of them.
// With N % 8 == 0 a group starts at a multiple of 8 and is exactly one Philox call; otherwise each element
// takes its lane from its own call. No RNG at p = 0 (threshold 0) or p = 1 (threshold 65536).
GPUOPT_DEV uint32_t keep_bits(int64_t seed, int64_t idx0, int valid, uint32_t threshold, bool one_call) {
  if (threshold == 0u) return 0xffu;
  if (threshold >= 65536u) return 0u;
  uint32_t bits = 0;
  if (one_call) {
    const Philox4x32 r = dropout_group_random(seed, idx0 >> 3);
#pragma unroll
    for (int j = 0; j < kGroup; ++j) bits |= static_cast<uint32_t>(dropout_keep(philox_lane(r, j), threshold)) << j;
  } else {
#pragma unroll
    for (int j = 0; j < kGroup; ++j)
      if (j < valid) bits |= static_cast<uint32_t>(dropout_keep(dropout_uniform16(seed, idx0 + j), threshold)) << j;
  }
  return bits;
}

// Dropout of the 16-byte vector path (N % 8 == 0: a group is one Philox call), as keep_bits with one_call: the
// keep test of each 16-bit lane is one compare of the output word. Without RNG (threshold 0 or 65536) the words
// are taken as 0, which the thresholds turn into keep-all or drop-all.
// kHoist: the key schedule is computed once a thread and its 20 keys stay live in registers, so a call is only
// its rounds. Derived straight from the seed, the compiler would redo the key adds (one a key a round) on every
// call; passed through a shuffle once, the keys are values it keeps instead. Without kHoist (kernels that need
// those registers) each call adds its keys.
template <bool kHoist>
struct GroupDropout {
  static constexpr int kKeys = kHoist ? 10 : 1;
  uint32_t k0[kKeys], k1[kKeys];
  uint32_t t_lo;  // even lane j = 2i: keep <=> (w_i & 0xffff) >= t_lo
  uint32_t t_hi;  // odd lane j = 2i + 1: keep <=> (w_i >> 16) >= threshold <=> w_i >= t_hi
  bool rng;       // 0 < threshold < 65536

  // Called where all 32 lanes of the warp are active (the shuffles).
  GPUOPT_DEV GroupDropout(int64_t seed, uint32_t threshold)
      : t_lo(threshold),
        t_hi(threshold == 0u ? 0u : (threshold >= 65536u ? 0xffffffffu : threshold << 16)),
        rng(threshold != 0u && threshold < 65536u) {
    const PhiloxKey key = philox_key_schedule(seed);
#pragma unroll
    for (int r = 0; r < kKeys; ++r) {
      k0[r] = kHoist ? __shfl_sync(0xffffffffu, key.k0[r], 0) : key.k0[r];
      k1[r] = kHoist ? __shfl_sync(0xffffffffu, key.k1[r], 0) : key.k1[r];
    }
  }

  // keep[j] of the 8 elements of group `group` (linear index 8 * group + j).
  GPUOPT_DEV void keep(int64_t group, bool (&out)[kGroup]) const {
    Philox4x32 r{{0u, 0u, 0u, 0u}};
    if (rng) {
      const uint64_t g = static_cast<uint64_t>(group);
      const uint32_t c0 = static_cast<uint32_t>(g), c1 = static_cast<uint32_t>(g >> 32);
      if (kHoist) {
        PhiloxKey key;
#pragma unroll
        for (int i = 0; i < 10; ++i) {
          key.k0[i] = k0[kHoist ? i : 0];
          key.k1[i] = k1[kHoist ? i : 0];
        }
        r = philox4x32_10(c0, c1, key);
      } else {
        r = philox4x32_10(c0, c1, 0u, 0u, k0[0], k1[0]);
      }
    }
#pragma unroll
    for (int i = 0; i < kGroup / 2; ++i) {
      out[2 * i] = (r.w[i] & 0xffffu) >= t_lo;
      out[2 * i + 1] = r.w[i] >= t_hi;
    }
  }
};

// The seed is read on the device (no host sync, so CUDA graphs capture the op), and only when the RNG runs.
GPUOPT_DEV int64_t read_seed(const int64_t* __restrict__ seed, uint32_t threshold) {
  return (threshold != 0u && threshold < 65536u) ? seed[0] : int64_t(0);
}

// The kernels' `mapped` launch argument (host side): the seed tensor holds a shard map and the RNG runs, so the
// map is read only where the seed is (read_seed).
GPUOPT_HOST_DEV bool read_map(const DropoutParams& d) { return d.mapped && d.threshold != 0u && d.threshold < 65536u; }

// n / d (d > 0) without the 64-bit division routine, which is a call whose frame gives the row kernels a stack
// (the static resource gate allows none): a 32-bit division where both fit, else shift and subtract, a bit a step,
// the quotient's bits shifted into n as its own leave (maps of tensors past 2^32 elements only).
GPUOPT_DEV uint64_t div_u64(uint64_t n, uint64_t d) {
  if (((n | d) >> 32) == 0) return static_cast<uint32_t>(n) / static_cast<uint32_t>(d);
  uint64_t r = 0;  // r < d < 2^63: r << 1 does not overflow
#pragma unroll 1
  for (int b = 0; b < 64; ++b) {
    r = (r << 1) | (n >> 63);
    n <<= 1;
    if (r >= d) {
      r -= d;
      n |= 1u;
    }
  }
  return n;
}

// The dropout index of element i of an op's contiguous output (DESIGN.md "Dropout RNG", philox.h ShardMap): i
// itself, or, when `mapped` (the seed tensor holds a shard map [seed, base, period, jump] and
// the RNG runs), i + base + (i / period) * jump, its index in the whole tensor (ShardMap::index, with div_u64 for
// the division, none when jump == 0). The map is read from the seed tensor at each call (once a row, or a group
// for gated_act; an L1 hit), so no register holds it across a row. Only the kernels' *_mapped_kernel instances
// call it (launched where `mapped` holds): a 1-element seed's kernels have no map code at all.
GPUOPT_DEV int64_t dropout_index(const int64_t* __restrict__ seed, bool mapped, int64_t i) {
  if (!mapped) return i;
  const ShardMap m = read_shard_map(seed, true);
  if (m.jump == 0) return i + m.base;  // i >= 0, period > 0 (checked with the map)
  return i + m.base + static_cast<int64_t>(div_u64(static_cast<uint64_t>(i), static_cast<uint64_t>(m.period))) * m.jump;
}

// A read the compiler does not keep from an earlier one (nor hoist out of a loop into a register).
template <typename T>
GPUOPT_DEV T load_volatile(const T* p) {
  return *static_cast<const volatile T*>(p);
}

GPUOPT_HOST_DEV bool is_aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace dev
}  // namespace gpuopt
