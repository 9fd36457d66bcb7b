// CUDA kernels of gpuopt::layer_norm_dropout_relu and its backward (DESIGN.md is the contract).
//
// Forward, one block per row (grid-stride over rows, int64 indexing):
//   register path  N % 8 == 0, 16-byte aligned, N <= 32768 (8192 for fp64): the row is read once into registers
//                  as ITEMS vectors of 8 per thread; a vector of 8 is one Philox group: one call per 8 elements.
//   looped path    longer rows: vectors of 8 read from global memory once per pass (mean, variance, output);
//                  the generic path (any N or alignment) loops over single elements, one Philox call each.
// Backward, deterministic (no float atomics), dgamma / dbeta summed in a fixed order:
//   register path  N % 8 == 0, aligned, N <= 16384 (16-bit x) or 8192: G blocks each own the rows blockIdx.x,
//                  + G, ...; a thread keeps its row vectors (x, grad_out, keep bits) in registers and its columns'
//                  dgamma / dbeta in registers across the block's rows, then writes a (G, N) partial row.
//   looped path    any other N / alignment (vectors of 8 or single elements), in two kernels: a row kernel for
//                  the two row means of the grad_x formula, then a 2-D tiled kernel (column tiles x row chunks)
//                  that writes grad_x and sums dgamma / dbeta of its rows per column into (chunks, N).
//   stage 2        column_sum_kernel adds the partial rows in order and writes the parameter dtype.
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

using cuda::ceil_div;
using cuda::dropout_keep_bits;
using cuda::inverse_sqrt;
using cuda::kTileX;
using cuda::kTileY;
using cuda::load_acc;
using cuda::load_pack;
using cuda::load_param;
using cuda::Pack;
using cuda::read_seed;
using cuda::store_acc;

constexpr int kVec = 8;  // elements per vector on the fast paths: exactly one Philox group

// Threads per row of the register path for ITEMS vectors per thread, chosen so that ptxas keeps the row (and in
// the backward the dgamma / dbeta accumulators) in registers: ITEMS 1 and 2 never need more than 256 threads
// (vecs <= 512); ITEMS 4 forward takes 1024 threads (64 registers), 256 for fp64; ITEMS 4 backward holds about
// twice as much per thread, so 512 threads for 16-bit x and 256 for fp32 / fp64. Longer rows are looped.
template <typename scalar_t>
constexpr int register_threads(int items, bool backward) {
  if (items < 4) return 256;
  if (!backward) return sizeof(scalar_t) <= 4 ? 1024 : 256;
  return sizeof(scalar_t) == 2 ? 512 : 256;
}

template <typename scalar_t>
constexpr int64_t register_max_vecs(bool backward) {
  return 4 * register_threads<scalar_t>(4, backward);
}

// Vectors per thread of the register path: few threads per row for short rows, more work per thread for long.
inline int register_items(int64_t vecs) { return vecs <= 256 ? 1 : (vecs <= 512 ? 2 : 4); }

// ---------------------------------------------------------------------------------------------------------------
// Forward kernels. All share one signature, so the launcher picks a kernel pointer and launches it once.

template <typename scalar_t, typename param_t, typename acc_t>
using ForwardKernel = void (*)(const scalar_t*, const param_t*, const param_t*, const int64_t*, scalar_t*, acc_t*,
                               acc_t*, int64_t, int64_t, uint32_t, float, acc_t);

