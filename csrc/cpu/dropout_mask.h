// Dropout uniforms of a run of consecutive elements on the CPU, from the Philox definition in philox.h.
#pragma once
#include <cstdint>

#include "fused_math.h"
#include "philox.h"
#include "torch_stable.h"

namespace gpuopt {

// Capacity (in uint16_t) that dropout_uniforms_row needs for a run of n elements.
constexpr int64_t dropout_uniforms_capacity(int64_t n) { return ((n + 14) / 8 + 8) * 8; }

// The 16-bit uniforms u (DESIGN.md "Dropout RNG") of the elements idx0 .. idx0 + n - 1 under `seed`:
// returns p with p[j] = u(idx0 + j) for j in [0, n), a pointer into buf, which must hold
// dropout_uniforms_capacity(n) values. One Philox4x32-10 call per group of 8 elements; on x86-64 with AVX2 or
// AVX-512F 8 or 16 calls run side by side in vector registers (same bits as the scalar philox4x32_10). The
// environment variable GPUOPT_CPU_PHILOX=scalar or =avx2, read once, caps the instruction set used (as ATen's
// ATEN_CPU_CAPABILITY does), e.g. where AVX-512 lowers the clock of the cores the model shares.
const uint16_t* dropout_uniforms_row(int64_t seed, int64_t idx0, int64_t n, uint16_t* buf);

// An op's source of dropout bits: the seed and the numbering of its output's elements (the identity, or the shard
// map that a 4-element seed tensor carries: philox.h ShardMap).
struct DropoutSeed {
  int64_t seed = 0;
  ShardMap map;
};

// An op's DropoutSeed from its checked dropout and seed tensor (d.mapped: 4 elements). The seed is read only when the
// op drops (p > 0).
inline DropoutSeed read_dropout_seed(const DropoutParams& d, const Tensor& seed) {
  if (!d.active()) return DropoutSeed{};
  const int64_t* data = data_as<const int64_t>(seed);
  return DropoutSeed{data[0], read_shard_map(data, d.mapped)};
}

// dropout_uniforms_row for the output's elements i0 .. i0 + n - 1, each numbered through the map, and its keep
// bytes (keep[j] = 1 when u >= threshold): a run that crosses the map's period boundaries is drawn piece by piece.
const uint16_t* dropout_uniforms_run(const DropoutSeed& s, int64_t i0, int64_t n, uint16_t* buf);
void dropout_keep_run(const DropoutSeed& s, int64_t i0, int64_t n, uint32_t threshold, uint8_t* keep);

}  // namespace gpuopt
