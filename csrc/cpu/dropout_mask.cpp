#include "cpu/dropout_mask.h"

#include <algorithm>

#include "fused_math.h"
#include "philox.h"

namespace gpuopt {
namespace {

constexpr int kBatch = 16;  // Philox calls computed side by side: the rounds loop vectorizes across them

// Philox for the groups g0 .. g0 + count - 1 (count <= kBatch), the rounds written out across the batch so
// the compiler turns each round into SIMD multiplies. Same philox_round as the scalar (and CUDA) path.
__attribute__((target_clones("avx2", "default"))) void philox_batch(uint64_t seed, uint64_t g0, int count,
                                                                    uint32_t out[4][kBatch]) {
  uint32_t c0[kBatch], c1[kBatch], c2[kBatch], c3[kBatch];
  for (int i = 0; i < kBatch; ++i) {
    const uint64_t g = g0 + static_cast<uint64_t>(i < count ? i : 0);
    c0[i] = static_cast<uint32_t>(g);
    c1[i] = static_cast<uint32_t>(g >> 32);
    c2[i] = 0;
    c3[i] = 0;
  }
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    for (int i = 0; i < kBatch; ++i) philox_round(c0[i], c1[i], c2[i], c3[i], k0, k1);
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  for (int i = 0; i < kBatch; ++i) {
    out[0][i] = c0[i];
    out[1][i] = c1[i];
    out[2][i] = c2[i];
    out[3][i] = c3[i];
  }
}

}  // namespace

void dropout_keep_row(int64_t seed, int64_t idx0, int64_t n, uint32_t threshold, uint8_t* keep) {
  if (n <= 0) return;
  const int64_t first_group = idx0 >> 3;
  const int64_t last_group = (idx0 + n - 1) >> 3;
  uint32_t words[4][kBatch];
  for (int64_t g0 = first_group; g0 <= last_group; g0 += kBatch) {
    const int count = static_cast<int>(std::min<int64_t>(kBatch, last_group - g0 + 1));
    philox_batch(static_cast<uint64_t>(seed), static_cast<uint64_t>(g0), count, words);
    for (int i = 0; i < count; ++i) {
      const Philox4x32 r{{words[0][i], words[1][i], words[2][i], words[3][i]}};
      const int64_t base = (g0 + i) * 8;  // linear index of lane 0 of this group
      const int64_t lo = std::max<int64_t>(base, idx0), hi = std::min<int64_t>(base + 8, idx0 + n);
      for (int64_t idx = lo; idx < hi; ++idx) {
        keep[idx - idx0] = dropout_keep(philox_lane(r, static_cast<int>(idx - base)), threshold) ? 1 : 0;
      }
    }
  }
}

}  // namespace gpuopt