template <typename scalar_t, typename param_t, typename acc_t, int ITEMS>
__global__ __launch_bounds__(register_threads<scalar_t>(ITEMS, false)) void ldr_forward_register_kernel(
    const scalar_t* __restrict__ x, const param_t* __restrict__ weight, const param_t* __restrict__ bias,
    const int64_t* __restrict__ seed_ptr, scalar_t* __restrict__ out, acc_t* __restrict__ mean_out,
    acc_t* __restrict__ rstd_out, int64_t M, int64_t N, uint32_t threshold, float scale_f, acc_t eps) {
  __shared__ acc_t shared[cuda::kWarpSize];
  const int64_t seed = read_seed(seed_ptr, threshold);
  const acc_t scale = static_cast<acc_t>(scale_f);
  const int vecs = static_cast<int>(N / kVec);
  const acc_t n = static_cast<acc_t>(N);

  for (int64_t row = blockIdx.x; row < M; row += gridDim.x) {
    const int64_t row_offset = row * N;
    Pack<scalar_t, kVec> xv[ITEMS];  // raw: 16-bit rows take half the registers of fp32 copies
    acc_t sum = acc_t(0);
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int vec = threadIdx.x + i * blockDim.x;
      if (vec < vecs) {
        xv[i] = load_pack<scalar_t, kVec>(x + row_offset + vec * kVec);
#pragma unroll
        for (int j = 0; j < kVec; ++j) sum += static_cast<acc_t>(xv[i].v[j]);
      }
    }
    const acc_t mean = cuda::block_reduce_sum(sum, shared) / n;

    acc_t sq = acc_t(0);
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      if (static_cast<int>(threadIdx.x + i * blockDim.x) < vecs) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const acc_t d = static_cast<acc_t>(xv[i].v[j]) - mean;
          sq += d * d;
        }
      }
    }
    const acc_t var = cuda::block_reduce_sum(sq, shared) / n;
    const acc_t rstd = inverse_sqrt(var + eps);
    if (threadIdx.x == 0) {
      mean_out[row] = mean;
      rstd_out[row] = rstd;
    }

#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int vec = threadIdx.x + i * blockDim.x;
      if (vec < vecs) {
        const int c0 = vec * kVec;
        acc_t w[kVec], b[kVec], o[kVec];
        load_param<kVec>(weight, c0, acc_t(1), w);
        load_param<kVec>(bias, c0, acc_t(0), b);
        const uint32_t keep = dropout_keep_bits<kVec>(seed, row_offset + c0, threshold);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const acc_t y = (static_cast<acc_t>(xv[i].v[j]) - mean) * rstd * w[j] + b[j];
          o[j] = ldr_forward_element<acc_t>(y, (keep >> j) & 1u, scale);
        }
        store_acc<kVec>(out + row_offset + c0, o);
      }
    }
  }
}

// VEC = 8 (aligned, N % 8 == 0, long rows) or 1 (generic). Reads the row from global memory in three passes.
template <typename scalar_t, typename param_t, typename acc_t, int VEC>
__global__ __launch_bounds__(1024) void ldr_forward_looped_kernel(
    const scalar_t* __restrict__ x, const param_t* __restrict__ weight, const param_t* __restrict__ bias,
    const int64_t* __restrict__ seed_ptr, scalar_t* __restrict__ out, acc_t* __restrict__ mean_out,
    acc_t* __restrict__ rstd_out, int64_t M, int64_t N, uint32_t threshold, float scale_f, acc_t eps) {
  __shared__ acc_t shared[cuda::kWarpSize];
  const int64_t seed = read_seed(seed_ptr, threshold);
  const acc_t scale = static_cast<acc_t>(scale_f);
  const acc_t n = static_cast<acc_t>(N);
  const int64_t first = static_cast<int64_t>(threadIdx.x) * VEC;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * VEC;

  for (int64_t row = blockIdx.x; row < M; row += gridDim.x) {
    const int64_t row_offset = row * N;
    acc_t sum = acc_t(0);
    for (int64_t c0 = first; c0 < N; c0 += stride) {
      acc_t v[VEC];
      load_acc<VEC>(x + row_offset + c0, v);
#pragma unroll
      for (int j = 0; j < VEC; ++j) sum += v[j];
    }
    const acc_t mean = cuda::block_reduce_sum(sum, shared) / n;

    acc_t sq = acc_t(0);
    for (int64_t c0 = first; c0 < N; c0 += stride) {
      acc_t v[VEC];
      load_acc<VEC>(x + row_offset + c0, v);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const acc_t d = v[j] - mean;
        sq += d * d;
      }
    }
    const acc_t var = cuda::block_reduce_sum(sq, shared) / n;
    const acc_t rstd = inverse_sqrt(var + eps);
    if (threadIdx.x == 0) {
      mean_out[row] = mean;
      rstd_out[row] = rstd;
    }

    for (int64_t c0 = first; c0 < N; c0 += stride) {
      acc_t v[VEC], w[VEC], b[VEC], o[VEC];
      load_acc<VEC>(x + row_offset + c0, v);
      load_param<VEC>(weight, c0, acc_t(1), w);
      load_param<VEC>(bias, c0, acc_t(0), b);
      const uint32_t keep = dropout_keep_bits<VEC>(seed, row_offset + c0, threshold);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const acc_t y = (v[j] - mean) * rstd * w[j] + b[j];
        o[j] = ldr_forward_element<acc_t>(y, (keep >> j) & 1u, scale);
      }
      store_acc<VEC>(out + row_offset + c0, o);
    }
  }
}

