// CUDA kernels of gpuopt::bias_relu and its backward: the tiled launch shape of launch_config.h, thread (tx, ty)
// of block (bx, by) owns the group of 8 columns 8 * (bx * TX + tx) in rows by * TY + ty, + gridDim.y * TY, ...
// so its bias values (forward) or dbias sums (backward) stay in registers across every row it visits.
#pragma once
#include <cstdint>

#include "cuda/column_sums.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/launch_config.h"
#include "fused_math.h"

namespace gpuopt {
namespace dev {

template <typename S, typename B>
struct BiasReluParams {
  const S* x;
  const B* bias;
  S* out;
  int64_t M, N;
  bool x_vec;  // N % 8 == 0, x and out 16-byte aligned
  bool b_vec;  // N % 8 == 0, bias 16-byte aligned
};

template <typename S, typename B>
__global__ void __launch_bounds__(cuda::kTiledThreads) bias_relu_forward_kernel(BiasReluParams<S, B> p) {
  using A = acc_t_of<S>;
  const int64_t N = p.N;
  const int64_t c0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kGroup;
  if (c0 >= N) return;  // no barrier in this kernel
  const int valid = group_size(N, c0);
  A b[kGroup];
  load_param_group(p.bias, c0, valid, p.b_vec, A(0), b);
#pragma unroll 4  // several rows' loads in flight per thread
  for (int64_t row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; row < p.M;
       row += int64_t(gridDim.y) * blockDim.y) {
    A v[kGroup];
    load_group(p.x + row * N + c0, valid, p.x_vec, v);
#pragma unroll
    for (int j = 0; j < kGroup; ++j) v[j] = bias_relu_forward_element<A>(v[j], b[j]);
    store_group(p.out + row * N + c0, valid, p.x_vec, v);
  }
}

template <typename S>
struct BiasReluBackwardParams {
  const S* grad_out;
  const S* out;
  S* grad_x;
  acc_t_of<S>* partial;  // (G = gridDim.y, ldp) per-block column sums of grad_x
  int64_t M, N, ldp;
  bool x_vec;  // N % 8 == 0, grad_out, out, grad_x 16-byte aligned
};

template <typename S>
__global__ void __launch_bounds__(cuda::kTiledThreads) bias_relu_backward_kernel(BiasReluBackwardParams<S> p) {
  using A = acc_t_of<S>;
  GPUOPT_SHARED_ARRAY(A, comb, cuda::kTiledThreads * kGroup);
  const int64_t N = p.N;
  const int64_t c0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kGroup;
  const int valid = c0 < N ? group_size(N, c0) : 0;
  A db[kGroup];
#pragma unroll
  for (int j = 0; j < kGroup; ++j) db[j] = A(0);
  if (valid > 0) {
#pragma unroll 4
    for (int64_t row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; row < p.M;
         row += int64_t(gridDim.y) * blockDim.y) {
      A g[kGroup], o[kGroup];
      load_group(p.grad_out + row * N + c0, valid, p.x_vec, g);
      load_group(p.out + row * N + c0, valid, p.x_vec, o);
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        g[j] = bias_relu_backward_element<A>(g[j], o[j]);
        db[j] += g[j];
      }
      store_group(p.grad_x + row * N + c0, valid, p.x_vec, g);
    }
  }
  write_tile_partials(db, p.partial, p.ldp, N, comb);
}

}  // namespace dev
}  // namespace gpuopt
