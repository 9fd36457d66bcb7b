// Host side of gated_act and its backward on raw buffers (launch.cuh's Launcher interface: the GPU's and the
// emulator's): the access path, the persistent grid and the walk's geometry (gated_act_kernels.cuh). No ATen here.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "cuda/gated_act_kernels.cuh"
#include "cuda/launch.cuh"
#include "cuda/launch_config.h"
#include "fused_math.h"

namespace gpuopt {
namespace cuda {

struct GatedBuffers {
  const void* grad_out;  // backward only, (M, F)
  const void* gate;      // (M, F), or (M, 2F) holding [gate | up] when packed
  const void* up;        // (M, F); nullptr when packed
  const int64_t* seed;
  void* out;        // forward: (M, F)
  void* grad_gate;  // backward: gate's shape (packed: [grad_gate | grad_up])
  void* grad_up;    // backward: (M, F); nullptr when packed
  int64_t M, F;     // M > 0, F > 0
  bool packed;
  DType dtype;
  int act;  // fused_math.h's act code
  DropoutParams dropout;
};

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
inline bool gated_vector_access(const GatedBuffers& b, std::initializer_list<const void*> ptrs) {
  if (b.packed && b.F % kGroup != 0) return false;
  for (const void* p : ptrs)
    if (p != nullptr && !dev::is_aligned16(p)) return false;
  return true;
}

// The kernel of an access path and a threshold: p = 0 (threshold 0) takes the instance without RNG code
// (kDrop false), any other p the one that draws one Philox call a group (kDrop), or under a shard map that the RNG
// reads (dev::read_map) the one that numbers the groups by it (kMapped).
template <class K>
K gated_kernel(bool vec, const DropoutParams& d, K vec_no_drop, K vec_drop, K vec_mapped, K scalar_no_drop,
               K scalar_drop, K scalar_mapped) {
  const bool dropout = d.threshold != 0u, mapped = dev::read_map(d);
  return vec ? (mapped ? vec_mapped : (dropout ? vec_drop : vec_no_drop))
             : (mapped ? scalar_mapped : (dropout ? scalar_drop : scalar_no_drop));
}

template <typename S>
void gated_pointers(const GatedBuffers& b, const S*& gate, const S*& up) {
  gate = static_cast<const S*>(b.gate);
  up = b.packed ? gate + b.F : static_cast<const S*>(b.up);
}

template <class Launcher>
void run_gated_act(const GatedBuffers& b, Launcher& launcher) {
  dispatch_act(b.act, [&](auto ac) {
    constexpr int kAct = decltype(ac)::value;
    dispatch_dtype(b.dtype, [&](auto st) {
      using S = typename decltype(st)::type;
      dev::GatedForwardParams<S> p;
      gated_pointers(b, p.gate, p.up);
      p.seed = b.seed;
      p.out = static_cast<S*>(b.out);
      p.scale = static_cast<dev::acc_t_of<S>>(b.dropout.scale);
      p.threshold = b.dropout.threshold;
      const bool vec = gated_vector_access(b, {p.gate, p.up, p.out});
      auto kernel = gated_kernel(
          vec, b.dropout, dev::gated_act_forward_kernel<S, kAct, true, false>,
          dev::gated_act_forward_kernel<S, kAct, true, true>, dev::gated_act_forward_mapped_kernel<S, kAct, true>,
          dev::gated_act_forward_kernel<S, kAct, false, false>, dev::gated_act_forward_kernel<S, kAct, false, true>,
          dev::gated_act_forward_mapped_kernel<S, kAct, false>);
      const int64_t n = b.M * b.F;
      const GatedPlan plan = plan_gated(n, b.packed ? b.F : n, b.packed ? 2 * b.F : n, gated_unroll(sizeof(S), vec),
                                        launcher.blocks_per_sm(kernel, kGatedThreads), launcher.sm_count());
      p.geo = plan.geo;
      launcher.run(dev::read_map(b.dropout) ? "gated_act_forward_mapped_kernel" : "gated_act_forward_kernel", kernel,
                   dim3(static_cast<unsigned>(plan.blocks)), dim3(kGatedThreads), kGatedThreads, p);
    });
  });
}

template <class Launcher>
void run_gated_act_backward(const GatedBuffers& b, Launcher& launcher) {
  dispatch_act(b.act, [&](auto ac) {
    constexpr int kAct = decltype(ac)::value;
    dispatch_dtype(b.dtype, [&](auto st) {
      using S = typename decltype(st)::type;
      dev::GatedBackwardParams<S> p;
      p.grad_out = static_cast<const S*>(b.grad_out);
      gated_pointers(b, p.gate, p.up);
      p.seed = b.seed;
      p.grad_gate = static_cast<S*>(b.grad_gate);
      p.grad_up = b.packed ? p.grad_gate + b.F : static_cast<S*>(b.grad_up);
      p.scale = static_cast<dev::acc_t_of<S>>(b.dropout.scale);
      p.threshold = b.dropout.threshold;
      const bool vec = gated_vector_access(b, {p.grad_out, p.gate, p.up, p.grad_gate, p.grad_up});
      auto kernel = gated_kernel(
          vec, b.dropout, dev::gated_act_backward_kernel<S, kAct, true, false>,
          dev::gated_act_backward_kernel<S, kAct, true, true>, dev::gated_act_backward_mapped_kernel<S, kAct, true>,
          dev::gated_act_backward_kernel<S, kAct, false, false>, dev::gated_act_backward_kernel<S, kAct, false, true>,
          dev::gated_act_backward_mapped_kernel<S, kAct, false>);
      const int64_t n = b.M * b.F;
      const GatedPlan plan = plan_gated(n, b.packed ? b.F : n, b.packed ? 2 * b.F : n, gated_unroll(sizeof(S), vec),
                                        launcher.blocks_per_sm(kernel, kGatedThreads), launcher.sm_count());
      p.geo = plan.geo;
      launcher.run(dev::read_map(b.dropout) ? "gated_act_backward_mapped_kernel" : "gated_act_backward_kernel", kernel,
                   dim3(static_cast<unsigned>(plan.blocks)), dim3(kGatedThreads), kGatedThreads, p);
    });
  });
}

}  // namespace cuda
}  // namespace gpuopt
