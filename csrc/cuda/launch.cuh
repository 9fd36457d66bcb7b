// Host side of the CUDA ops on raw buffers: picks each kernel and its launch shape (launch_config.h) and issues
// the launches through a Launcher, so the same code drives the GPU (csrc/cuda/*.cu) and the CPU
// emulation of the CUDA execution model (tools/cuda_emu). A Launcher provides
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

#include "cuda/bias_relu_kernels.cuh"
#include "cuda/column_sums.cuh"
#include "cuda/launch_config.h"
#include "cuda/norm_looped.cuh"
#include "cuda/norm_rows_backward.cuh"
#include "cuda/norm_rows_forward.cuh"
#include "fused_math.h"

namespace gpuopt {
namespace cuda {

enum class DType { kFloat16, kBFloat16, kFloat32, kFloat64 };

template <typename T>
struct Tag {
  using type = T;
};

// Calls f(Tag<storage type>) for dtype.
template <typename F>
void dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat16:
      return f(Tag<dev::half_t>{});
    case DType::kBFloat16:
      return f(Tag<dev::bfloat16_t>{});
    case DType::kFloat32:
      return f(Tag<float>{});
    case DType::kFloat64:
      return f(Tag<double>{});
  }
  throw std::runtime_error("gpuopt: internal error: unknown dtype");
}

// Calls f(Tag<x type>, Tag<param type>); params have x's dtype or fp32 (DESIGN.md).
template <typename F>
void dispatch_ldr_dtypes(DType x, DType param, F&& f) {
  dispatch_dtype(x, [&](auto xt) {
    using S = typename decltype(xt)::type;
    if (param == DType::kFloat32) {
      f(xt, Tag<float>{});
    } else {
      f(xt, Tag<S>{});
    }
  });
}

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

struct LdrForwardBuffers {
  const void* x;
  const void* weight;  // nullptr: none
  const void* bias;    // nullptr: none
  const int64_t* seed;
  void* out;
  void* mean;  // accumulation dtype; nullptr for RMSNorm
  void* rstd;
  int64_t M, N;
  DType x_dtype, param_dtype;
  double eps;
  bool rms;   // RMSNorm (norm_dropout); layer_norm_dropout_relu: false
  bool relu;  // ReLU after the dropout; layer_norm_dropout_relu: true
  DropoutParams dropout;
};

struct LdrBackwardBuffers {
  const void* grad_out;
  const void* x;
  const void* weight;
  const void* bias;
  const void* mean;  // nullptr for RMSNorm
  const void* rstd;
  const int64_t* seed;
  void* grad_x;
  void* grad_weight;  // param dtype, (N,); nullptr when there is no weight
  void* grad_bias;
  int64_t M, N;  // M > 0
  DType x_dtype, param_dtype;
  bool rms, relu;  // as LdrForwardBuffers
  DropoutParams dropout;
};

struct BiasReluBuffers {
  const void* x;
  const void* bias;
  void* out;
  int64_t M, N;
  DType x_dtype, bias_dtype;  // bias: x's dtype or fp32
  int act;                    // fused_math.h's act code (bias_relu: kActRelu)
};

struct BiasReluBackwardBuffers {
  const void* grad_out;
  const void* saved;  // the output for relu, x for the other activations
  const void* bias;   // read for act != relu; nullptr allowed for relu
  void* grad_x;
  void* grad_bias;  // accumulation dtype (N,)
  int64_t M, N;     // M > 0
  DType dtype, bias_dtype;
  int act;
};

// Calls f(std::integral_constant<int, kAct>) for an activation code (checked by the op).
template <typename F>
void dispatch_act(int act, F&& f) {
  switch (act) {
    case kActRelu:
      return f(std::integral_constant<int, kActRelu>{});
    case kActGelu:
      return f(std::integral_constant<int, kActGelu>{});
    case kActGeluTanh:
      return f(std::integral_constant<int, kActGeluTanh>{});
    case kActSilu:
      return f(std::integral_constant<int, kActSilu>{});
  }
  throw std::runtime_error("gpuopt: internal error: unknown activation " + std::to_string(act));
}

