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
// out[c] = sum over g = 0 .. G-1 of partial[g * ldp + c], always in the same order. A block of 32 x TY threads
// (TY = min(G, 32)) takes 32 x V columns (V = 1, or 16 / sizeof(A): cuda::column_sum_cols): thread (tx, ty) sums
// rows ty, ty + TY, ... of the V columns at V * tx, with one 16-byte load a row when V > 1 (a warp reads 512
// consecutive bytes of a partial row; the partial rows' stride is a multiple of 8, so every vector is aligned and
// inside the row's stride), then the block's threads add the TY results of a column in ty order, one column a
// thread. Every column's sum is the same whatever V. blockIdx.y picks one of two sums.
template <typename A, typename O>
struct ColumnSumParams {
  const A* partial0;  // (G, ldp) blockIdx.y == 0
  O* out0;            // (N)
  const A* partial1;  // (G, ldp) blockIdx.y == 1 (a select, not an indexed array: that would put the params in
                      // local memory)
  O* out1;            // (N)
  int64_t G, N, ldp;
};

template <typename A, typename O, int V>
__global__ void __launch_bounds__(cuda::kColumnSumTile* cuda::kColumnSumTile)
    column_sum_kernel(ColumnSumParams<A, O> p) {
  static_assert(V == 1 || V == cuda::column_sum_vec(sizeof(A)), "one column, or one 16-byte vector of them");
  constexpr int kCols = cuda::kColumnSumTile * V;  // the block's columns
  GPUOPT_SHARED_ARRAY(A, sums, cuda::kColumnSumTile * (kCols + 1));
  const A* __restrict__ partial = blockIdx.y == 0 ? p.partial0 : p.partial1;
  O* __restrict__ out = blockIdx.y == 0 ? p.out0 : p.out1;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int TY = blockDim.y;  // min(G, 32): no idle rows of threads when there are few partial rows
  const int64_t col0 = int64_t(blockIdx.x) * kCols;
  const int64_t c = col0 + int64_t(tx) * V;
  A s[V];
#pragma unroll
  for (int v = 0; v < V; ++v) s[v] = A(0);
  if (c < p.N) {
    // rows ty, ty + TY, ... in order; eight loads issued before their adds, so a thread has eight in flight
    constexpr int kBatch = 8;
    auto load = [&](int64_t g, A(&v)[V]) {
      if constexpr (V == 1) {
        v[0] = partial[g * p.ldp + c];
      } else {
        const uint4 raw = load16(partial + g * p.ldp + c);
        memcpy(v, &raw, sizeof(v));
      }
    };
    int64_t g = ty;
    for (; g + (kBatch - 1) * TY < p.G; g += kBatch * TY) {
      A v[kBatch][V];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) load(g + k * TY, v[k]);
#pragma unroll
      for (int k = 0; k < kBatch; ++k)
#pragma unroll
        for (int i = 0; i < V; ++i) s[i] += v[k][i];
    }
    for (; g < p.G; g += TY) {
      A v[V];
      load(g, v);
#pragma unroll
      for (int i = 0; i < V; ++i) s[i] += v[i];
    }
  }
#pragma unroll
  for (int v = 0; v < V; ++v) sums[ty * (kCols + 1) + tx * V + v] = s[v];
  __syncthreads();
  for (int k = ty * cuda::kColumnSumTile + tx; k < kCols; k += cuda::kColumnSumTile * TY) {
    if (col0 + k >= p.N) continue;
    A t = A(0);
    for (int r = 0; r < TY; ++r) t += sums[r * (kCols + 1) + k];
    out[col0 + k] = from_acc<O>(t);
  }
}

}  // namespace dev
}  // namespace gpuopt
