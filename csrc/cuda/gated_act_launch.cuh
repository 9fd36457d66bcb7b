// Host side of gated_act and its backward on the kernels' parameter structs (launch.cuh's Launcher interface: the
// GPU's and the emulator's): the access path, the persistent grid and the walk's geometry (gated_act_kernels.cuh).
// The parameters come filled from the op's checked spec (cuda/gated_act_torch_ops.h). No ATen here.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/gated_act_kernels.cuh"
#include "cuda/launch.cuh"
#include "cuda/launch_config.h"
#include "fused_math.h"

namespace gpuopt {
namespace cuda {

// The launch of either kernel: a persistent one-wave grid of kGatedThreads-thread blocks (balanced_grid over the
// blocks that take every group once at U groups a thread), and the walk's geometry for that grid.
struct GatedPlan {
  int64_t blocks = 0;
  dev::GatedGeometry geo{};
};

// The walk's geometry for n output elements in rows of `row` (F packed, n for two tensors) at row stride ld (2F,
// or n) and a grid stride of `step` = 8T elements.
inline dev::GatedGeometry gated_geometry(int64_t n, int64_t row, int64_t ld, int64_t step) {
  // gated_walk_at's 32-bit division: every thread's first element 8t < step < 2^32 (a one-wave grid: millions)
  if (step <= 0 || step >= (int64_t(1) << 32))
    throw std::runtime_error("gpuopt: internal error: gated_act grid stride " + std::to_string(step));
  dev::GatedGeometry geo;
  geo.n = n;
  geo.row = row;
  geo.ld = ld;
  geo.step_col = step % row;
  geo.step_off = step / row * ld + geo.step_col;
  geo.wrap = ld - row;
  return geo;
}

// n = M F output elements; row / ld: F / 2F packed, n / n for two tensors (one flat row).
inline GatedPlan plan_gated(int64_t n, int64_t row, int64_t ld, int unroll, int blocks_per_sm, int sm_count) {
  GatedPlan plan;
  const int64_t needed = ceil_div(ceil_div(n, kGroup), int64_t(kGatedThreads) * unroll);
  plan.blocks = persistent_grid(needed, blocks_per_sm, sm_count);
  plan.geo = gated_geometry(n, row, ld, plan.blocks * kGatedThreads * kGroup);
  return plan;
}

// The vector path: 16-byte aligned buffers and no group crossing a row (two tensors: one flat row; packed:
// F % 8 == 0, so up = gate + F is aligned with gate).
inline bool gated_vector_access(int64_t F, bool packed, std::initializer_list<const void*> ptrs) {
  if (packed && F % kGroup != 0) return false;
  for (const void* p : ptrs)
    if (p != nullptr && !dev::is_aligned16(p)) return false;
  return true;
}

// The kernel of an access path and a threshold: p = 0 (threshold 0) takes the instance without RNG code
// (kDrop false), any other p the one that draws one Philox call a group (kDrop), or under a shard map that the RNG
// reads (dev::read_map) the one that numbers the groups by it (kMapped). pick(kVec, kDrop, kMapped), each a
// std::bool_constant, names the instance.
template <class Pick>
auto gated_kernel(bool vec, const DropoutParams& d, const Pick& pick) {
  using T = std::true_type;
  using F = std::false_type;
  const bool dropout = d.threshold != 0u, mapped = dev::read_map(d);
  return vec ? (mapped ? pick(T{}, T{}, T{}) : (dropout ? pick(T{}, T{}, F{}) : pick(T{}, F{}, F{})))
             : (mapped ? pick(F{}, T{}, T{}) : (dropout ? pick(F{}, T{}, F{}) : pick(F{}, F{}, F{})));
}

// Either direction's launch (kBackward) for M rows of F outputs (packed: gate holds [gate | up]): the kernel of the
// access path (vec) and the seed, its persistent grid and the walk's geometry in p.geo.
template <bool kBackward, int kAct, typename S, class Pm, class Launcher>
void run_gated(Pm& p, bool vec, int64_t M, int64_t F, bool packed, const DropoutParams& d, Launcher& launcher) {
  auto kernel = gated_kernel(vec, d, [](auto v, auto drop, auto mapped) {
    constexpr bool kVec = decltype(v)::value, kDrop = decltype(drop)::value, kMapped = decltype(mapped)::value;
    if constexpr (kBackward) {
      if constexpr (kMapped)
        return dev::gated_act_backward_mapped_kernel<S, kAct, kVec>;
      else
        return dev::gated_act_backward_kernel<S, kAct, kVec, kDrop>;
    } else {
      if constexpr (kMapped)
        return dev::gated_act_forward_mapped_kernel<S, kAct, kVec>;
      else
        return dev::gated_act_forward_kernel<S, kAct, kVec, kDrop>;
    }
  });
  const int64_t n = M * F;
  const GatedPlan plan = plan_gated(n, packed ? F : n, packed ? 2 * F : n, gated_unroll(sizeof(S), vec),
                                    launcher.blocks_per_sm(kernel, kGatedThreads), launcher.sm_count());
  p.geo = plan.geo;
  const bool mapped = dev::read_map(d);
  const char* name = kBackward ? (mapped ? "gated_act_backward_mapped_kernel" : "gated_act_backward_kernel")
                               : (mapped ? "gated_act_forward_mapped_kernel" : "gated_act_forward_kernel");
  launcher.run(name, kernel, dim3(static_cast<unsigned>(plan.blocks)), dim3(kGatedThreads), kGatedThreads, p);
}

// gated_act forward: p holds gate, up (packed: gate + F), seed, out, scale and threshold.
template <int kAct, typename S, class Launcher>
void run_gated_act(dev::GatedForwardParams<S> p, int64_t M, int64_t F, bool packed, const DropoutParams& d,
                   Launcher& launcher) {
  const bool vec = gated_vector_access(F, packed, {p.gate, p.up, p.out});
  run_gated<false, kAct, S>(p, vec, M, F, packed, d, launcher);
}

// gated_act backward: p holds grad_out, gate, up, seed, grad_gate, grad_up (packed: grad_gate + F), scale and
// threshold.
template <int kAct, typename S, class Launcher>
void run_gated_act_backward(dev::GatedBackwardParams<S> p, int64_t M, int64_t F, bool packed, const DropoutParams& d,
                            Launcher& launcher) {
  const bool vec = gated_vector_access(F, packed, {p.grad_out, p.gate, p.up, p.grad_gate, p.grad_up});
  run_gated<true, kAct, S>(p, vec, M, F, packed, d, launcher);
}

}  // namespace cuda
}  // namespace gpuopt
