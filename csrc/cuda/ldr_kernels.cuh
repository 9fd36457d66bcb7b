// CUDA kernels of gpuopt::layer_norm_dropout_relu and its backward (DESIGN.md is the contract; the paths and
// their launch shapes are described in launch_config.h). Raw pointers and plain structs only.
#pragma once
#include <cmath>
#include <cstdint>

#include "cuda/column_sums.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/launch_config.h"
#include "fused_math.h"

namespace gpuopt {
namespace dev {

template <typename S, typename P, typename A>
struct LdrForwardParams {
  const S* x;
  const P* weight;  // nullptr: no weight (1)
  const P* bias;    // nullptr: no bias (0)
  const int64_t* seed;
  S* out;
  A* mean;
  A* rstd;
  int64_t M, N;
  A eps;
  A scale;             // dropout scale 65536 / (65536 - threshold), in the accumulation type
  uint32_t threshold;  // keep <=> 16-bit lane >= threshold
  bool x_vec;          // N % 8 == 0 and x, out 16-byte aligned: 16-byte vector access to rows
  bool p_vec;          // N % 8 == 0 and weight, bias 16-byte aligned
};

template <typename S, typename P, typename A>
struct LdrBackwardParams {
  const S* grad_out;
  const S* x;
  const P* weight;
  const P* bias;
  const A* mean;
  const A* rstd;
  const int64_t* seed;
  S* grad_x;
  A* partial_w;  // (G, ldp) per-block column sums of grad_out' * xhat, or nullptr when there is no weight
  A* partial_b;  // (G, ldp) per-block column sums of grad_out', or nullptr when there is no bias
  A* row_stats;  // looped path: (M, 2) the row means c1 = mean(dxhat * xhat), c2 = mean(dxhat)
  int64_t M, N, ldp;
  A scale;
  uint32_t threshold;
  bool x_vec;  // N % 8 == 0, x, grad_out, grad_x 16-byte aligned
  bool p_vec;
};

// One element's pre-dropout value y = xhat * w + b.
template <typename A>
GPUOPT_DEV A affine(A xhat, A w, A b) {
  return xhat * w + b;
}

// Per-launch constants of the row kernels (forward or backward params).
template <typename A>
struct RowConsts {
  int64_t N, groups;  // groups = ceil(N / 8)
  bool one_call;      // N % 8 == 0: a group is one Philox call
  int64_t seed;
  A inv_n;
  template <class Params>
  GPUOPT_DEV explicit RowConsts(const Params& p)
      : N(p.N),
        groups(ceil_div(p.N, kGroup)),
        one_call(p.N % kGroup == 0),
        seed(read_seed(p.seed, p.threshold)),
        inv_n(A(1) / static_cast<A>(p.N)) {}
};

// ------------------------------------------------------------------------------------------------ forward, rows
// blockDim (T, R): T threads per row (R rows a block when T == 32, else R == 1); VPT groups per thread, group
// k of thread t at columns 8 * (t + k * T). The row stays in registers in its storage type.
template <typename S, typename P, typename A, int VPT>
__global__ void __launch_bounds__(cuda::ldr_rows_forward_max_threads(VPT, sizeof(S)))
    ldr_forward_rows_kernel(LdrForwardParams<S, P, A> p) {
  GPUOPT_SHARED_ARRAY(A, red, 2 * kWarpSize);
  const RowConsts<A> rc(p);
  const int64_t N = rc.N, groups = rc.groups;
  const int T = blockDim.x, tx = threadIdx.x;

  for (int64_t row0 = int64_t(blockIdx.x) * blockDim.y; row0 < p.M; row0 += int64_t(gridDim.x) * blockDim.y) {
    const int64_t row = row0 + threadIdx.y;
    if (row >= p.M) continue;  // only when R > 1, i.e. one warp a row: nothing below waits for the block
    const S* xr = p.x + row * N;
    Group<S> v[VPT];
    A sum = A(0);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int64_t g = tx + int64_t(k) * T;
      if (g < groups) {
        const int valid = group_size(N, g * kGroup);
        load_raw_group(xr + g * kGroup, valid, p.x_vec, v[k]);
#pragma unroll
        for (int j = 0; j < kGroup; ++j) sum += to_acc(v[k].v[j]);  // absent elements are 0
      }
    }
    const A mu = row_sum(sum, red) * rc.inv_n;
    A sq = A(0);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int64_t g = tx + int64_t(k) * T;
      if (g < groups) {
        const int valid = group_size(N, g * kGroup);
#pragma unroll
        for (int j = 0; j < kGroup; ++j) {
          const A d = j < valid ? to_acc(v[k].v[j]) - mu : A(0);
          sq += d * d;
        }
      }
    }
    const A var = row_sum(sq, red + kWarpSize) * rc.inv_n;
    const A rs = A(1) / sqrt(var + p.eps);  // IEEE sqrt and division, as on the CPU
    if (tx == 0) {
      p.mean[row] = mu;
      p.rstd[row] = rs;
    }
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int64_t g = tx + int64_t(k) * T;
      if (g < groups) {
        const int64_t c0 = g * kGroup;
        const int valid = group_size(N, c0);
        A w[kGroup], b[kGroup], o[kGroup];
        load_param_group(p.weight, c0, valid, p.p_vec, A(1), w);
        load_param_group(p.bias, c0, valid, p.p_vec, A(0), b);
        const uint32_t keep = keep_bits(rc.seed, row * N + c0, valid, p.threshold, rc.one_call);
#pragma unroll
        for (int j = 0; j < kGroup; ++j) {
          const A y = affine((to_acc(v[k].v[j]) - mu) * rs, w[j], b[j]);
          o[j] = ldr_forward_element<A>(y, (keep >> j) & 1u, p.scale);
        }
        store_group(p.out + row * N + c0, valid, p.x_vec, o);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------- forward, looped
// One row a block of kLoopedThreads threads (grid stride over rows); thread t takes groups t, t + T, ...
template <typename S, typename P, typename A>
__global__ void __launch_bounds__(cuda::kLoopedThreads) ldr_forward_looped_kernel(LdrForwardParams<S, P, A> p) {
  GPUOPT_SHARED_ARRAY(A, red, 2 * kWarpSize);
  const RowConsts<A> rc(p);
  const int64_t N = rc.N, groups = rc.groups;

  for (int64_t row = blockIdx.x; row < p.M; row += gridDim.x) {
    const S* xr = p.x + row * N;
    A sum = A(0);
    for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
      A v[kGroup];
      load_group(xr + g * kGroup, group_size(N, g * kGroup), p.x_vec, v);
#pragma unroll
      for (int j = 0; j < kGroup; ++j) sum += v[j];
    }
    const A mu = row_sum(sum, red) * rc.inv_n;
    A sq = A(0);
    for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
      const int valid = group_size(N, g * kGroup);
      A v[kGroup];
      load_group(xr + g * kGroup, valid, p.x_vec, v);
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        const A d = j < valid ? v[j] - mu : A(0);
        sq += d * d;
      }
    }
    const A var = row_sum(sq, red + kWarpSize) * rc.inv_n;
    const A rs = A(1) / sqrt(var + p.eps);
    if (threadIdx.x == 0) {
      p.mean[row] = mu;
      p.rstd[row] = rs;
    }
    for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
      const int64_t c0 = g * kGroup;
      const int valid = group_size(N, c0);
      A v[kGroup], w[kGroup], b[kGroup], o[kGroup];
      load_group(xr + c0, valid, p.x_vec, v);
      load_param_group(p.weight, c0, valid, p.p_vec, A(1), w);
      load_param_group(p.bias, c0, valid, p.p_vec, A(0), b);
      const uint32_t keep = keep_bits(rc.seed, row * N + c0, valid, p.threshold, rc.one_call);
#pragma unroll
      for (int j = 0; j < kGroup; ++j)
        o[j] = ldr_forward_element<A>(affine((v[j] - mu) * rs, w[j], b[j]), (keep >> j) & 1u, p.scale);
      store_group(p.out + row * N + c0, valid, p.x_vec, o);
    }
  }
}

