#include "cpu/dropout_mask.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fused_math.h"
#include "philox.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GPUOPT_X86_AVX2 1
#include <immintrin.h>
#endif

namespace gpuopt {
namespace {

// Groups g0 .. g0 + count - 1, lanes written in element order: lane k of group g at out[(g - g0) * 8 + k].
void philox_groups_scalar(uint64_t seed, uint64_t g0, int64_t count, uint16_t* out) {
  for (int64_t i = 0; i < count; ++i) {
    const Philox4x32 r = dropout_group_random(static_cast<int64_t>(seed), static_cast<int64_t>(g0 + i));
    for (int k = 0; k < 8; ++k) out[i * 8 + k] = static_cast<uint16_t>(philox_lane(r, k));
  }
}

#if GPUOPT_X86_AVX2
// 32x32 -> 64-bit products of the eight lanes of a with the constant m: low and high words.
__attribute__((target("avx2"))) inline void mulhilo8(__m256i a, __m256i m, __m256i& lo, __m256i& hi) {
  const __m256i even = _mm256_mul_epu32(a, m);                        // lanes 0, 2, 4, 6 (64-bit)
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);  // lanes 1, 3, 5, 7
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

// Stores 8 groups' outputs (word i of group l in lane l of ci) as 8 groups x 4 consecutive words: on
// little-endian x86 exactly the lane order k = 0 (w0 & 0xffff), 1 (w0 >> 16), 2 (w1 & 0xffff), ... 7 (w3 >> 16)
// of DESIGN.md, i.e. out[l * 8 + k] = lane k of group l.
__attribute__((target("avx2"))) inline void store_groups8(__m256i c0, __m256i c1, __m256i c2, __m256i c3,
                                                          uint16_t* out) {
  const __m256i t0 = _mm256_unpacklo_epi32(c0, c1);
  const __m256i t1 = _mm256_unpackhi_epi32(c0, c1);
  const __m256i t2 = _mm256_unpacklo_epi32(c2, c3);
  const __m256i t3 = _mm256_unpackhi_epi32(c2, c3);
  const __m256i q0 = _mm256_unpacklo_epi64(t0, t2);
  const __m256i q1 = _mm256_unpackhi_epi64(t0, t2);
  const __m256i q2 = _mm256_unpacklo_epi64(t1, t3);
  const __m256i q3 = _mm256_unpackhi_epi64(t1, t3);
  __m256i* dst = reinterpret_cast<__m256i*>(out);
  _mm256_storeu_si256(dst + 0, _mm256_permute2x128_si256(q0, q1, 0x20));
  _mm256_storeu_si256(dst + 1, _mm256_permute2x128_si256(q2, q3, 0x20));
  _mm256_storeu_si256(dst + 2, _mm256_permute2x128_si256(q0, q1, 0x31));
  _mm256_storeu_si256(dst + 3, _mm256_permute2x128_si256(q2, q3, 0x31));
}

// K x 8 Philox4x32-10 calls side by side: K independent 8-lane chains hide the multiply latency of the rounds.
// Groups g0 .. g0 + 8K - 1, written to out[0 .. 64K).
template <int K>
__attribute__((target("avx2"))) inline void philox_block_avx2(uint32_t key0, uint32_t key1, uint64_t g0,
                                                              uint16_t* out) {
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(kPhiloxM0));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(kPhiloxM1));
  __m256i c0[K], c1[K], c2[K], c3[K];
  for (int v = 0; v < K; ++v) {
    alignas(32) uint32_t lo_words[8], hi_words[8];
    for (int l = 0; l < 8; ++l) {
      const uint64_t g = g0 + static_cast<uint64_t>(v * 8 + l);
      lo_words[l] = static_cast<uint32_t>(g);
      hi_words[l] = static_cast<uint32_t>(g >> 32);
    }
    c0[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo_words));
    c1[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi_words));
    c2[v] = _mm256_setzero_si256();
    c3[v] = _mm256_setzero_si256();
  }
  uint32_t k0 = key0, k1 = key1;
  for (int round = 0; round < 10; ++round) {
    const __m256i vk0 = _mm256_set1_epi32(static_cast<int>(k0)), vk1 = _mm256_set1_epi32(static_cast<int>(k1));
    for (int v = 0; v < K; ++v) {
      // philox_round: c0' = hi1 ^ c1 ^ k0, c1' = lo1, c2' = hi0 ^ c3 ^ k1, c3' = lo0
      __m256i lo0, hi0, lo1, hi1;
      mulhilo8(c0[v], m0, lo0, hi0);
      mulhilo8(c2[v], m1, lo1, hi1);
      c0[v] = _mm256_xor_si256(_mm256_xor_si256(hi1, c1[v]), vk0);
      c1[v] = lo1;
      c2[v] = _mm256_xor_si256(_mm256_xor_si256(hi0, c3[v]), vk1);
      c3[v] = lo0;
    }
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  for (int v = 0; v < K; ++v) store_groups8(c0[v], c1[v], c2[v], c3[v], out + v * 64);
}