template <typename scalar_t, typename param_t, typename acc_t>
void ldr_forward_launch(const LdrArgs& a, const at::Tensor& seed, double eps, at::Tensor& out, at::Tensor& mean,
                        at::Tensor& rstd) {
  const int64_t M = a.M, N = a.N;
  const int device = a.x.device().index();
  const scalar_t* x = a.x.data_ptr<scalar_t>();
  const param_t* w = a.weight.defined() ? a.weight.data_ptr<param_t>() : nullptr;
  const param_t* b = a.bias.defined() ? a.bias.data_ptr<param_t>() : nullptr;
  scalar_t* o = out.data_ptr<scalar_t>();
  const bool fast = N % kVec == 0 && cuda::is_aligned16(x) && cuda::is_aligned16(o) &&
                    (w == nullptr || cuda::is_aligned16(w)) && (b == nullptr || cuda::is_aligned16(b));
  const int64_t vecs = N / kVec;

  ForwardKernel<scalar_t, param_t, acc_t> kernel;
  int threads;
  if (fast && vecs <= register_max_vecs<scalar_t>(false)) {
    const int items = register_items(vecs);
    threads = cuda::row_block_threads(vecs, items);
    if (items == 1) {
      kernel = ldr_forward_register_kernel<scalar_t, param_t, acc_t, 1>;
    } else if (items == 2) {
      kernel = ldr_forward_register_kernel<scalar_t, param_t, acc_t, 2>;
    } else {
      kernel = ldr_forward_register_kernel<scalar_t, param_t, acc_t, 4>;
    }
  } else if (fast) {
    threads = cuda::row_block_threads(vecs, 1);
    kernel = ldr_forward_looped_kernel<scalar_t, param_t, acc_t, kVec>;
  } else {
    threads = cuda::row_block_threads(N, 4);
    kernel = ldr_forward_looped_kernel<scalar_t, param_t, acc_t, 1>;
  }
  const int64_t grid = std::min(M, cuda::resident_blocks(kernel, threads, 0, device));
  kernel<<<static_cast<unsigned>(grid), threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x, w, b, seed.data_ptr<int64_t>(), o, mean.data_ptr<acc_t>(), rstd.data_ptr<acc_t>(), M, N,
      a.dropout.threshold, a.dropout.scale, static_cast<acc_t>(eps));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------------------------------------------
// Backward kernels.

template <typename scalar_t, typename param_t, typename acc_t>
using BackwardRegisterKernel = void (*)(const scalar_t*, const scalar_t*, const param_t*, const param_t*,
                                        const acc_t*, const acc_t*, const int64_t*, scalar_t*, acc_t*, acc_t*,
                                        int64_t, int64_t, uint32_t, float);