// A row op's kernel for a seed: under kMapped its *_mapped_kernel instance (the same template arguments), which
// numbers the rows' dropout lanes through the seed's shard map and is launched only where the seed holds one and
// the RNG runs (dev::read_map); else the 1-element seed's, with no map code (nor a flag in the params).
#define GPUOPT_ROWS_KERNEL(name, ...) \
  (kMapped ? dev::name##_mapped_kernel<__VA_ARGS__> : dev::name##_kernel<__VA_ARGS__>)

// The kernel pointer of ldr_forward_rows_kernel / ldr_backward_rows_kernel for a plan, an access path and a seed.
template <typename S, typename P, typename A, bool kVec, bool kMapped>
auto ldr_forward_rows(const RowsPlan& plan) -> void (*)(dev::LdrForwardParams<S, P, A>) {
  static_assert(ldr_rows_max_vpt(false) == 4, "instantiate every VPT the plan can pick");
  if (!plan.warp_row) {  // a block a row: 4 groups a thread, or 3; 2 with fp32 x or parameters (plan_ldr_rows)
    if constexpr (sizeof(S) != 8 && (sizeof(S) == 4 || sizeof(P) == 4)) {
      if (plan.vpt == 2) return GPUOPT_ROWS_KERNEL(ldr_forward_rows, S, P, A, kVec, false, 2);
    }
    return plan.vpt == 3 ? GPUOPT_ROWS_KERNEL(ldr_forward_rows, S, P, A, kVec, false, 3)
                         : GPUOPT_ROWS_KERNEL(ldr_forward_rows, S, P, A, kVec, false, 4);
  }
  switch (plan.vpt) {
    case 1:
      return GPUOPT_ROWS_KERNEL(ldr_forward_rows, S, P, A, kVec, true, 1);
    case 2:
      return GPUOPT_ROWS_KERNEL(ldr_forward_rows, S, P, A, kVec, true, 2);
    case 3:
      return GPUOPT_ROWS_KERNEL(ldr_forward_rows, S, P, A, kVec, true, 3);
    default:
      return GPUOPT_ROWS_KERNEL(ldr_forward_rows, S, P, A, kVec, true, 4);
  }
}

template <typename S, typename P, typename A>
auto ldr_forward_rows(const RowsPlan& plan, bool vec, bool mapped) -> void (*)(dev::LdrForwardParams<S, P, A>) {
  if (mapped) return vec ? ldr_forward_rows<S, P, A, true, true>(plan) : ldr_forward_rows<S, P, A, false, true>(plan);
  return vec ? ldr_forward_rows<S, P, A, true, false>(plan) : ldr_forward_rows<S, P, A, false, false>(plan);
}

template <typename S, typename P, typename A, bool kVec, bool kMapped>
auto ldr_backward_rows(const RowsPlan& plan) -> void (*)(dev::LdrBackwardParams<S, P, A>) {
  static_assert(ldr_rows_max_vpt(true) == 2, "instantiate every VPT the plan can pick");
  if constexpr (kVec && sizeof(S) != 8) {
    if (plan.wide) {
      if (plan.vpt == 6) return GPUOPT_ROWS_KERNEL(ldr_backward_wide, S, P, A, 6);
      return plan.vpt == 4 ? GPUOPT_ROWS_KERNEL(ldr_backward_wide, S, P, A, 4)
                           : GPUOPT_ROWS_KERNEL(ldr_backward_wide, S, P, A, 3);
    }
  }
  if (!plan.warp_row) {  // a block a row: 4, 3 or 2 groups a thread (plan_ldr_rows; fp64 and the scalar path: 2)
    if constexpr (kVec && sizeof(S) != 8) {
      if (plan.vpt == 4) return GPUOPT_ROWS_KERNEL(ldr_backward_rows, S, P, A, kVec, false, 4);
      if (plan.vpt == 3) return GPUOPT_ROWS_KERNEL(ldr_backward_rows, S, P, A, kVec, false, 3);
    }
    return GPUOPT_ROWS_KERNEL(ldr_backward_rows, S, P, A, kVec, false, 2);
  }
  return plan.vpt == 1 ? GPUOPT_ROWS_KERNEL(ldr_backward_rows, S, P, A, kVec, true, 1)
                       : GPUOPT_ROWS_KERNEL(ldr_backward_rows, S, P, A, kVec, true, 2);
}

template <typename S, typename P, typename A>
auto ldr_backward_rows(const RowsPlan& plan, bool vec, bool mapped) -> void (*)(dev::LdrBackwardParams<S, P, A>) {
  if (mapped) return vec ? ldr_backward_rows<S, P, A, true, true>(plan) : ldr_backward_rows<S, P, A, false, true>(plan);
  return vec ? ldr_backward_rows<S, P, A, true, false>(plan) : ldr_backward_rows<S, P, A, false, false>(plan);
}

template <class Launcher>
void run_ldr_forward(const LdrForwardBuffers& b, Launcher& launcher) {
  dispatch_ldr_dtypes(b.x_dtype, b.param_dtype, [&](auto st, auto pt) {
    using S = typename decltype(st)::type;
    using P = typename decltype(pt)::type;
    using A = dev::acc_t_of<S>;
    dev::LdrForwardParams<S, P, A> p;
    p.x = static_cast<const S*>(b.x);
    p.weight = static_cast<const P*>(b.weight);
    p.bias = static_cast<const P*>(b.bias);
    p.seed = b.seed;
    p.out = static_cast<S*>(b.out);
    p.mean = static_cast<A*>(b.mean);
    p.rstd = static_cast<A*>(b.rstd);
    p.M = b.M;
    p.N = b.N;
    p.inv_n = inv_n_of<A>(b.N);
    p.eps = static_cast<A>(b.eps);
    p.scale = static_cast<A>(b.dropout.scale);
    p.threshold = b.dropout.threshold;
    const bool mapped = dev::read_map(b.dropout);  // the seed holds a shard map and the RNG runs
    p.rms = b.rms;
    p.relu = b.relu;
    p.x_vec = vector_access(b.N, {b.x, b.out});
    p.p_vec = vector_access(b.N, {b.weight, b.bias});
    const bool vec = p.x_vec && p.p_vec;
    const RowsPlan plan = plan_ldr_rows(b.M, b.N, sizeof(S), sizeof(P), /*backward=*/false, vec);
    if (plan.rows) {
      auto kernel = ldr_forward_rows<S, P, A>(plan, vec, mapped);
      const dim3 block(plan.threads_x, plan.rows_per_block);
      const int per_sm = launcher.blocks_per_sm(kernel, plan.threads_x * plan.rows_per_block);
      const int64_t grid = persistent_grid(plan.blocks_needed, per_sm, launcher.sm_count());
      launcher.run("ldr_forward_rows_kernel", kernel, dim3(static_cast<unsigned>(grid)), block, plan.max_threads, p);
    } else {
      auto kernel = mapped ? dev::ldr_forward_looped_mapped_kernel<S, P, A> : dev::ldr_forward_looped_kernel<S, P, A>;
      const int per_sm = launcher.blocks_per_sm(kernel, kLoopedThreads);
      const int64_t grid = persistent_grid(b.M, per_sm, launcher.sm_count());
      launcher.run("ldr_forward_looped_kernel", kernel, dim3(static_cast<unsigned>(grid)), dim3(kLoopedThreads),
                   kLoopedThreads, p);
    }
  });
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

template <class Launcher>
void run_ldr_backward(const LdrBackwardBuffers& b, Launcher& launcher) {
  dispatch_ldr_dtypes(b.x_dtype, b.param_dtype, [&](auto st, auto pt) {
    using S = typename decltype(st)::type;
    using P = typename decltype(pt)::type;
    using A = dev::acc_t_of<S>;
    dev::LdrBackwardParams<S, P, A> p;
    p.grad_out = static_cast<const S*>(b.grad_out);
    p.x = static_cast<const S*>(b.x);
    p.weight = static_cast<const P*>(b.weight);
    p.bias = static_cast<const P*>(b.bias);
    // RMSNorm has no mean; ldr_backward_tiled_kernel reads it anyway (and drops it): point it at rstd
    p.mean = static_cast<const A*>(b.rms ? b.rstd : b.mean);
    p.rstd = static_cast<const A*>(b.rstd);
    p.seed = b.seed;
    p.grad_x = static_cast<S*>(b.grad_x);
    p.row_stats = nullptr;
    p.M = b.M;
    p.N = b.N;
    p.inv_n = inv_n_of<A>(b.N);
    p.ldp = partial_stride(b.N);
    p.scale = static_cast<A>(b.dropout.scale);
    p.threshold = b.dropout.threshold;
    const bool mapped = dev::read_map(b.dropout);  // the seed holds a shard map and the RNG runs
    p.rms = b.rms;
    p.relu = b.relu;
    p.x_vec = vector_access(b.N, {b.x, b.grad_out, b.grad_x});
    p.p_vec = vector_access(b.N, {b.weight, b.bias});
    const int sms = launcher.sm_count();
    const bool vec = p.x_vec && p.p_vec;
    const RowsPlan plan = plan_ldr_rows(b.M, b.N, sizeof(S), sizeof(P), /*backward=*/true, vec,
                                        launcher.shared_per_block() - kWideStaticShared);
    int64_t G = 0;
    auto alloc_partials = [&] {
      p.partial_w = b.grad_weight != nullptr ? launcher.template scratch<A>(G * p.ldp) : nullptr;
      p.partial_b = b.grad_bias != nullptr ? launcher.template scratch<A>(G * p.ldp) : nullptr;
    };
    if (plan.rows) {
      auto kernel = ldr_backward_rows<S, P, A>(plan, vec, mapped);
      const int per_sm = launcher.blocks_per_sm(kernel, plan.threads_x * plan.rows_per_block, plan.shared);
      G = persistent_grid(plan.blocks_needed, per_sm, sms);
      alloc_partials();
      launcher.run(plan.wide ? "ldr_backward_wide_kernel" : "ldr_backward_rows_kernel", kernel,
                   dim3(static_cast<unsigned>(G)), dim3(plan.threads_x, plan.rows_per_block), plan.max_threads, p,
                   plan.shared);
    } else {
      p.row_stats = launcher.template scratch<A>(2 * b.M);
      auto stats = vec ? (mapped ? dev::ldr_backward_row_stats_mapped_kernel<S, P, A, true>
                                 : dev::ldr_backward_row_stats_kernel<S, P, A, true>)
                       : (mapped ? dev::ldr_backward_row_stats_mapped_kernel<S, P, A, false>
                                 : dev::ldr_backward_row_stats_kernel<S, P, A, false>);
      const int64_t stats_grid = persistent_grid(b.M, launcher.blocks_per_sm(stats, kLoopedThreads), sms);
      auto tiled = vec ? (mapped ? dev::ldr_backward_tiled_mapped_kernel<S, P, A, true>
                                 : dev::ldr_backward_tiled_kernel<S, P, A, true>)
                       : (mapped ? dev::ldr_backward_tiled_mapped_kernel<S, P, A, false>
                                 : dev::ldr_backward_tiled_kernel<S, P, A, false>);
      const TilePlan t = plan_tiled(b.M, b.N, int64_t(launcher.blocks_per_sm(tiled, kTiledThreads)) * sms);
      G = t.row_blocks;
      alloc_partials();
      launcher.run("ldr_backward_row_stats_kernel", stats, dim3(static_cast<unsigned>(stats_grid)),
                   dim3(kLoopedThreads), kLoopedThreads, p);
      launcher.run("ldr_backward_tiled_kernel", tiled,
                   dim3(static_cast<unsigned>(t.col_tiles), static_cast<unsigned>(t.row_blocks)), dim3(t.tx, t.ty),
                   kTiledThreads, p);
    }
    run_column_sums<A, P>(p.partial_w, static_cast<P*>(b.grad_weight), p.partial_b, static_cast<P*>(b.grad_bias), G,
                          b.N, p.ldp, launcher);
  });
}

// ------------------------------------------------------------------------------------------- dropout_add_norm
struct DanForwardBuffers {
  const void* x;
  const void* residual;  // nullptr: none (sum dtype)
  const void* weight;    // nullptr: none
  const void* bias;      // nullptr: none
  const int64_t* seed;
  void* out;
  void* sum;   // sum dtype
  void* mean;  // accumulation dtype; nullptr for RMSNorm
  void* rstd;
  int64_t M, N;
  DType x_dtype, sum_dtype, param_dtype;
  double eps;
  bool rms;
  DropoutParams dropout;
};

struct DanBackwardBuffers {
  const void* grad_out;
  const void* grad_sum;  // nullptr: none (sum dtype)
  const void* sum;
  const void* weight;
  const void* bias;
  const void* mean;  // nullptr for RMSNorm
  const void* rstd;
  const int64_t* seed;
  void* grad_x;
  void* grad_residual;  // nullptr when there is no residual (sum dtype)
  void* grad_weight;    // param dtype, (N,); nullptr when there is no weight
  void* grad_bias;
  int64_t M, N;  // M > 0
  DType x_dtype, sum_dtype, param_dtype;
  bool rms;
  DropoutParams dropout;
};

// Calls f(Tag<x type>, Tag<sum type>, Tag<param type>): the sum has x's dtype, or fp32 for 16-bit x
// (residual_in_fp32); params x's dtype or fp32.
template <typename F>
void dispatch_dan_dtypes(DType x, DType sum, DType param, F&& f) {
  dispatch_ldr_dtypes(x, param, [&](auto xt, auto pt) {
    using S = typename decltype(xt)::type;
    if constexpr (sizeof(S) == 2) {
      if (sum == DType::kFloat32) return f(xt, Tag<float>{}, pt);
    }
    f(xt, xt, pt);
  });
}

// The rows kernels of dropout_add_norm: the 16-byte vector path of fp16 / bf16 / fp32 x only (the launcher
// sends the scalar path and fp64 to the looped kernels), every VPT plan_ldr_rows can pick at element size
// dan_elem (the x / sum pair) and the parameters' size.
template <typename S, typename U, typename P, typename A, bool kMapped>
auto dan_forward_rows(const RowsPlan& plan) -> void (*)(dev::DanForwardParams<S, U, P, A>) {
  constexpr int kElem = dan_elem(sizeof(S), sizeof(U));
  if (!plan.warp_row) {  // a block a row: 4 or 3 groups a thread; 2 too with fp32 x, sum or parameters
    if constexpr (kElem == 4 || sizeof(P) == 4) {
      if (plan.vpt == 2) return GPUOPT_ROWS_KERNEL(dan_forward_rows, S, U, P, A, false, 2);
    }
    return plan.vpt == 3 ? GPUOPT_ROWS_KERNEL(dan_forward_rows, S, U, P, A, false, 3)
                         : GPUOPT_ROWS_KERNEL(dan_forward_rows, S, U, P, A, false, 4);
  }
  switch (plan.vpt) {
    case 1:
      return GPUOPT_ROWS_KERNEL(dan_forward_rows, S, U, P, A, true, 1);
    case 2:
      return GPUOPT_ROWS_KERNEL(dan_forward_rows, S, U, P, A, true, 2);
    case 3:
      return GPUOPT_ROWS_KERNEL(dan_forward_rows, S, U, P, A, true, 3);
    default:
      return GPUOPT_ROWS_KERNEL(dan_forward_rows, S, U, P, A, true, 4);
  }
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
  if (!plan.warp_row) {  // a block a row: 4, 3 or 2 groups a thread (plan_ldr_rows, the vector path)
    if (plan.vpt == 4) return GPUOPT_ROWS_KERNEL(dan_backward_rows, S, U, P, A, false, 4);
    if (plan.vpt == 3) return GPUOPT_ROWS_KERNEL(dan_backward_rows, S, U, P, A, false, 3);
    return GPUOPT_ROWS_KERNEL(dan_backward_rows, S, U, P, A, false, 2);
  }
  return plan.vpt == 1 ? GPUOPT_ROWS_KERNEL(dan_backward_rows, S, U, P, A, true, 1)
                       : GPUOPT_ROWS_KERNEL(dan_backward_rows, S, U, P, A, true, 2);
}

template <class Launcher>
void run_dan_forward(const DanForwardBuffers& b, Launcher& launcher) {
  dispatch_dan_dtypes(b.x_dtype, b.sum_dtype, b.param_dtype, [&](auto st, auto ut, auto pt) {
    using S = typename decltype(st)::type;
    using U = typename decltype(ut)::type;
    using P = typename decltype(pt)::type;
    using A = dev::acc_t_of<S>;
    dev::DanForwardParams<S, U, P, A> p;
    p.x = static_cast<const S*>(b.x);
    p.residual = static_cast<const U*>(b.residual);
    p.weight = static_cast<const P*>(b.weight);
    p.bias = static_cast<const P*>(b.bias);
    p.seed = b.seed;
    p.out = static_cast<S*>(b.out);
    p.sum = static_cast<U*>(b.sum);
    p.mean = static_cast<A*>(b.mean);
    p.rstd = static_cast<A*>(b.rstd);
    p.M = b.M;
    p.N = b.N;
    p.inv_n = inv_n_of<A>(b.N);
    p.eps = static_cast<A>(b.eps);
    p.scale = static_cast<A>(b.dropout.scale);
    p.threshold = b.dropout.threshold;
    const bool mapped = dev::read_map(b.dropout);  // the seed holds a shard map and the RNG runs
    p.rms = b.rms;
    p.relu = false;  // not read by dropout_add_norm's kernels
    p.x_vec = vector_access(b.N, {b.x, b.out, b.residual, b.sum});
    p.p_vec = vector_access(b.N, {b.weight, b.bias});
    const bool vec = p.x_vec && p.p_vec;
    const RowsPlan plan = plan_ldr_rows(b.M, b.N, dan_elem(sizeof(S), sizeof(U)), sizeof(P), /*backward=*/false, true);
    if constexpr (sizeof(S) != 8) {
      if (vec && plan.rows) {
        auto kernel = mapped ? dan_forward_rows<S, U, P, A, true>(plan) : dan_forward_rows<S, U, P, A, false>(plan);
        const dim3 block(plan.threads_x, plan.rows_per_block);
        const int per_sm = launcher.blocks_per_sm(kernel, plan.threads_x * plan.rows_per_block);
        const int64_t grid = persistent_grid(plan.blocks_needed, per_sm, launcher.sm_count());
        launcher.run("dan_forward_rows_kernel", kernel, dim3(static_cast<unsigned>(grid)), block, plan.max_threads, p);
        return;
      }
    }
    auto kernel =
        mapped ? dev::dan_forward_looped_mapped_kernel<S, U, P, A> : dev::dan_forward_looped_kernel<S, U, P, A>;
    const int per_sm = launcher.blocks_per_sm(kernel, kLoopedThreads);
    const int64_t grid = persistent_grid(b.M, per_sm, launcher.sm_count());
    launcher.run("dan_forward_looped_kernel", kernel, dim3(static_cast<unsigned>(grid)), dim3(kLoopedThreads),
                 kLoopedThreads, p);
  });
}

template <class Launcher>
void run_dan_backward(const DanBackwardBuffers& b, Launcher& launcher) {
  dispatch_dan_dtypes(b.x_dtype, b.sum_dtype, b.param_dtype, [&](auto st, auto ut, auto pt) {
    using S = typename decltype(st)::type;
    using U = typename decltype(ut)::type;
    using P = typename decltype(pt)::type;
    using A = dev::acc_t_of<S>;
    dev::DanBackwardParams<S, U, P, A> p;
    p.grad_out = static_cast<const S*>(b.grad_out);
    p.x = static_cast<const U*>(b.sum);
    p.grad_sum = static_cast<const U*>(b.grad_sum);
    p.weight = static_cast<const P*>(b.weight);
    p.bias = static_cast<const P*>(b.bias);
    p.mean = static_cast<const A*>(b.mean);
    p.rstd = static_cast<const A*>(b.rstd);
    p.seed = b.seed;
    p.grad_x = static_cast<S*>(b.grad_x);
    p.grad_residual = static_cast<U*>(b.grad_residual);
    p.row_stats = nullptr;
    p.M = b.M;
    p.N = b.N;
    p.inv_n = inv_n_of<A>(b.N);
    p.ldp = partial_stride(b.N);
    p.scale = static_cast<A>(b.dropout.scale);
    p.threshold = b.dropout.threshold;
    const bool mapped = dev::read_map(b.dropout);  // the seed holds a shard map and the RNG runs
    p.rms = b.rms;
    p.x_vec = vector_access(b.N, {b.grad_out, b.sum, b.grad_sum, b.grad_x, b.grad_residual});
    p.p_vec = vector_access(b.N, {b.weight});  // the bias is not read
    const int sms = launcher.sm_count();
    const bool vec = p.x_vec && p.p_vec && sizeof(S) != 8;  // fp64 takes the scalar looped kernels
    const RowsPlan plan =
        plan_dan_backward(b.M, b.N, sizeof(S), sizeof(U), sizeof(P), launcher.shared_per_block() - kWideStaticShared);
    int64_t G = 0;
    auto alloc_partials = [&] {
      p.partial_w = b.grad_weight != nullptr ? launcher.template scratch<A>(G * p.ldp) : nullptr;
      p.partial_b = b.grad_bias != nullptr ? launcher.template scratch<A>(G * p.ldp) : nullptr;
    };
    bool done = false;
    if constexpr (sizeof(S) != 8) {
      if (vec && plan.rows) {
        auto kernel = mapped ? dan_backward_rows<S, U, P, A, true>(plan) : dan_backward_rows<S, U, P, A, false>(plan);
        const int per_sm = launcher.blocks_per_sm(kernel, plan.threads_x * plan.rows_per_block, plan.shared);
        G = persistent_grid(plan.blocks_needed, per_sm, sms);
        alloc_partials();
        launcher.run(plan.wide ? "dan_backward_wide_kernel" : "dan_backward_rows_kernel", kernel,
                     dim3(static_cast<unsigned>(G)), dim3(plan.threads_x, plan.rows_per_block), plan.max_threads, p,
                     plan.shared);
        done = true;
      }
    }
    if (!done) {
      p.row_stats = launcher.template scratch<A>(2 * b.M);
      void (*stats)(dev::DanBackwardParams<S, U, P, A>) =
          mapped ? dev::dan_backward_row_stats_mapped_kernel<S, U, P, A, false>
                 : dev::dan_backward_row_stats_kernel<S, U, P, A, false>;
      void (*tiled)(dev::DanBackwardParams<S, U, P, A>) = mapped
                                                              ? dev::dan_backward_tiled_mapped_kernel<S, U, P, A, false>
                                                              : dev::dan_backward_tiled_kernel<S, U, P, A, false>;
      if constexpr (sizeof(S) != 8) {
        if (vec) {
          stats = mapped ? dev::dan_backward_row_stats_mapped_kernel<S, U, P, A, true>
                         : dev::dan_backward_row_stats_kernel<S, U, P, A, true>;
          tiled = mapped ? dev::dan_backward_tiled_mapped_kernel<S, U, P, A, true>
                         : dev::dan_backward_tiled_kernel<S, U, P, A, true>;
        }
      }
      const int64_t stats_grid = persistent_grid(b.M, launcher.blocks_per_sm(stats, kLoopedThreads), sms);
      const TilePlan t = plan_tiled(b.M, b.N, int64_t(launcher.blocks_per_sm(tiled, kTiledThreads)) * sms);
      G = t.row_blocks;
      alloc_partials();
      launcher.run("dan_backward_row_stats_kernel", stats, dim3(static_cast<unsigned>(stats_grid)),
                   dim3(kLoopedThreads), kLoopedThreads, p);
      launcher.run("dan_backward_tiled_kernel", tiled,
                   dim3(static_cast<unsigned>(t.col_tiles), static_cast<unsigned>(t.row_blocks)), dim3(t.tx, t.ty),
                   kTiledThreads, p);
    }
    run_column_sums<A, P>(p.partial_w, static_cast<P*>(b.grad_weight), p.partial_b, static_cast<P*>(b.grad_bias), G,
                          b.N, p.ldp, launcher);
  });
}

template <class Launcher>
void run_bias_relu(const BiasReluBuffers& b, Launcher& launcher) {
  dispatch_act(b.act, [&](auto ac) {
    constexpr int kAct = decltype(ac)::value;
    dispatch_ldr_dtypes(b.x_dtype, b.bias_dtype, [&](auto st, auto bt) {
      using S = typename decltype(st)::type;
      using B = typename decltype(bt)::type;
      dev::BiasReluParams<S, B> p;
      p.x = static_cast<const S*>(b.x);
      p.bias = static_cast<const B*>(b.bias);
      p.out = static_cast<S*>(b.out);
      p.M = b.M;
      p.N = b.N;
      auto kernel = vector_access(b.N, {b.x, b.out, b.bias}) ? dev::bias_act_forward_kernel<S, B, true, kAct>
                                                             : dev::bias_act_forward_kernel<S, B, false, kAct>;
      const TilePlan t =
          plan_tiled(b.M, b.N, int64_t(launcher.blocks_per_sm(kernel, kTiledThreads)) * launcher.sm_count());
      launcher.run("bias_act_forward_kernel", kernel,
                   dim3(static_cast<unsigned>(t.col_tiles), static_cast<unsigned>(t.row_blocks)), dim3(t.tx, t.ty),
                   kTiledThreads, p);
    });
  });
}

template <int kAct, typename S, typename B, class Launcher>
void run_bias_act_backward_typed(const BiasReluBackwardBuffers& b, Launcher& launcher) {
  using A = dev::acc_t_of<S>;
  dev::BiasReluBackwardParams<S, B> p;
  p.grad_out = static_cast<const S*>(b.grad_out);
  p.saved = static_cast<const S*>(b.saved);
  p.bias = kAct == kActRelu ? nullptr : static_cast<const B*>(b.bias);
  p.grad_x = static_cast<S*>(b.grad_x);
  p.M = b.M;
  p.N = b.N;
  p.ldp = partial_stride(b.N);
  auto kernel = vector_access(b.N, {b.grad_out, b.saved, b.grad_x, p.bias})
                    ? dev::bias_act_backward_kernel<S, B, true, kAct>
                    : dev::bias_act_backward_kernel<S, B, false, kAct>;
  const TilePlan t = plan_tiled(b.M, b.N, int64_t(launcher.blocks_per_sm(kernel, kTiledThreads)) * launcher.sm_count());
  p.partial = launcher.template scratch<A>(t.row_blocks * p.ldp);
  launcher.run("bias_act_backward_kernel", kernel,
               dim3(static_cast<unsigned>(t.col_tiles), static_cast<unsigned>(t.row_blocks)), dim3(t.tx, t.ty),
               kTiledThreads, p);
  run_column_sums<A, A>(p.partial, static_cast<A*>(b.grad_bias), nullptr, nullptr, t.row_blocks, b.N, p.ldp, launcher);
}

template <class Launcher>
void run_bias_relu_backward(const BiasReluBackwardBuffers& b, Launcher& launcher) {
  dispatch_act(b.act, [&](auto ac) {
    constexpr int kAct = decltype(ac)::value;
    if constexpr (kAct == kActRelu) {  // no bias read: one instantiation a dtype
      dispatch_dtype(b.dtype, [&](auto st) {
        using S = typename decltype(st)::type;
        run_bias_act_backward_typed<kAct, S, S>(b, launcher);
      });
    } else {
      dispatch_ldr_dtypes(b.dtype, b.bias_dtype, [&](auto st, auto bt) {
        run_bias_act_backward_typed<kAct, typename decltype(st)::type, typename decltype(bt)::type>(b, launcher);
      });
    }
  });
}

#undef GPUOPT_ROWS_KERNEL

}  // namespace cuda
}  // namespace gpuopt
