// The one Philox4x32-10 definition (Salmon et al., SC'11; Random123), shared by the CPU and CUDA kernels.
// DESIGN.md "Dropout RNG" is the contract: key = (seed lo, seed hi), counter = (g lo, g hi, 0, 0) for the
// group g = idx >> 3 of 8 consecutive elements, element idx takes 16-bit lane idx & 7 of the four words.
#pragma once
#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define GPUOPT_HD __host__ __device__ __forceinline__
#else
#define GPUOPT_HD inline
#endif

namespace gpuopt {

struct Philox4x32 {
  uint32_t w[4];
};

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

GPUOPT_HD uint32_t mulhilo32(uint32_t a, uint32_t b, uint32_t* hi) {
#if defined(__CUDA_ARCH__)
  *hi = __umulhi(a, b);
  return a * b;
#else
  const uint64_t product = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *hi = static_cast<uint32_t>(product >> 32);
  return static_cast<uint32_t>(product);
#endif
}

// One Philox4x32 round on (c0, c1, c2, c3) with key (k0, k1), in place.
GPUOPT_HD void philox_round(uint32_t& c0, uint32_t& c1, uint32_t& c2, uint32_t& c3, uint32_t k0, uint32_t k1) {
  uint32_t hi0, hi1;
  const uint32_t lo0 = mulhilo32(kPhiloxM0, c0, &hi0);
  const uint32_t lo1 = mulhilo32(kPhiloxM1, c2, &hi1);
  c0 = hi1 ^ c1 ^ k0;
  c1 = lo1;
  c2 = hi0 ^ c3 ^ k1;
  c3 = lo0;
}

// Ten rounds of Philox4x32 on counter (c0, c1, c2, c3) with key (k0, k1); the key is bumped between rounds.
GPUOPT_HD Philox4x32 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    philox_round(c0, c1, c2, c3, k0, k1);
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return Philox4x32{{c0, c1, c2, c3}};
}

// The key schedule of a seed: round r uses key (k0 + r * W0, k1 + r * W1) mod 2^32, exactly the keys
// philox4x32_10 bumps to. A GPU thread computes it once and keeps it in registers, so each call is only its rounds.
struct PhiloxKey {
  uint32_t k0[10], k1[10];
};

GPUOPT_HD PhiloxKey philox_key_schedule(int64_t seed) {
  const uint64_t s = static_cast<uint64_t>(seed);
  PhiloxKey key;
  uint32_t k0 = static_cast<uint32_t>(s), k1 = static_cast<uint32_t>(s >> 32);
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    key.k0[round] = k0;
    key.k1[round] = k1;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return key;
}

// philox4x32_10 on counter (c0, c1, 0, 0) with a precomputed key schedule: the same bits.
GPUOPT_HD Philox4x32 philox4x32_10(uint32_t c0, uint32_t c1, const PhiloxKey& key) {
  uint32_t c2 = 0u, c3 = 0u;
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) philox_round(c0, c1, c2, c3, key.k0[round], key.k1[round]);
  return Philox4x32{{c0, c1, c2, c3}};
}

// The Philox call that serves the 8-element group g under the given seed.
GPUOPT_HD Philox4x32 dropout_group_random(int64_t seed, int64_t group) {
  const uint64_t s = static_cast<uint64_t>(seed);
  const uint64_t g = static_cast<uint64_t>(group);
  return philox4x32_10(static_cast<uint32_t>(g), static_cast<uint32_t>(g >> 32), 0u, 0u, static_cast<uint32_t>(s),
                       static_cast<uint32_t>(s >> 32));
}

// 16-bit lane k (0..7) of a Philox output: k = 0 -> w0 & 0xffff, 1 -> w0 >> 16, 2 -> w1 & 0xffff, ...
GPUOPT_HD uint32_t philox_lane(const Philox4x32& r, int k) {
  const uint32_t word = r.w[k >> 1];
  return (k & 1) ? (word >> 16) : (word & 0xffffu);
}

// The 16-bit uniform u of element idx (generic path: one Philox call per element).
GPUOPT_HD uint32_t dropout_uniform16(int64_t seed, int64_t idx) {
  return philox_lane(dropout_group_random(seed, idx >> 3), static_cast<int>(idx & 7));
}

// The numbering of a shard (DESIGN.md "Dropout RNG", sharded tensors). A seed tensor of 4 int64
// [seed, base, period, jump] numbers element i of the op's contiguous output idx(i) = i + base + (i / period) * jump:
// its linear index in the whole tensor the shard was cut from. A 1-element seed is the identity (base = jump = 0).
// Row ops take maps whose base, and unless jump is 0 period and jump, are multiples of N (a row keeps its elements
// consecutive); gated_act takes multiples of 8 (a group of 8 keeps its Philox call).
struct ShardMap {
  int64_t base = 0;
  int64_t period = 1;
  int64_t jump = 0;
  GPUOPT_HD int64_t index(int64_t i) const { return jump == 0 ? i + base : i + base + (i / period) * jump; }
};

// The map of a seed tensor's data: the identity for a 1-element seed (mapped false), else elements 1..3.
GPUOPT_HD ShardMap read_shard_map(const int64_t* seed, bool mapped) {
  ShardMap m;
  if (mapped) {
    m.base = seed[1];
    m.period = seed[2];
    m.jump = seed[3];
  }
  return m;
}

}  // namespace gpuopt