// grad_x = rstd * (dxhat - xhat * mean(dxhat * xhat) - mean(dxhat)) with dxhat = dy * w; dgamma / dbeta of the
// thread's columns accumulate in registers over the block's rows (row = blockIdx.x, + gridDim.x, ...) and go to
// row blockIdx.x of the (gridDim.x, N) partial buffers (null when that gradient is not wanted).
template <typename scalar_t, typename param_t, typename acc_t, int ITEMS>
__global__ __launch_bounds__(register_threads<scalar_t>(ITEMS, true)) void ldr_backward_register_kernel(
    const scalar_t* __restrict__ grad_out, const scalar_t* __restrict__ x, const param_t* __restrict__ weight,
    const param_t* __restrict__ bias, const acc_t* __restrict__ mean, const acc_t* __restrict__ rstd,
    const int64_t* __restrict__ seed_ptr, scalar_t* __restrict__ grad_x, acc_t* __restrict__ partial_w,
    acc_t* __restrict__ partial_b, int64_t M, int64_t N, uint32_t threshold, float scale_f) {
  __shared__ acc_t shared[2 * cuda::kWarpSize];
  const int64_t seed = read_seed(seed_ptr, threshold);
  const acc_t scale = static_cast<acc_t>(scale_f);
  const int vecs = static_cast<int>(N / kVec);
  const acc_t inv_n = acc_t(1) / static_cast<acc_t>(N);

  acc_t dw[ITEMS][kVec], db[ITEMS][kVec];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      dw[i][j] = acc_t(0);
      db[i][j] = acc_t(0);
    }
  }

  for (int64_t row = blockIdx.x; row < M; row += gridDim.x) {
    const int64_t row_offset = row * N;
    const acc_t mu = mean[row], rs = rstd[row];
    Pack<scalar_t, kVec> xv[ITEMS], gv[ITEMS];
    uint32_t keep[ITEMS];
    acc_t s1 = acc_t(0), s2 = acc_t(0);  // sums of dxhat * xhat and of dxhat over the row
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int vec = threadIdx.x + i * blockDim.x;
      keep[i] = 0u;
      if (vec < vecs) {
        const int c0 = vec * kVec;
        xv[i] = load_pack<scalar_t, kVec>(x + row_offset + c0);
        gv[i] = load_pack<scalar_t, kVec>(grad_out + row_offset + c0);
        acc_t w[kVec], b[kVec];
        load_param<kVec>(weight, c0, acc_t(1), w);
        load_param<kVec>(bias, c0, acc_t(0), b);
        keep[i] = dropout_keep_bits<kVec>(seed, row_offset + c0, threshold);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const acc_t xhat = (static_cast<acc_t>(xv[i].v[j]) - mu) * rs;
          const acc_t y = xhat * w[j] + b[j];
          const acc_t dy =
              ldr_backward_element<acc_t>(static_cast<acc_t>(gv[i].v[j]), y, (keep[i] >> j) & 1u, scale);
          const acc_t dxhat = dy * w[j];
          s1 += dxhat * xhat;
          s2 += dxhat;
          dw[i][j] += dy * xhat;
          db[i][j] += dy;
        }
      }
    }
    cuda::block_reduce_sum2(s1, s2, shared);
    const acc_t c1 = s1 * inv_n, c2 = s2 * inv_n;

#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int vec = threadIdx.x + i * blockDim.x;
      if (vec < vecs) {
        const int c0 = vec * kVec;
        acc_t w[kVec], b[kVec], dx[kVec];
        load_param<kVec>(weight, c0, acc_t(1), w);  // re-read (L1) rather than held: registers go to dw / db
        load_param<kVec>(bias, c0, acc_t(0), b);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const acc_t xhat = (static_cast<acc_t>(xv[i].v[j]) - mu) * rs;
          const acc_t y = xhat * w[j] + b[j];
          const acc_t dy =
              ldr_backward_element<acc_t>(static_cast<acc_t>(gv[i].v[j]), y, (keep[i] >> j) & 1u, scale);
          dx[j] = rs * (dy * w[j] - xhat * c1 - c2);
        }
        store_acc<kVec>(grad_x + row_offset + c0, dx);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int vec = threadIdx.x + i * blockDim.x;
    if (vec < vecs) {
      const int64_t offset = static_cast<int64_t>(blockIdx.x) * N + vec * kVec;
      if (partial_w != nullptr) store_acc<kVec>(partial_w + offset, dw[i]);
      if (partial_b != nullptr) store_acc<kVec>(partial_b + offset, db[i]);
    }
  }
}

