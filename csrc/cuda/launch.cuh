// Host side of the CUDA ops on the kernels' parameter structs: picks each kernel and its launch shape
// (launch_config.h) and issues the launches through a Launcher, so the same code drives the GPU (csrc/cuda/*.cu)
// and the CPU emulation of the CUDA execution model (tools/cuda_emu). The parameters come filled from the op's
// checked spec (cuda/torch_ops.h); the launchers add what the launch decides (scratch sums, the walk's geometry).
// A Launcher provides
//   int sm_count();
//   int64_t shared_per_block();  // shared memory a block may have (static + dynamic), bytes
//   template <class P> int blocks_per_sm(void (*kernel)(P), int threads, int64_t dynamic_shared = 0);  // occupancy
//   template <class P> void run(const char* name, void (*kernel)(P), dim3 grid, dim3 block, int max_threads, const P&,
//                               int64_t dynamic_shared = 0);
//   template <class T> T* scratch(int64_t count);                          // device memory alive until the op returns
// No ATen here.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/bias_act_kernels.cuh"
#include "cuda/column_sums.cuh"
#include "cuda/launch_config.h"
#include "cuda/norm_looped.cuh"
#include "cuda/norm_rows_backward.cuh"
#include "cuda/norm_rows_forward.cuh"
#include "dtypes.h"
#include "fused_math.h"

