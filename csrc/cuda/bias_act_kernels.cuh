// CUDA kernels of gpuopt::bias_act and its backward, and of bias_relu (= bias_act with act 0, kActRelu): the tiled
// launch shape of launch_config.h, thread (tx, ty) of block (bx, by) owns the group of 8 columns
// 8 * (bx * TX + tx) in rows by * TY + ty, + gridDim.y * TY, ... so its bias values and dbias sums stay in
// registers across every row it visits. The activation is a template parameter (fused_math.h's act codes).
#pragma once
#include <cstdint>

#include "cuda/column_sums.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/launch_config.h"
#include "fused_math.h"

namespace gpuopt {
namespace dev {

template <typename S, typename B>
struct BiasActParams {
  const S* x;     // (M, N)
  const B* bias;  // (N)
  S* out;         // (M, N)
  int64_t M, N;
};

// Rows a thread loads before it computes and stores any of them: U loads in flight per thread (predicated on
// row < M), so a block of 256 threads keeps 256 x U x 16 bytes (or x 32 for fp32) of reads in flight.
constexpr int kBiasActRows = 4;

// out = act(x + bias) (bias broadcast over the rows; act: fused_math.h's act codes, kActRelu for bias_relu).
// kVec (the launcher's choice: N % 8 == 0 and x, out, bias 16-byte aligned) makes every group 16-byte vectors
// at compile time; otherwise element by element, with the row's last group partial.
template <typename S, typename B, bool kVec, int kAct>
__global__ void __launch_bounds__(cuda::kTiledThreads) bias_act_forward_kernel(BiasActParams<S, B> p) {
  using A = acc_t_of<S>;
  constexpr int U = kBiasActRows;
  const int64_t N = p.N, M = p.M;
  const int64_t c0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kGroup;
  if (c0 >= N) return;  // no barrier in this kernel
  const int valid = kVec ? kGroup : group_size(N, c0);
  A b[kGroup];
  load_group(p.bias + c0, valid, kVec, b);
  const int64_t stride = int64_t(gridDim.y) * blockDim.y;
  const S* __restrict__ x = p.x + c0;
  S* __restrict__ out = p.out + c0;
  for (int64_t row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; row < M; row += U * stride) {
    Group<S> v[U];
    for_each_below<U>(row, stride, M, [&](int u, int64_t r) { load_raw_group(x + r * N, valid, kVec, v[u]); });
    for_each_below<U>(row, stride, M, [&](int u, int64_t r) {
      A o[kGroup];
#pragma unroll
      for (int j = 0; j < kGroup; ++j) o[j] = act_forward<kAct, A>(to_acc(v[u].v[j]) + b[j]);
      store_group(out + r * N, valid, kVec, o);
    });
  }
}

// saved: the output for relu (mask out > 0; bias unused, may be nullptr), x for the other activations.
template <typename S, typename B>
struct BiasActBackwardParams {
  const S* grad_out;     // (M, N)
  const S* saved;        // (M, N)
  const B* bias;         // (N)
  S* grad_x;             // (M, N)
  acc_t_of<S>* partial;  // (G = gridDim.y, ldp) per-block column sums of grad_x
  int64_t M, N, ldp;
};

// grad_x = grad_out * act'(.) (relu: from the saved output, out > 0; the other activations from x + bias) and
// dbias = the column sums of grad_x, as per-block partial rows (column_sums.cuh adds them).
template <typename S, typename B, bool kVec, int kAct>
__global__ void __launch_bounds__(cuda::kTiledThreads) bias_act_backward_kernel(BiasActBackwardParams<S, B> p) {
  using A = acc_t_of<S>;
  constexpr int U = kBiasActRows;
  GPUOPT_SHARED_ARRAY(A, comb, cuda::kTiledThreads * kGroup);
  const int64_t N = p.N, M = p.M;
  const int64_t c0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kGroup;
  const int valid = c0 < N ? (kVec ? kGroup : group_size(N, c0)) : 0;
  A db[kGroup];
#pragma unroll
  for (int j = 0; j < kGroup; ++j) db[j] = A(0);
  if (valid > 0) {
    A b[kGroup];
    if constexpr (kAct != kActRelu) {
      load_group(p.bias + c0, valid, kVec, b);
    } else {
#pragma unroll
      for (int j = 0; j < kGroup; ++j) b[j] = A(0);
    }
    const int64_t stride = int64_t(gridDim.y) * blockDim.y;
    const S* __restrict__ grad_out = p.grad_out + c0;
    const S* __restrict__ out = p.saved + c0;
    S* __restrict__ grad_x = p.grad_x + c0;
    for (int64_t row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; row < M; row += U * stride) {
      Group<S> g[U], o[U];
      for_each_below<U>(row, stride, M, [&](int u, int64_t r) {
        load_raw_group(grad_out + r * N, valid, kVec, g[u]);
        load_raw_group(out + r * N, valid, kVec, o[u]);
      });
      for_each_below<U>(row, stride, M, [&](int u, int64_t r) {
        A d[kGroup];
#pragma unroll
        for (int j = 0; j < kGroup; ++j) {
          d[j] = act_backward_element<kAct, A>(to_acc(g[u].v[j]), to_acc(o[u].v[j]), b[j]);
          db[j] += d[j];
        }
        store_group(grad_x + r * N, valid, kVec, d);
      });
    }
  }
  write_tile_partials(db, p.partial, p.ldp, N, comb);
}

}  // namespace dev
}  // namespace gpuopt