// Looped backward, phase 1: per row, c1 = mean(dxhat * xhat) into stats[row] and c2 = mean(dxhat) into
// stats[M + row].
template <typename scalar_t, typename param_t, typename acc_t, int VEC>
__global__ __launch_bounds__(1024) void ldr_backward_row_stats_kernel(
    const scalar_t* __restrict__ grad_out, const scalar_t* __restrict__ x, const param_t* __restrict__ weight,
    const param_t* __restrict__ bias, const acc_t* __restrict__ mean, const acc_t* __restrict__ rstd,
    const int64_t* __restrict__ seed_ptr, acc_t* __restrict__ stats, int64_t M, int64_t N, uint32_t threshold,
    float scale_f) {
  __shared__ acc_t shared[2 * cuda::kWarpSize];
  const int64_t seed = read_seed(seed_ptr, threshold);
  const acc_t scale = static_cast<acc_t>(scale_f);
  const acc_t inv_n = acc_t(1) / static_cast<acc_t>(N);
  const int64_t first = static_cast<int64_t>(threadIdx.x) * VEC;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * VEC;

  for (int64_t row = blockIdx.x; row < M; row += gridDim.x) {
    const int64_t row_offset = row * N;
    const acc_t mu = mean[row], rs = rstd[row];
    acc_t s1 = acc_t(0), s2 = acc_t(0);
    for (int64_t c0 = first; c0 < N; c0 += stride) {
      acc_t xv[VEC], gv[VEC], w[VEC], b[VEC];
      load_acc<VEC>(x + row_offset + c0, xv);
      load_acc<VEC>(grad_out + row_offset + c0, gv);
      load_param<VEC>(weight, c0, acc_t(1), w);
      load_param<VEC>(bias, c0, acc_t(0), b);
      const uint32_t keep = dropout_keep_bits<VEC>(seed, row_offset + c0, threshold);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const acc_t xhat = (xv[j] - mu) * rs;
        const acc_t y = xhat * w[j] + b[j];
        const acc_t dxhat = ldr_backward_element<acc_t>(gv[j], y, (keep >> j) & 1u, scale) * w[j];
        s1 += dxhat * xhat;
        s2 += dxhat;
      }
    }
    cuda::block_reduce_sum2(s1, s2, shared);
    if (threadIdx.x == 0) {
      stats[row] = s1 * inv_n;
      stats[M + row] = s2 * inv_n;
    }
  }
}