// The backward of one group: xhat, the gradient dy of the pre-dropout value (ReLU bit from y, keep bit from the
// seed) and dxhat = dy * w.
template <typename A>
GPUOPT_DEV void backward_group(const A (&x)[kGroup], const A (&g)[kGroup], const A (&w)[kGroup], const A (&b)[kGroup],
                               uint32_t keep, int valid, A mu, A rs, A scale, A (&xhat)[kGroup], A (&dy)[kGroup],
                               A (&dxhat)[kGroup]) {
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    const bool in = j < valid;
    xhat[j] = in ? (x[j] - mu) * rs : A(0);
    dy[j] = in ? ldr_backward_element<A>(g[j], affine(xhat[j], w[j], b[j]), (keep >> j) & 1u, scale) : A(0);
    dxhat[j] = dy[j] * w[j];
  }
}

// backward_group of a group held raw in registers (x and grad_out in their storage type), with its weight and
// bias: the rows backward runs it before the row reduction and again after it, instead of keeping the fp32
// xhat / dxhat of the whole row in registers.
template <typename S, typename P, typename A>
GPUOPT_DEV void backward_raw_group(const LdrBackwardParams<S, P, A>& p, const Group<S>& xs, const Group<S>& gs,
                                   uint32_t keep, int64_t c0, int valid, A mu, A rs, A (&xhat)[kGroup], A (&dy)[kGroup],
                                   A (&dxhat)[kGroup]) {
  A xv[kGroup], gv[kGroup], w[kGroup], b[kGroup];
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    xv[j] = to_acc(xs.v[j]);
    gv[j] = to_acc(gs.v[j]);
  }
  load_param_group(p.weight, c0, valid, p.p_vec, A(1), w);
  load_param_group(p.bias, c0, valid, p.p_vec, A(0), b);
  backward_group(xv, gv, w, b, keep, valid, mu, rs, p.scale, xhat, dy, dxhat);
}

