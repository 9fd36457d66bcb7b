// CUDA kernels of gpuopt::bias_relu (out = relu(x + bias)) and bias_relu_backward (grad_x = grad_out * [out > 0],
// grad_bias = sum over rows of grad_x, fused in one pass). DESIGN.md is the contract.
//
// Forward: elementwise, grid-stride over vectors of VEC elements (VEC = 8, 16-byte accesses, when N % 8 == 0
// and the pointers are aligned; VEC = 1 otherwise), int64 indexing; the bias column of a vector is carried along
// incrementally so the loop has no 64-bit division.
// Backward: 2-D tiles (column tiles x row chunks) write grad_x and the per-column sums of their rows into a
// (chunks, N) partial buffer; column_sum_kernel adds the partial rows in a fixed order (no float atomics).
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>

#include "checks.h"
#include "cuda/cuda_utils.cuh"
#include "dispatch.h"
#include "fused_math.h"

namespace gpuopt {
namespace {

using cuda::kTileX;
using cuda::kTileY;
using cuda::load_acc;
using cuda::store_acc;

constexpr int kVec = 8;
constexpr int kForwardThreads = 256;

// total_vecs vectors of VEC elements, vecs_per_row of them per row (N = vecs_per_row * VEC).
template <typename scalar_t, typename param_t, typename acc_t, int VEC>
__global__ __launch_bounds__(kForwardThreads) void bias_relu_forward_kernel(const scalar_t* __restrict__ x,
                                                                            const param_t* __restrict__ bias,
                                                                            scalar_t* __restrict__ out,
                                                                            int64_t total_vecs,
                                                                            int64_t vecs_per_row) {
  int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= total_vecs) return;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t col_step = stride % vecs_per_row;
  int64_t col = v % vecs_per_row;
  for (; v < total_vecs; v += stride) {
    acc_t xv[VEC], bv[VEC], o[VEC];
    load_acc<VEC>(x + v * VEC, xv);
    load_acc<VEC>(bias + col * VEC, bv);
#pragma unroll
    for (int j = 0; j < VEC; ++j) o[j] = bias_relu_forward_element<acc_t>(xv[j], bv[j]);
    store_acc<VEC>(out + v * VEC, o);
    col += col_step;  // col, col_step < vecs_per_row, so one subtraction wraps it
    if (col >= vecs_per_row) col -= vecs_per_row;
  }
}

// Block (tile, chunk) = (blockIdx.x % col_tiles, blockIdx.x / col_tiles): grad_x of rows [chunk * rows_per_chunk,
// ...) in its kTileX * VEC columns, and their per-column sums into row `chunk` of partial (chunks, N); the
// kTileY row-threads of a column are added in a fixed order.
template <typename scalar_t, typename acc_t, int VEC>
__global__ __launch_bounds__(kTileX* kTileY) void bias_relu_backward_tile_kernel(
    const scalar_t* __restrict__ grad_out, const scalar_t* __restrict__ out, scalar_t* __restrict__ grad_x,
    acc_t* __restrict__ partial, int64_t M, int64_t N, int64_t col_tiles, int64_t rows_per_chunk) {
  constexpr int kCols = kTileX * VEC;
  __shared__ acc_t tile_sum[kTileY][kCols];
  const int64_t tile = blockIdx.x % col_tiles;
  const int64_t chunk = blockIdx.x / col_tiles;
  const int64_t c0 = tile * kCols + static_cast<int64_t>(threadIdx.x) * VEC;
  const int64_t row_begin = chunk * rows_per_chunk;
  const int64_t row_end = row_begin + rows_per_chunk < M ? row_begin + rows_per_chunk : M;

  acc_t sum[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) sum[j] = acc_t(0);
  if (c0 < N) {  // N % VEC == 0: a vector is wholly inside the row or wholly outside
    for (int64_t row = row_begin + threadIdx.y; row < row_end; row += kTileY) {
      const int64_t offset = row * N + c0;
      acc_t gv[VEC], ov[VEC], dx[VEC];
      load_acc<VEC>(grad_out + offset, gv);
      load_acc<VEC>(out + offset, ov);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        dx[j] = bias_relu_backward_element<acc_t>(gv[j], ov[j]);
        sum[j] += dx[j];
      }
      store_acc<VEC>(grad_x + offset, dx);
    }
  }
#pragma unroll
  for (int j = 0; j < VEC; ++j) tile_sum[threadIdx.y][threadIdx.x * VEC + j] = sum[j];
  __syncthreads();
  for (int l = threadIdx.y * kTileX + threadIdx.x; l < kCols; l += kTileX * kTileY) {
    const int64_t col = tile * kCols + l;
    if (col < N) {
      acc_t s = acc_t(0);
#pragma unroll
      for (int k = 0; k < kTileY; ++k) s += tile_sum[k][l];
      partial[chunk * N + col] = s;
    }
  }
}