// Looped backward, phase 2: block (tile, chunk) = (blockIdx.x % col_tiles, blockIdx.x / col_tiles) writes grad_x
// of rows [chunk * rows_per_chunk, ...) in its kTileX * VEC columns, and the sums of dgamma / dbeta over those
// rows into row `chunk` of the partial buffers; the kTileY row-threads are added in a fixed order.
template <typename scalar_t, typename param_t, typename acc_t, int VEC>
__global__ __launch_bounds__(kTileX* kTileY) void ldr_backward_tile_kernel(
    const scalar_t* __restrict__ grad_out, const scalar_t* __restrict__ x, const param_t* __restrict__ weight,
    const param_t* __restrict__ bias, const acc_t* __restrict__ mean, const acc_t* __restrict__ rstd,
    const acc_t* __restrict__ stats, const int64_t* __restrict__ seed_ptr, scalar_t* __restrict__ grad_x,
    acc_t* __restrict__ partial_w, acc_t* __restrict__ partial_b, int64_t M, int64_t N, int64_t col_tiles,
    int64_t rows_per_chunk, uint32_t threshold, float scale_f) {
  constexpr int kCols = kTileX * VEC;
  __shared__ acc_t tile_w[kTileY][kCols];
  __shared__ acc_t tile_b[kTileY][kCols];
  const int64_t seed = read_seed(seed_ptr, threshold);
  const acc_t scale = static_cast<acc_t>(scale_f);
  const int64_t tile = blockIdx.x % col_tiles;
  const int64_t chunk = blockIdx.x / col_tiles;
  const int64_t c0 = tile * kCols + static_cast<int64_t>(threadIdx.x) * VEC;
  const int64_t row_begin = chunk * rows_per_chunk;
  const int64_t row_end = row_begin + rows_per_chunk < M ? row_begin + rows_per_chunk : M;

  acc_t dw[VEC], db[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    dw[j] = acc_t(0);
    db[j] = acc_t(0);
  }
  if (c0 < N) {  // N % VEC == 0: a vector is wholly inside the row or wholly outside
    acc_t w[VEC], b[VEC];
    load_param<VEC>(weight, c0, acc_t(1), w);
    load_param<VEC>(bias, c0, acc_t(0), b);
    for (int64_t row = row_begin + threadIdx.y; row < row_end; row += kTileY) {
      const int64_t offset = row * N + c0;
      const acc_t mu = mean[row], rs = rstd[row];
      const acc_t c1 = stats[row], c2 = stats[M + row];
      acc_t xv[VEC], gv[VEC], dx[VEC];
      load_acc<VEC>(x + offset, xv);
      load_acc<VEC>(grad_out + offset, gv);
      const uint32_t keep = dropout_keep_bits<VEC>(seed, offset, threshold);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const acc_t xhat = (xv[j] - mu) * rs;
        const acc_t y = xhat * w[j] + b[j];
        const acc_t dy = ldr_backward_element<acc_t>(gv[j], y, (keep >> j) & 1u, scale);
        dx[j] = rs * (dy * w[j] - xhat * c1 - c2);
        dw[j] += dy * xhat;
        db[j] += dy;
      }
      store_acc<VEC>(grad_x + offset, dx);
    }
  }
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    tile_w[threadIdx.y][threadIdx.x * VEC + j] = dw[j];
    tile_b[threadIdx.y][threadIdx.x * VEC + j] = db[j];
  }
  __syncthreads();
  for (int l = threadIdx.y * kTileX + threadIdx.x; l < kCols; l += kTileX * kTileY) {
    const int64_t col = tile * kCols + l;
    if (col < N) {
      acc_t sw = acc_t(0), sb = acc_t(0);
#pragma unroll
      for (int k = 0; k < kTileY; ++k) {
        sw += tile_w[k][l];
        sb += tile_b[k][l];
      }
      if (partial_w != nullptr) partial_w[chunk * N + col] = sw;
      if (partial_b != nullptr) partial_b[chunk * N + col] = sb;
    }
  }
}