// Adds a block's per-thread column sums acc (R rows of threads, blockDim (T, R)) over threadIdx.y in order and
// writes them as row blockIdx.x of the partial buffer; `shared` holds R * T * 8 values.
template <typename A, int VPT>
GPUOPT_DEV void write_row_partials(const A (&acc)[VPT][kGroup], A* __restrict__ partial, int64_t ldp, int64_t groups,
                                   A* shared) {
  const int T = blockDim.x, R = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  A* out = partial + int64_t(blockIdx.x) * ldp;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int64_t g = tx + int64_t(k) * T;
    A s[kGroup];
    if (R == 1) {
#pragma unroll
      for (int j = 0; j < kGroup; ++j) s[j] = acc[k][j];
    } else {
      __syncthreads();  // the previous round's reads are done
#pragma unroll
      for (int j = 0; j < kGroup; ++j) shared[(ty * T + tx) * kGroup + j] = acc[k][j];
      __syncthreads();
      if (ty != 0) continue;
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        A t = A(0);
        for (int r = 0; r < R; ++r) t += shared[(r * T + tx) * kGroup + j];
        s[j] = t;
      }
    }
    if (g < groups) store_group(out + g * kGroup, kGroup, true, s);  // ldp % 8 == 0: whole aligned groups
  }
}

