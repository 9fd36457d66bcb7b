// Deterministic column sums (dgamma, dbeta, dbias): every block writes one partial row of its column sums
// (summed over its threads in a fixed order), then column_sum_kernel adds the G partial rows in a fixed order.
// No float atomics: the same inputs on the same device give the same bits.
#pragma once
#include <cstdint>

#include "cuda/kernel_utils.cuh"
#include "cuda/launch_config.h"

namespace gpuopt {
namespace dev {

// Adds a tiled block's per-thread column sums (blockDim (TX, TY), 8 columns a thread) over threadIdx.y in order
// and writes them as row blockIdx.y of the partial buffer; `shared` holds TX * TY * 8 = 2048 values.
template <typename A>
GPUOPT_DEV void write_tile_partials(const A (&acc)[kGroup], A* __restrict__ partial, int64_t ldp, int64_t N,
                                    A* shared) {
  const int TX = blockDim.x, TY = blockDim.y;
  const int lid = threadIdx.y * TX + threadIdx.x;
  __syncthreads();  // the previous use of `shared` is done
#pragma unroll
  for (int j = 0; j < kGroup; ++j) shared[lid * kGroup + j] = acc[j];
  __syncthreads();
  const int cols = TX * kGroup;  // <= 256 = threads of the block: one column a thread
  if (lid < cols) {
    const int64_t col = int64_t(blockIdx.x) * cols + lid;
    A t = A(0);
    for (int r = 0; r < TY; ++r) t += shared[r * cols + lid];  // shared[(r * TX + tx) * 8 + j], lid = tx * 8 + j
    if (col < N) partial[int64_t(blockIdx.y) * ldp + col] = t;
  }
}

// ------------------------------------------------------------------------------------------------- stage 2
// out[c] = sum over g = 0 .. G-1 of partial[g * ldp + c], always in the same order: a 32 x 32 block takes 32
// columns, thread (tx, ty) sums rows ty, ty + TY, ... of column tx (a warp reads 32 consecutive columns of a
// partial row; TY = blockDim.y = min(G, 32)), then thread (tx, 0) adds the TY results in ty order. blockIdx.y picks one of two sums.
template <typename A, typename O>
struct ColumnSumParams {
  const A* partial0;  // blockIdx.y == 0
  O* out0;
  const A* partial1;  // blockIdx.y == 1 (a select, not an indexed array: that would put the params in local memory)
  O* out1;
  int64_t G, N, ldp;
};

template <typename A, typename O>
__global__ void __launch_bounds__(cuda::kColumnSumTile* cuda::kColumnSumTile)
    column_sum_kernel(ColumnSumParams<A, O> p) {
  GPUOPT_SHARED_ARRAY(A, sums, cuda::kColumnSumTile * (cuda::kColumnSumTile + 1));
  const A* __restrict__ partial = blockIdx.y == 0 ? p.partial0 : p.partial1;
  O* __restrict__ out = blockIdx.y == 0 ? p.out0 : p.out1;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int TY = blockDim.y;  // min(G, 32): no idle rows of threads when there are few partial rows
  const int64_t col = int64_t(blockIdx.x) * cuda::kColumnSumTile + tx;
  A s = A(0);
  if (col < p.N) {
    // rows ty, ty + TY, ... in order; eight loads issued before their adds, so a thread has eight in flight
    constexpr int kBatch = 8;
    int64_t g = ty;
    for (; g + (kBatch - 1) * TY < p.G; g += kBatch * TY) {
      A v[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) v[k] = partial[(g + k * TY) * p.ldp + col];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) s += v[k];
    }
    for (; g < p.G; g += TY) s += partial[g * p.ldp + col];
  }
  sums[ty * (cuda::kColumnSumTile + 1) + tx] = s;
  __syncthreads();
  if (ty == 0 && col < p.N) {
    A t = A(0);
    for (int k = 0; k < TY; ++k) t += sums[k * (cuda::kColumnSumTile + 1) + tx];
    out[col] = from_acc<O>(t);
  }
}

}  // namespace dev
}  // namespace gpuopt