namespace gpuopt {
namespace cuda {

// The kernels' storage types of the 16-bit dtypes (dtypes.h Storage).
using DeviceStorage = Storage<dev::half_t, dev::bfloat16_t>;

// The vectorization rule of every kernel: a row's groups move as 16-byte vectors when N % 8 == 0 (a group never
// crosses a row) and every pointer involved is 16-byte aligned; an absent weight / bias (nullptr) does not count.
inline bool vector_access(int64_t N, std::initializer_list<const void*> ptrs) {
  if (N % kGroup != 0) return false;
  for (const void* p : ptrs)
    if (p != nullptr && !dev::is_aligned16(p)) return false;
  return true;
}

// The rows kernels' 1 / N (a launch argument, rounded once here): IEEE division, the value a kernel would compute.
template <typename A>
A inv_n_of(int64_t N) {
  return A(1) / static_cast<A>(N);
}

// A row op's kernel for a seed: under kMapped its *_mapped_kernel instance (the same template arguments), which
// numbers the rows' dropout lanes through the seed's shard map and is launched only where the seed holds one and
// the RNG runs (dev::read_map); else the 1-element seed's, with no map code (nor a flag in the params).
#define GPUOPT_ROWS_KERNEL(name, ...) \
  (kMapped ? dev::name##_mapped_kernel<__VA_ARGS__> : dev::name##_kernel<__VA_ARGS__>)

template <int kVpt>
using Vpt = std::integral_constant<int, kVpt>;

// A forward rows kernel for a plan, kernel(std::bool_constant<one warp a row>, Vpt<groups a thread>): a block a row
// takes 4 groups a thread, or 3, and 2 where kTwo (fp32 data or parameters: plan_norm_rows); one warp a row 1 to 4.
template <bool kTwo, class Kernel>
auto forward_rows_kernel(const RowsPlan& plan, const Kernel& kernel) {
  using Block = std::false_type;
  using Warp = std::true_type;
  if (!plan.warp_row) {
    if constexpr (kTwo) {
      if (plan.vpt == 2) return kernel(Block{}, Vpt<2>{});
    }
    return plan.vpt == 3 ? kernel(Block{}, Vpt<3>{}) : kernel(Block{}, Vpt<4>{});
  }
  switch (plan.vpt) {
    case 1:
      return kernel(Warp{}, Vpt<1>{});
    case 2:
      return kernel(Warp{}, Vpt<2>{});
    case 3:
      return kernel(Warp{}, Vpt<3>{});
    default:
      return kernel(Warp{}, Vpt<4>{});
  }
}

// The kernel pointer of nd_forward_rows_kernel / nd_backward_rows_kernel for a plan, an access path and a seed.
template <typename S, typename P, typename A, bool kVec, bool kMapped>
auto nd_forward_rows(const RowsPlan& plan) -> void (*)(dev::NdForwardParams<S, P, A>) {
  static_assert(norm_rows_max_vpt(false) == 4, "instantiate every VPT the plan can pick");
  return forward_rows_kernel < sizeof(S) != 8 &&
         (sizeof(S) == 4 || sizeof(P) == 4) > (plan, [](auto warp, auto vpt) {
           return GPUOPT_ROWS_KERNEL(nd_forward_rows, S, P, A, kVec, decltype(warp)::value, decltype(vpt)::value);
         });
}

template <typename S, typename P, typename A>
auto nd_forward_rows(const RowsPlan& plan, bool vec, bool mapped) -> void (*)(dev::NdForwardParams<S, P, A>) {
  if (mapped) return vec ? nd_forward_rows<S, P, A, true, true>(plan) : nd_forward_rows<S, P, A, false, true>(plan);
  return vec ? nd_forward_rows<S, P, A, true, false>(plan) : nd_forward_rows<S, P, A, false, false>(plan);
}

template <typename S, typename P, typename A, bool kVec, bool kMapped>
auto nd_backward_rows(const RowsPlan& plan) -> void (*)(dev::NdBackwardParams<S, P, A>) {
  static_assert(norm_rows_max_vpt(true) == 2, "instantiate every VPT the plan can pick");
  if constexpr (kVec && sizeof(S) != 8) {
    if (plan.wide) {
      if (plan.vpt == 6) return GPUOPT_ROWS_KERNEL(nd_backward_wide, S, P, A, 6);
      return plan.vpt == 4 ? GPUOPT_ROWS_KERNEL(nd_backward_wide, S, P, A, 4)
                           : GPUOPT_ROWS_KERNEL(nd_backward_wide, S, P, A, 3);
    }
  }
  if (!plan.warp_row) {  // a block a row: 4, 3 or 2 groups a thread (plan_norm_rows; fp64 and the scalar path: 2)
    if constexpr (kVec && sizeof(S) != 8) {
      if (plan.vpt == 4) return GPUOPT_ROWS_KERNEL(nd_backward_rows, S, P, A, kVec, false, 4);
      if (plan.vpt == 3) return GPUOPT_ROWS_KERNEL(nd_backward_rows, S, P, A, kVec, false, 3);
    }
    return GPUOPT_ROWS_KERNEL(nd_backward_rows, S, P, A, kVec, false, 2);
  }
  return plan.vpt == 1 ? GPUOPT_ROWS_KERNEL(nd_backward_rows, S, P, A, kVec, true, 1)
                       : GPUOPT_ROWS_KERNEL(nd_backward_rows, S, P, A, kVec, true, 2);
}

template <typename S, typename P, typename A>
auto nd_backward_rows(const RowsPlan& plan, bool vec, bool mapped) -> void (*)(dev::NdBackwardParams<S, P, A>) {
  if (mapped) return vec ? nd_backward_rows<S, P, A, true, true>(plan) : nd_backward_rows<S, P, A, false, true>(plan);
  return vec ? nd_backward_rows<S, P, A, true, false>(plan) : nd_backward_rows<S, P, A, false, false>(plan);
}

// A rows kernel's persistent grid for a plan: blocks of (threads_x, rows_per_block) threads with plan.shared bytes
// of dynamic shared memory, at most a wave of them.
template <class Pm, class Launcher>
int64_t rows_grid(void (*kernel)(Pm), const RowsPlan& plan, Launcher& launcher) {
  const int per_sm = launcher.blocks_per_sm(kernel, plan.threads_x * plan.rows_per_block, plan.shared);
  return persistent_grid(plan.blocks_needed, per_sm, launcher.sm_count());
}

template <class Pm, class Launcher>
void run_rows(const char* name, void (*kernel)(Pm), const RowsPlan& plan, int64_t grid, const Pm& p,
              Launcher& launcher) {
  launcher.run(name, kernel, dim3(static_cast<unsigned>(grid)), dim3(plan.threads_x, plan.rows_per_block),
               plan.max_threads, p, plan.shared);
}

// The looped forward: a persistent grid of kLoopedThreads-thread blocks, a block a row at a time.
template <class Pm, class Launcher>
void run_looped(const char* name, void (*kernel)(Pm), const Pm& p, Launcher& launcher) {
  const int per_sm = launcher.blocks_per_sm(kernel, kLoopedThreads);
  const int64_t grid = persistent_grid(p.M, per_sm, launcher.sm_count());
  launcher.run(name, kernel, dim3(static_cast<unsigned>(grid)), dim3(kLoopedThreads), kLoopedThreads, p);
}

// layer_norm_dropout_relu / norm_dropout forward. mapped: the seed holds a shard map and the RNG runs
// (dev::read_map).
template <typename S, typename P, typename A, class Launcher>
void run_nd_forward(const dev::NdForwardParams<S, P, A>& p, bool mapped, Launcher& launcher) {
  const bool vec = p.x_vec && p.p_vec;
  const RowsPlan plan = plan_norm_rows(p.M, p.N, sizeof(S), sizeof(P), /*backward=*/false, vec);
  if (plan.rows) {
    auto kernel = nd_forward_rows<S, P, A>(plan, vec, mapped);
    run_rows("nd_forward_rows_kernel", kernel, plan, rows_grid(kernel, plan, launcher), p, launcher);
  } else {
    run_looped("nd_forward_looped_kernel",
               mapped ? dev::nd_forward_looped_mapped_kernel<S, P, A> : dev::nd_forward_looped_kernel<S, P, A>, p,
               launcher);
  }
}

// Stage 2 of the column sums: up to two (partial, out) pairs in one launch.
template <typename A, typename O, class Launcher>
void run_column_sums(const A* partial0, O* out0, const A* partial1, O* out1, int64_t G, int64_t N, int64_t ldp,
                     Launcher& launcher) {
  if (partial0 == nullptr) {
    partial0 = partial1;
    out0 = out1;
    partial1 = nullptr;
    out1 = nullptr;
  }
  if (partial0 == nullptr) return;
  dev::ColumnSumParams<A, O> p;
  p.partial0 = partial0;
  p.out0 = out0;
  p.partial1 = partial1;
  p.out1 = out1;
  p.G = G;
  p.N = N;
  p.ldp = ldp;
  const unsigned sums = partial1 != nullptr ? 2u : 1u;
  const int cols = column_sum_cols(N, static_cast<int>(sums), sizeof(A), launcher.sm_count());
  const int64_t tiles = column_sum_blocks(N, cols);
  if (tiles > 2147483647LL)
    throw std::runtime_error("gpuopt: N = " + std::to_string(N) + " is too large for the CUDA grid");
  constexpr int kVec = column_sum_vec(sizeof(A));
  launcher.run("column_sum_kernel", cols == 1 ? dev::column_sum_kernel<A, O, 1> : dev::column_sum_kernel<A, O, kVec>,
               dim3(static_cast<unsigned>(tiles), sums), dim3(kColumnSumTile, column_sum_rows(G)),
               kColumnSumTile * kColumnSumTile, p);
}

// The backwards' scratch: a (G, ldp) partial-sum row block for each parameter gradient that is wanted.
template <class Pm, class Launcher>
void alloc_partials(Pm& p, int64_t G, bool want_w, bool want_b, Launcher& launcher) {
  using A = std::remove_pointer_t<decltype(p.partial_w)>;
  p.partial_w = want_w ? launcher.template scratch<A>(G * p.ldp) : nullptr;
  p.partial_b = want_b ? launcher.template scratch<A>(G * p.ldp) : nullptr;
}

// The looped backward of both norm ops: the row statistics kernel (persistent, a block a row), then the tiled
// kernel over (column tiles, row blocks), which writes the parameter partials. Returns G, the row blocks.
template <class Pm, class Launcher>
int64_t run_stats_tiled(const char* stats_name, void (*stats)(Pm), const char* tiled_name, void (*tiled)(Pm), Pm& p,
                        bool want_w, bool want_b, Launcher& launcher) {
  using A = std::remove_pointer_t<decltype(p.row_stats)>;
  const int sms = launcher.sm_count();
  p.row_stats = launcher.template scratch<A>(2 * p.M);
  const int64_t stats_grid = persistent_grid(p.M, launcher.blocks_per_sm(stats, kLoopedThreads), sms);
  const TilePlan t = plan_tiled(p.M, p.N, int64_t(launcher.blocks_per_sm(tiled, kTiledThreads)) * sms);
  alloc_partials(p, t.row_blocks, want_w, want_b, launcher);
  launcher.run(stats_name, stats, dim3(static_cast<unsigned>(stats_grid)), dim3(kLoopedThreads), kLoopedThreads, p);
  launcher.run(tiled_name, tiled, dim3(static_cast<unsigned>(t.col_tiles), static_cast<unsigned>(t.row_blocks)),
               dim3(t.tx, t.ty), kTiledThreads, p);
  return t.row_blocks;
}

// The rows backward of both norm ops: the rows (or wide) kernel on its persistent grid. Returns G, its blocks.
template <class Pm, class Launcher>
int64_t run_rows_backward(const char* name, void (*kernel)(Pm), const RowsPlan& plan, Pm& p, bool want_w, bool want_b,
                          Launcher& launcher) {
  const int64_t G = rows_grid(kernel, plan, launcher);
  alloc_partials(p, G, want_w, want_b, launcher);
  run_rows(name, kernel, plan, G, p, launcher);
  return G;
}

// layer_norm_dropout_relu / norm_dropout backward; grad_weight / grad_bias: nullptr when not wanted.
template <typename S, typename P, typename A, class Launcher>
void run_nd_backward(dev::NdBackwardParams<S, P, A> p, bool mapped, P* grad_weight, P* grad_bias, Launcher& launcher) {
  const bool want_w = grad_weight != nullptr, want_b = grad_bias != nullptr;
  const bool vec = p.x_vec && p.p_vec;
  const RowsPlan plan = plan_norm_rows(p.M, p.N, sizeof(S), sizeof(P), /*backward=*/true, vec,
                                       launcher.shared_per_block() - kWideStaticShared);
  int64_t G = 0;
  if (plan.rows) {
    G = run_rows_backward(plan.wide ? "nd_backward_wide_kernel" : "nd_backward_rows_kernel",
                          nd_backward_rows<S, P, A>(plan, vec, mapped), plan, p, want_w, want_b, launcher);
  } else {
    auto stats = vec ? (mapped ? dev::nd_backward_row_stats_mapped_kernel<S, P, A, true>
                               : dev::nd_backward_row_stats_kernel<S, P, A, true>)
                     : (mapped ? dev::nd_backward_row_stats_mapped_kernel<S, P, A, false>
                               : dev::nd_backward_row_stats_kernel<S, P, A, false>);
    auto tiled = vec ? (mapped ? dev::nd_backward_tiled_mapped_kernel<S, P, A, true>
                               : dev::nd_backward_tiled_kernel<S, P, A, true>)
                     : (mapped ? dev::nd_backward_tiled_mapped_kernel<S, P, A, false>
                               : dev::nd_backward_tiled_kernel<S, P, A, false>);
    G = run_stats_tiled("nd_backward_row_stats_kernel", stats, "nd_backward_tiled_kernel", tiled, p, want_w, want_b,
                        launcher);
  }
  run_column_sums<A, P>(p.partial_w, grad_weight, p.partial_b, grad_bias, G, p.N, p.ldp, launcher);
}

// ------------------------------------------------------------------------------------------- dropout_add_norm
// The rows kernels of dropout_add_norm: the 16-byte vector path of fp16 / bf16 / fp32 x only (the launcher
// sends the scalar path and fp64 to the looped kernels), every VPT plan_norm_rows can pick at element size
// dan_elem (the x / sum pair) and the parameters' size.
template <typename S, typename U, typename P, typename A, bool kMapped>
auto dan_forward_rows(const RowsPlan& plan) -> void (*)(dev::DanForwardParams<S, U, P, A>) {
  constexpr bool kTwo = dan_elem(sizeof(S), sizeof(U)) == 4 || sizeof(P) == 4;  // fp32 x, sum or parameters
  return forward_rows_kernel<kTwo>(plan, [](auto warp, auto vpt) {
    return GPUOPT_ROWS_KERNEL(dan_forward_rows, S, U, P, A, decltype(warp)::value, decltype(vpt)::value);
  });
}

template <typename S, typename U, typename P, typename A, bool kMapped>
auto dan_backward_rows(const RowsPlan& plan) -> void (*)(dev::DanBackwardParams<S, U, P, A>) {
  if (plan.wide) {  // 6 (never planned where dan_wide_allowed is false: plan_dan_backward), 4 or 3 groups
    if constexpr (dan_wide_allowed(6, sizeof(S), sizeof(U), sizeof(P))) {
      if (plan.vpt == 6) return GPUOPT_ROWS_KERNEL(dan_backward_wide, S, U, P, A, 6);
    }
    return plan.vpt == 4 ? GPUOPT_ROWS_KERNEL(dan_backward_wide, S, U, P, A, 4)
                         : GPUOPT_ROWS_KERNEL(dan_backward_wide, S, U, P, A, 3);
  }
  if (!plan.warp_row) {  // a block a row: 4, 3 or 2 groups a thread (plan_norm_rows, the vector path)
    if (plan.vpt == 4) return GPUOPT_ROWS_KERNEL(dan_backward_rows, S, U, P, A, false, 4);
    if (plan.vpt == 3) return GPUOPT_ROWS_KERNEL(dan_backward_rows, S, U, P, A, false, 3);
    return GPUOPT_ROWS_KERNEL(dan_backward_rows, S, U, P, A, false, 2);
  }
  return plan.vpt == 1 ? GPUOPT_ROWS_KERNEL(dan_backward_rows, S, U, P, A, true, 1)
                       : GPUOPT_ROWS_KERNEL(dan_backward_rows, S, U, P, A, true, 2);
}

template <typename S, typename U, typename P, typename A, class Launcher>
void run_dan_forward(const dev::DanForwardParams<S, U, P, A>& p, bool mapped, Launcher& launcher) {
  if constexpr (sizeof(S) != 8) {
    const RowsPlan plan = plan_norm_rows(p.M, p.N, dan_elem(sizeof(S), sizeof(U)), sizeof(P), /*backward=*/false, true);
    if (p.x_vec && p.p_vec && plan.rows) {
      auto kernel = mapped ? dan_forward_rows<S, U, P, A, true>(plan) : dan_forward_rows<S, U, P, A, false>(plan);
      run_rows("dan_forward_rows_kernel", kernel, plan, rows_grid(kernel, plan, launcher), p, launcher);
      return;
    }
  }
  run_looped("dan_forward_looped_kernel",
             mapped ? dev::dan_forward_looped_mapped_kernel<S, U, P, A> : dev::dan_forward_looped_kernel<S, U, P, A>, p,
             launcher);
}

// The looped backward's kernels of dropout_add_norm for an access path (kVec: the 16-byte one) and a seed.
template <typename S, typename U, typename P, typename A, bool kVec, class Launcher>
int64_t run_dan_backward_looped(dev::DanBackwardParams<S, U, P, A>& p, bool mapped, bool want_w, bool want_b,
                                Launcher& launcher) {
  return run_stats_tiled("dan_backward_row_stats_kernel",
                         mapped ? dev::dan_backward_row_stats_mapped_kernel<S, U, P, A, kVec>
                                : dev::dan_backward_row_stats_kernel<S, U, P, A, kVec>,
                         "dan_backward_tiled_kernel",
                         mapped ? dev::dan_backward_tiled_mapped_kernel<S, U, P, A, kVec>
                                : dev::dan_backward_tiled_kernel<S, U, P, A, kVec>,
                         p, want_w, want_b, launcher);
}

// dropout_add_norm backward; grad_weight / grad_bias: nullptr when not wanted. fp64 and the scalar path take the
// looped kernels.
template <typename S, typename U, typename P, typename A, class Launcher>
void run_dan_backward(dev::DanBackwardParams<S, U, P, A> p, bool mapped, P* grad_weight, P* grad_bias,
                      Launcher& launcher) {
  const bool want_w = grad_weight != nullptr, want_b = grad_bias != nullptr;
  const bool vec = p.x_vec && p.p_vec && sizeof(S) != 8;
  int64_t G = 0;
  if constexpr (sizeof(S) != 8) {
    const RowsPlan plan =
        plan_dan_backward(p.M, p.N, sizeof(S), sizeof(U), sizeof(P), launcher.shared_per_block() - kWideStaticShared);
    if (vec && plan.rows) {
      auto kernel = mapped ? dan_backward_rows<S, U, P, A, true>(plan) : dan_backward_rows<S, U, P, A, false>(plan);
      G = run_rows_backward(plan.wide ? "dan_backward_wide_kernel" : "dan_backward_rows_kernel", kernel, plan, p,
                            want_w, want_b, launcher);
    } else if (vec) {
      G = run_dan_backward_looped<S, U, P, A, true>(p, mapped, want_w, want_b, launcher);
    }
  }
  if (!vec) G = run_dan_backward_looped<S, U, P, A, false>(p, mapped, want_w, want_b, launcher);
  run_column_sums<A, P>(p.partial_w, grad_weight, p.partial_b, grad_bias, G, p.N, p.ldp, launcher);
}

// ------------------------------------------------------------------------------------------- bias_act
// bias_relu / bias_act forward (kAct: fused_math.h's act code).
template <int kAct, typename S, typename B, class Launcher>
void run_bias_act(const dev::BiasActParams<S, B>& p, Launcher& launcher) {
  auto kernel = vector_access(p.N, {p.x, p.out, p.bias}) ? dev::bias_act_forward_kernel<S, B, true, kAct>
                                                         : dev::bias_act_forward_kernel<S, B, false, kAct>;
  const TilePlan t = plan_tiled(p.M, p.N, int64_t(launcher.blocks_per_sm(kernel, kTiledThreads)) * launcher.sm_count());
  launcher.run("bias_act_forward_kernel", kernel,
               dim3(static_cast<unsigned>(t.col_tiles), static_cast<unsigned>(t.row_blocks)), dim3(t.tx, t.ty),
               kTiledThreads, p);
}

// bias_relu / bias_act backward: grad_x, and grad_bias (accumulation dtype, (N,)) from the column sums.
template <int kAct, typename S, typename B, class Launcher>
void run_bias_act_backward(dev::BiasActBackwardParams<S, B> p, dev::acc_t_of<S>* grad_bias, Launcher& launcher) {
  using A = dev::acc_t_of<S>;
  auto kernel = vector_access(p.N, {p.grad_out, p.saved, p.grad_x, p.bias})
                    ? dev::bias_act_backward_kernel<S, B, true, kAct>
                    : dev::bias_act_backward_kernel<S, B, false, kAct>;
  const TilePlan t = plan_tiled(p.M, p.N, int64_t(launcher.blocks_per_sm(kernel, kTiledThreads)) * launcher.sm_count());
  p.partial = launcher.template scratch<A>(t.row_blocks * p.ldp);
  launcher.run("bias_act_backward_kernel", kernel,
               dim3(static_cast<unsigned>(t.col_tiles), static_cast<unsigned>(t.row_blocks)), dim3(t.tx, t.ty),
               kTiledThreads, p);
  run_column_sums<A, A>(p.partial, grad_bias, nullptr, nullptr, t.row_blocks, p.N, p.ldp, launcher);
}

#undef GPUOPT_ROWS_KERNEL

}  // namespace cuda
}  // namespace gpuopt