// ----------------------------------------------------------------------------------------------- backward, rows
// Launch shape of ldr_forward_rows_kernel; grid = G blocks, each owning the rows (blockIdx.x + i * G) * R + ty.
// A thread keeps x and grad_out of its groups in registers (storage type) plus the keep bits, recomputes xhat
// and dy for grad_x after the row reduction, and accumulates its columns' dgamma / dbeta across its rows.
template <typename S, typename P, typename A, int VPT>
__global__ void __launch_bounds__(cuda::ldr_rows_backward_max_threads(VPT, sizeof(S)))
    ldr_backward_rows_kernel(LdrBackwardParams<S, P, A> p) {
  GPUOPT_SHARED_ARRAY(A, red, 4 * kWarpSize);
  const RowConsts<A> rc(p);
  const int64_t N = rc.N, groups = rc.groups;
  const int T = blockDim.x, tx = threadIdx.x;
  A dw[VPT][kGroup], db[VPT][kGroup];
#pragma unroll
  for (int k = 0; k < VPT; ++k)
#pragma unroll
    for (int j = 0; j < kGroup; ++j) dw[k][j] = db[k][j] = A(0);

  int parity = 0;
  for (int64_t row0 = int64_t(blockIdx.x) * blockDim.y; row0 < p.M; row0 += int64_t(gridDim.x) * blockDim.y) {
    const int64_t row = row0 + threadIdx.y;
    parity ^= 1;
    if (row >= p.M) continue;  // R > 1 only: one warp a row, no barrier below
    const A mu = p.mean[row], rs = p.rstd[row];
    Group<S> xs[VPT], gs[VPT];
    uint32_t keep[VPT];
    A c1 = A(0), c2 = A(0);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int64_t g = tx + int64_t(k) * T;
      keep[k] = 0;
      if (g < groups) {
        const int64_t c0 = g * kGroup;
        const int valid = group_size(N, c0);
        load_raw_group(p.x + row * N + c0, valid, p.x_vec, xs[k]);
        load_raw_group(p.grad_out + row * N + c0, valid, p.x_vec, gs[k]);
        keep[k] = keep_bits(rc.seed, row * N + c0, valid, p.threshold, rc.one_call);
        A xhat[kGroup], dy[kGroup], dxhat[kGroup];
        backward_raw_group(p, xs[k], gs[k], keep[k], c0, valid, mu, rs, xhat, dy, dxhat);
#pragma unroll
        for (int j = 0; j < kGroup; ++j) {
          dw[k][j] += dy[j] * xhat[j];
          db[k][j] += dy[j];
          c1 += dxhat[j] * xhat[j];
          c2 += dxhat[j];
        }
      }
    }
    row_sum2(c1, c2, red + parity * 2 * kWarpSize);
    c1 *= rc.inv_n;
    c2 *= rc.inv_n;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int64_t g = tx + int64_t(k) * T;
      if (g < groups) {
        const int64_t c0 = g * kGroup;
        const int valid = group_size(N, c0);
        A xhat[kGroup], dy[kGroup], dxhat[kGroup], o[kGroup];
        backward_raw_group(p, xs[k], gs[k], keep[k], c0, valid, mu, rs, xhat, dy, dxhat);  // recomputed
#pragma unroll
        for (int j = 0; j < kGroup; ++j) o[j] = rs * (dxhat[j] - xhat[j] * c1 - c2);
        store_group(p.grad_x + row * N + c0, valid, p.x_vec, o);
      }
    }
  }
  // every thread of the block runs the same number of row iterations, so all reach these barriers
  GPUOPT_SHARED_ARRAY(A, comb, 4 * kWarpSize * kGroup);  // R * T * 8 with R > 1 only when T == 32, R <= 4
  if (p.partial_w != nullptr) write_row_partials<A, VPT>(dw, p.partial_w, p.ldp, groups, comb);
  if (p.partial_b != nullptr) write_row_partials<A, VPT>(db, p.partial_b, p.ldp, groups, comb);
}