// GCC 12's avx512fintrin.h trips -Wuninitialized on its own _mm512_undefined passthroughs (GCC PR 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
__attribute__((target("avx512f"))) inline void mulhilo16(__m512i a, __m512i m, __m512i& lo, __m512i& hi) {
  const __m512i even = _mm512_mul_epu32(a, m);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
  lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

// The same with 16-lane AVX-512 vectors: K x 16 calls side by side, groups g0 .. g0 + 16K - 1. The transpose to
// group order reuses the 8-group AVX2 sequence on each 256-bit half.
template <int K>
__attribute__((target("avx512f,avx2"))) inline void philox_block_avx512(uint32_t key0, uint32_t key1, uint64_t g0,
                                                                        uint16_t* out) {
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(kPhiloxM0));
  const __m512i m1 = _mm512_set1_epi32(static_cast<int>(kPhiloxM1));
  __m512i c0[K], c1[K], c2[K], c3[K];
  for (int v = 0; v < K; ++v) {
    alignas(64) uint32_t lo_words[16], hi_words[16];
    for (int l = 0; l < 16; ++l) {
      const uint64_t g = g0 + static_cast<uint64_t>(v * 16 + l);
      lo_words[l] = static_cast<uint32_t>(g);
      hi_words[l] = static_cast<uint32_t>(g >> 32);
    }
    c0[v] = _mm512_load_si512(lo_words);
    c1[v] = _mm512_load_si512(hi_words);
    c2[v] = _mm512_setzero_si512();
    c3[v] = _mm512_setzero_si512();
  }
  uint32_t k0 = key0, k1 = key1;
  for (int round = 0; round < 10; ++round) {
    const __m512i vk0 = _mm512_set1_epi32(static_cast<int>(k0)), vk1 = _mm512_set1_epi32(static_cast<int>(k1));
    for (int v = 0; v < K; ++v) {
      __m512i lo0, hi0, lo1, hi1;
      mulhilo16(c0[v], m0, lo0, hi0);
      mulhilo16(c2[v], m1, lo1, hi1);
      c0[v] = _mm512_xor_si512(_mm512_xor_si512(hi1, c1[v]), vk0);
      c1[v] = lo1;
      c2[v] = _mm512_xor_si512(_mm512_xor_si512(hi0, c3[v]), vk1);
      c3[v] = lo0;
    }
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  for (int v = 0; v < K; ++v) {
    store_groups8(_mm512_castsi512_si256(c0[v]), _mm512_castsi512_si256(c1[v]), _mm512_castsi512_si256(c2[v]),
                  _mm512_castsi512_si256(c3[v]), out + v * 128);
    store_groups8(_mm512_extracti64x4_epi64(c0[v], 1), _mm512_extracti64x4_epi64(c1[v], 1),
                  _mm512_extracti64x4_epi64(c2[v], 1), _mm512_extracti64x4_epi64(c3[v], 1), out + v * 128 + 64);
  }
}

__attribute__((target("avx512f,avx2"))) void philox_groups_avx512(uint64_t seed, uint64_t g0, int64_t count,
                                                                  uint16_t* out) {
  const uint32_t key0 = static_cast<uint32_t>(seed), key1 = static_cast<uint32_t>(seed >> 32);
  int64_t i = 0;
  for (; i + 32 <= count; i += 32) philox_block_avx512<2>(key0, key1, g0 + static_cast<uint64_t>(i), out + i * 8);
  for (; i < count; i += 8) philox_block_avx2<1>(key0, key1, g0 + static_cast<uint64_t>(i), out + i * 8);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// count groups from g0, rounded up to a multiple of 8 (dropout_uniforms_capacity leaves room for that).
__attribute__((target("avx2"))) void philox_groups_avx2(uint64_t seed, uint64_t g0, int64_t count, uint16_t* out) {
  const uint32_t key0 = static_cast<uint32_t>(seed), key1 = static_cast<uint32_t>(seed >> 32);
  int64_t i = 0;
  for (; i + 32 <= count; i += 32) philox_block_avx2<4>(key0, key1, g0 + static_cast<uint64_t>(i), out + i * 8);
  for (; i < count; i += 8) philox_block_avx2<1>(key0, key1, g0 + static_cast<uint64_t>(i), out + i * 8);
}

// The widest Philox path this CPU runs: 2 = AVX-512F, 1 = AVX2, 0 = scalar. GPUOPT_CPU_PHILOX=scalar|avx2
// caps it (an instruction-set cap for users; it also lets one machine check every path against the reference).
int philox_path() {
  static const int path = [] {
    int p = __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0;
    if (const char* env = std::getenv("GPUOPT_CPU_PHILOX")) {
      if (std::strcmp(env, "scalar") == 0)
        p = 0;
      else if (std::strcmp(env, "avx2") == 0 && p > 1)
        p = 1;
    }
    return p;
  }();
  return path;
}
#endif

}  // namespace

const uint16_t* dropout_uniforms_row(int64_t seed, int64_t idx0, int64_t n, uint16_t* buf) {
  if (n <= 0) return buf;
  const int64_t first_group = idx0 >> 3;
  const int64_t groups = ((idx0 + n - 1) >> 3) - first_group + 1;
#if GPUOPT_X86_AVX2
  switch (philox_path()) {
    case 2:
      philox_groups_avx512(static_cast<uint64_t>(seed), static_cast<uint64_t>(first_group), groups, buf);
      return buf + (idx0 - first_group * 8);
    case 1:
      philox_groups_avx2(static_cast<uint64_t>(seed), static_cast<uint64_t>(first_group), groups, buf);
      return buf + (idx0 - first_group * 8);
    default:
      break;
  }
#endif
  philox_groups_scalar(static_cast<uint64_t>(seed), static_cast<uint64_t>(first_group), groups, buf);
  return buf + (idx0 - first_group * 8);
}

const uint16_t* dropout_uniforms_run(const DropoutSeed& s, int64_t i0, int64_t n, uint16_t* buf) {
  const ShardMap& m = s.map;
  if (n <= 0) return buf;
  if (m.jump == 0 || i0 / m.period == (i0 + n - 1) / m.period) return dropout_uniforms_row(s.seed, m.index(i0), n, buf);
  thread_local std::vector<uint16_t> piece;
  for (int64_t a = i0, end = i0 + n; a < end;) {
    const int64_t b = std::min(end, (a / m.period + 1) * m.period);
    piece.resize(static_cast<size_t>(dropout_uniforms_capacity(b - a)));
    const uint16_t* u = dropout_uniforms_row(s.seed, m.index(a), b - a, piece.data());
    std::copy(u, u + (b - a), buf + (a - i0));
    a = b;
  }
  return buf;
}

void dropout_keep_run(const DropoutSeed& s, int64_t i0, int64_t n, uint32_t threshold, uint8_t* keep) {
  if (n <= 0) return;
  std::vector<uint16_t> buf(dropout_uniforms_capacity(n));
  const uint16_t* u = dropout_uniforms_run(s, i0, n, buf.data());
  for (int64_t j = 0; j < n; ++j) keep[j] = dropout_keep(u[j], threshold) ? 1 : 0;
}

}  // namespace gpuopt