template <typename scalar_t, typename param_t>
void bias_relu_forward_launch(const BiasReluArgs& a, at::Tensor& out) {
  using acc_t = acc_type_t<scalar_t>;
  const scalar_t* x = a.x.data_ptr<scalar_t>();
  const param_t* b = a.bias.data_ptr<param_t>();
  scalar_t* o = out.data_ptr<scalar_t>();
  const bool fast = a.N % kVec == 0 && cuda::is_aligned16(x) && cuda::is_aligned16(b) && cuda::is_aligned16(o);
  const int vec = fast ? kVec : 1;
  const int64_t total_vecs = a.M * a.N / vec;
  auto kernel = fast ? bias_relu_forward_kernel<scalar_t, param_t, acc_t, kVec>
                     : bias_relu_forward_kernel<scalar_t, param_t, acc_t, 1>;
  const int64_t resident = cuda::resident_blocks(kernel, kForwardThreads, 0, a.x.device().index());
  const int64_t grid = std::min(cuda::ceil_div(total_vecs, kForwardThreads), 2 * resident);
  kernel<<<static_cast<unsigned>(grid), kForwardThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x, b, o, total_vecs, a.N / vec);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename scalar_t, int VEC>
void bias_relu_backward_launch(const BiasReluBackwardArgs& a, at::Tensor& grad_x, at::Tensor& grad_bias) {
  using acc_t = acc_type_t<scalar_t>;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  auto kernel = bias_relu_backward_tile_kernel<scalar_t, acc_t, VEC>;
  const cuda::TileGrid t =
      cuda::tile_grid(a.M, a.N, VEC, cuda::resident_blocks(kernel, kTileX * kTileY, 0, a.out.device().index()));
  at::Tensor partial = at::empty({t.chunks, a.N}, a.out.options().dtype(c10::CppTypeToScalarType<acc_t>::value));
  kernel<<<t.blocks(), dim3(kTileX, kTileY), 0, stream>>>(a.grad_out.data_ptr<scalar_t>(), a.out.data_ptr<scalar_t>(),
                                                          grad_x.data_ptr<scalar_t>(), partial.data_ptr<acc_t>(), a.M,
                                                          a.N, t.col_tiles, t.rows_per_chunk);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  cuda::ColumnSumArgs<acc_t, scalar_t> sums{};
  sums.partial0 = partial.data_ptr<acc_t>();
  sums.out0 = grad_bias.data_ptr<scalar_t>();
  cuda::launch_column_sum(sums, t.chunks, a.N, stream);
}

at::Tensor bias_relu_cuda(const at::Tensor& x, const at::Tensor& bias) {
  BiasReluArgs a = check_bias_relu(x, bias);
  c10::cuda::CUDAGuard guard(a.x.device());
  at::Tensor out = at::empty(a.x.sizes(), a.x.options());
  if (a.M == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "bias_relu_cuda", [&] {
    if (a.bias.scalar_type() == at::kFloat) {
      bias_relu_forward_launch<scalar_t, float>(a, out);
    } else {
      bias_relu_forward_launch<scalar_t, scalar_t>(a, out);
    }
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> bias_relu_backward_cuda(const at::Tensor& grad_out, const at::Tensor& out) {
  BiasReluBackwardArgs a = check_bias_relu_backward(grad_out, out);
  c10::cuda::CUDAGuard guard(a.out.device());
  at::Tensor grad_x = at::empty(a.out.sizes(), a.out.options());
  if (a.M == 0) return {grad_x, at::zeros({a.N}, a.out.options())};
  at::Tensor grad_bias = at::empty({a.N}, a.out.options());  // every element written by the stage-2 sum
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.out.scalar_type(), "bias_relu_backward_cuda", [&] {
    const bool fast = a.N % kVec == 0 && cuda::is_aligned16(a.grad_out.data_ptr<scalar_t>()) &&
                      cuda::is_aligned16(a.out.data_ptr<scalar_t>()) &&
                      cuda::is_aligned16(grad_x.data_ptr<scalar_t>());
    if (fast) {
      bias_relu_backward_launch<scalar_t, kVec>(a, grad_x, grad_bias);
    } else {
      bias_relu_backward_launch<scalar_t, 1>(a, grad_x, grad_bias);
    }
  });
  return {grad_x, grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(gpuopt, CUDA, m) {
  m.impl("bias_relu", &bias_relu_cuda);
  m.impl("bias_relu_backward", &bias_relu_backward_cuda);
}

}  // namespace gpuopt