// ------------------------------------------------------------------------------------------ backward, looped
// Step 1 (one row a block, like ldr_forward_looped_kernel): the row means c1, c2 of the grad_x formula.
template <typename S, typename P, typename A>
__global__ void __launch_bounds__(cuda::kLoopedThreads) ldr_backward_row_stats_kernel(LdrBackwardParams<S, P, A> p) {
  GPUOPT_SHARED_ARRAY(A, red, 4 * kWarpSize);
  const RowConsts<A> rc(p);
  const int64_t N = rc.N, groups = rc.groups;
  int parity = 0;
  for (int64_t row = blockIdx.x; row < p.M; row += gridDim.x) {
    parity ^= 1;
    const A mu = p.mean[row], rs = p.rstd[row];
    A c1 = A(0), c2 = A(0);
    for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
      const int64_t c0 = g * kGroup;
      const int valid = group_size(N, c0);
      A xv[kGroup], gv[kGroup], w[kGroup], b[kGroup], xhat[kGroup], dy[kGroup], dxhat[kGroup];
      load_group(p.x + row * N + c0, valid, p.x_vec, xv);
      load_group(p.grad_out + row * N + c0, valid, p.x_vec, gv);
      load_param_group(p.weight, c0, valid, p.p_vec, A(1), w);
      load_param_group(p.bias, c0, valid, p.p_vec, A(0), b);
      const uint32_t keep = keep_bits(rc.seed, row * N + c0, valid, p.threshold, rc.one_call);
      backward_group(xv, gv, w, b, keep, valid, mu, rs, p.scale, xhat, dy, dxhat);
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        c1 += dxhat[j] * xhat[j];
        c2 += dxhat[j];
      }
    }
    row_sum2(c1, c2, red + parity * 2 * kWarpSize);
    if (threadIdx.x == 0) {
      p.row_stats[2 * row] = c1 * rc.inv_n;
      p.row_stats[2 * row + 1] = c2 * rc.inv_n;
    }
  }
}

// Step 2, tiled: blockDim (TX, TY), gridDim (column tiles, row blocks). Thread (tx, ty) of block (bx, by) takes
// the group of columns 8 * (bx * TX + tx) in rows by * TY + ty, + gridDim.y * TY, ...: grad_x, and dgamma /
// dbeta of its 8 columns over its rows in registers, summed over ty at the end into row by of the partials.
template <typename S, typename P, typename A>
__global__ void __launch_bounds__(cuda::kTiledThreads) ldr_backward_tiled_kernel(LdrBackwardParams<S, P, A> p) {
  GPUOPT_SHARED_ARRAY(A, comb, cuda::kTiledThreads * kGroup);
  const RowConsts<A> rc(p);
  const int64_t N = rc.N;
  const int64_t c0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kGroup;
  const int valid = c0 < N ? group_size(N, c0) : 0;
  A dw[kGroup], db[kGroup], w[kGroup], b[kGroup];
#pragma unroll
  for (int j = 0; j < kGroup; ++j) dw[j] = db[j] = A(0);
  if (valid > 0) {
    load_param_group(p.weight, c0, valid, p.p_vec, A(1), w);
    load_param_group(p.bias, c0, valid, p.p_vec, A(0), b);
    for (int64_t row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; row < p.M;
         row += int64_t(gridDim.y) * blockDim.y) {
      const A mu = p.mean[row], rs = p.rstd[row];
      const A c1 = p.row_stats[2 * row], c2 = p.row_stats[2 * row + 1];
      A xv[kGroup], gv[kGroup], xhat[kGroup], dy[kGroup], dxhat[kGroup], o[kGroup];
      load_group(p.x + row * N + c0, valid, p.x_vec, xv);
      load_group(p.grad_out + row * N + c0, valid, p.x_vec, gv);
      const uint32_t keep = keep_bits(rc.seed, row * N + c0, valid, p.threshold, rc.one_call);
      backward_group(xv, gv, w, b, keep, valid, mu, rs, p.scale, xhat, dy, dxhat);
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        dw[j] += dy[j] * xhat[j];
        db[j] += dy[j];
        o[j] = rs * (dxhat[j] - xhat[j] * c1 - c2);
      }
      store_group(p.grad_x + row * N + c0, valid, p.x_vec, o);
    }
  }
  if (p.partial_w != nullptr) write_tile_partials(dw, p.partial_w, p.ldp, N, comb);
  if (p.partial_b != nullptr) write_tile_partials(db, p.partial_b, p.ldp, N, comb);
}

}  // namespace dev
}  // namespace gpuopt