// Runs the two looped backward kernels; returns the number of partial rows.
template <typename scalar_t, typename param_t, typename acc_t, int VEC>
int64_t ldr_backward_looped(const LdrBackwardArgs& args, const at::Tensor& seed, at::Tensor& grad_x,
                            at::Tensor& partial_w, at::Tensor& partial_b, int device, cudaStream_t stream) {
  const LdrArgs& a = args.fwd;
  const int64_t M = a.M, N = a.N;
  const scalar_t* g = args.grad_out.data_ptr<scalar_t>();
  const scalar_t* x = a.x.data_ptr<scalar_t>();
  const param_t* w = a.weight.defined() ? a.weight.data_ptr<param_t>() : nullptr;
  const param_t* b = a.bias.defined() ? a.bias.data_ptr<param_t>() : nullptr;
  const acc_t* mean = args.mean.data_ptr<acc_t>();
  const acc_t* rstd = args.rstd.data_ptr<acc_t>();
  const int64_t* s = seed.data_ptr<int64_t>();
  const auto acc_opts = a.x.options().dtype(a.acc_dtype);

  at::Tensor stats = at::empty({2, M}, acc_opts);
  {
    auto kernel = ldr_backward_row_stats_kernel<scalar_t, param_t, acc_t, VEC>;
    const int threads = VEC == 1 ? cuda::row_block_threads(N, 4) : cuda::row_block_threads(N / VEC, 1);
    const int64_t grid = std::min(M, cuda::resident_blocks(kernel, threads, 0, device));
    kernel<<<static_cast<unsigned>(grid), threads, 0, stream>>>(g, x, w, b, mean, rstd, s, stats.data_ptr<acc_t>(),
                                                                M, N, a.dropout.threshold, a.dropout.scale);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  auto kernel = ldr_backward_tile_kernel<scalar_t, param_t, acc_t, VEC>;
  const cuda::TileGrid t = cuda::tile_grid(M, N, VEC, cuda::resident_blocks(kernel, kTileX * kTileY, 0, device));
  if (w != nullptr) partial_w = at::empty({t.chunks, N}, acc_opts);
  if (b != nullptr) partial_b = at::empty({t.chunks, N}, acc_opts);
  kernel<<<t.blocks(), dim3(kTileX, kTileY), 0, stream>>>(
      g, x, w, b, mean, rstd, stats.data_ptr<acc_t>(), s, grad_x.data_ptr<scalar_t>(),
      partial_w.defined() ? partial_w.data_ptr<acc_t>() : nullptr,
      partial_b.defined() ? partial_b.data_ptr<acc_t>() : nullptr, M, N, t.col_tiles, t.rows_per_chunk,
      a.dropout.threshold, a.dropout.scale);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return t.chunks;
}

template <typename scalar_t, typename param_t, typename acc_t>
void ldr_backward_launch(const LdrBackwardArgs& args, const at::Tensor& seed, at::Tensor& grad_x,
                         at::Tensor& grad_w, at::Tensor& grad_b) {
  const LdrArgs& a = args.fwd;
  const int64_t M = a.M, N = a.N;
  const int device = a.x.device().index();
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const scalar_t* g = args.grad_out.data_ptr<scalar_t>();
  const scalar_t* x = a.x.data_ptr<scalar_t>();
  const param_t* w = a.weight.defined() ? a.weight.data_ptr<param_t>() : nullptr;
  const param_t* b = a.bias.defined() ? a.bias.data_ptr<param_t>() : nullptr;
  scalar_t* dx = grad_x.data_ptr<scalar_t>();
  const bool fast = N % kVec == 0 && cuda::is_aligned16(x) && cuda::is_aligned16(g) && cuda::is_aligned16(dx) &&
                    (w == nullptr || cuda::is_aligned16(w)) && (b == nullptr || cuda::is_aligned16(b));
  const int64_t vecs = N / kVec;
  const auto acc_opts = a.x.options().dtype(a.acc_dtype);

  at::Tensor partial_w, partial_b;
  int64_t partial_rows;
  if (fast && vecs <= register_max_vecs<scalar_t>(true)) {
    BackwardRegisterKernel<scalar_t, param_t, acc_t> kernel;
    const int items = register_items(vecs);
    const int threads = cuda::row_block_threads(vecs, items);
    if (items == 1) {
      kernel = ldr_backward_register_kernel<scalar_t, param_t, acc_t, 1>;
    } else if (items == 2) {
      kernel = ldr_backward_register_kernel<scalar_t, param_t, acc_t, 2>;
    } else {
      kernel = ldr_backward_register_kernel<scalar_t, param_t, acc_t, 4>;
    }
    // G blocks own rows g, g + G, ...: no more than fit at once, and (once M is large) >= 32 rows per block so
    // the (G, N) partials stay small next to x and grad_out.
    const int64_t sms = cuda::sm_count(device);
    const int64_t G = std::min({M, cuda::resident_blocks(kernel, threads, 0, device),
                                std::max<int64_t>(2 * sms, ceil_div(M, 32))});
    if (w != nullptr) partial_w = at::empty({G, N}, acc_opts);
    if (b != nullptr) partial_b = at::empty({G, N}, acc_opts);
    kernel<<<static_cast<unsigned>(G), threads, 0, stream>>>(
        g, x, w, b, args.mean.data_ptr<acc_t>(), args.rstd.data_ptr<acc_t>(), seed.data_ptr<int64_t>(), dx,
        partial_w.defined() ? partial_w.data_ptr<acc_t>() : nullptr,
        partial_b.defined() ? partial_b.data_ptr<acc_t>() : nullptr, M, N, a.dropout.threshold, a.dropout.scale);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    partial_rows = G;
  } else if (fast) {
    partial_rows = ldr_backward_looped<scalar_t, param_t, acc_t, kVec>(args, seed, grad_x, partial_w, partial_b,
                                                                       device, stream);
  } else {
    partial_rows = ldr_backward_looped<scalar_t, param_t, acc_t, 1>(args, seed, grad_x, partial_w, partial_b,
                                                                    device, stream);
  }

  cuda::ColumnSumArgs<acc_t, param_t> sums{};
  if (partial_w.defined()) {
    sums.partial0 = partial_w.data_ptr<acc_t>();
    sums.out0 = grad_w.data_ptr<param_t>();
  }
  if (partial_b.defined()) {
    sums.partial1 = partial_b.data_ptr<acc_t>();
    sums.out1 = grad_b.data_ptr<param_t>();
  }
  cuda::launch_column_sum(sums, partial_rows, N, stream);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ldr_forward_cuda(const at::Tensor& x,
                                                                 const std::optional<at::Tensor>& weight,
                                                                 const std::optional<at::Tensor>& bias,
                                                                 const at::Tensor& seed, double p, double eps) {
  LdrArgs a = check_ldr_forward(x, weight, bias, seed, p, eps);
  c10::cuda::CUDAGuard guard(a.x.device());
  at::Tensor out = at::empty(a.x.sizes(), a.x.options());
  at::Tensor mean = at::empty({a.M}, a.x.options().dtype(a.acc_dtype));
  at::Tensor rstd = at::empty({a.M}, a.x.options().dtype(a.acc_dtype));
  if (a.M == 0) return {out, mean, rstd};
  dispatch_ldr(a, [&](auto st, auto pt) {
    using scalar_t = typename decltype(st)::type;
    ldr_forward_launch<scalar_t, typename decltype(pt)::type, acc_type_t<scalar_t>>(a, seed, eps, out, mean, rstd);
  });
  return {out, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ldr_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& x, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const at::Tensor& mean, const at::Tensor& rstd, const at::Tensor& seed,
    double p) {
  LdrBackwardArgs args = check_ldr_backward(grad_out, x, weight, bias, mean, rstd, seed, p);
  const LdrArgs& a = args.fwd;
  c10::cuda::CUDAGuard guard(a.x.device());
  const auto popts = a.x.options().dtype(a.param_dtype);
  at::Tensor grad_x = at::empty(a.x.sizes(), a.x.options());
  if (a.M == 0) {
    return {grad_x, a.weight.defined() ? at::zeros({a.N}, popts) : at::empty({0}, popts),
            a.bias.defined() ? at::zeros({a.N}, popts) : at::empty({0}, popts)};
  }
  // Every element of grad_weight / grad_bias is written by the stage-2 sum: no zero fill needed.
  at::Tensor grad_w = at::empty({a.weight.defined() ? a.N : 0}, popts);
  at::Tensor grad_b = at::empty({a.bias.defined() ? a.N : 0}, popts);
  dispatch_ldr(a, [&](auto st, auto pt) {
    using scalar_t = typename decltype(st)::type;
    ldr_backward_launch<scalar_t, typename decltype(pt)::type, acc_type_t<scalar_t>>(args, seed, grad_x, grad_w,
                                                                                     grad_b);
  });
  return {grad_x, grad_w, grad_b};
}

}  // namespace

TORCH_LIBRARY_IMPL(gpuopt, CUDA, m) {
  m.impl("layer_norm_dropout_relu", &ldr_forward_cuda);
  m.impl("layer_norm_dropout_relu_backward", &ldr_backward_cuda);
}

}  // namespace gpuopt
