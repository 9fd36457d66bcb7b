// The looped paths of the normalised-rows ops, for rows too long to hold in registers: the forward reads a row
// again per pass; the backward takes its row means in one kernel (row stats) and grad_x with the column sums in a
// second, tiled one.
#pragma once
#include <cmath>
#include <cstdint>

#include "cuda/column_sums.cuh"
#include "cuda/norm_common.cuh"

namespace gpuopt {
namespace dev {

// ---------------------------------------------------------------------------------------------- forward, looped
// One row a block of kLoopedThreads threads (grid stride over rows); thread t takes groups t, t + T, ...
// DanKind: the first pass forms and stores the sum, the later passes read it back (each thread its own groups,
// after the row sum's barrier); RMSNorm has no centred pass. Each pass loops over the thread's groups and calls a
// one-group helper with the group's arrays, declared in the loop where the kernel declared them before it was
// split (declared outside it, an array not written in every group would carry its values into the next).

// A looped row, read by the helpers through a reference (as the kernel's own values): its index and its first
// dropout index.
struct LoopedRowAt {
  int64_t row, drop0;
};

// NdKind's first pass, group g of the row xr: its share of the sum of x (RMSNorm: of x^2) into `sum`.
template <typename U, typename A, class Params>
GPUOPT_DEV void looped_group_sum_x(const Params& p, const RowConsts<A>& rc, const U* xr, int64_t g, bool rms,
                                   A (&v)[kGroup], A& sum) {
  load_group(xr + g * kGroup, group_size(rc.N, g * kGroup), p.x_vec, v);
#pragma unroll
  for (int j = 0; j < kGroup; ++j) sum += rms ? v[j] * v[j] : v[j];
}

// DanKind's first pass, group g: s = dropout(x) (+ residual), stored; its share of the sum of s as stored
// (RMSNorm: of s^2) into `sum`.
template <typename U, typename A, class Params>
GPUOPT_DEV void looped_group_form_sum(const Params& p, const RowConsts<A>& rc, const LoopedRowAt& at, int64_t g,
                                      bool rms, A (&xv)[kGroup], A (&rv)[kGroup], A (&s)[kGroup], A& sum) {
  const int64_t c0 = g * kGroup;
  const int valid = group_size(rc.N, c0);
  load_group(p.x + at.row * rc.N + c0, valid, p.x_vec, xv);
  if (p.residual != nullptr) load_group(p.residual + at.row * rc.N + c0, valid, p.x_vec, rv);
  const uint32_t keep = keep_bits(rc.seed, at.drop0 + c0, valid, p.threshold, rc.one_call);
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    const A d = dan_dropout<A>(xv[j], (keep >> j) & 1u, p.scale);
    s[j] = p.residual != nullptr ? d + rv[j] : d;
  }
  store_group(p.sum + at.row * rc.N + c0, valid, p.x_vec, s);
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    const A v = j < valid ? static_cast<A>(to_acc(from_acc<U>(s[j]))) : A(0);
    sum += rms ? v * v : v;
  }
}

// The centred pass, group g of the row xr: its share of the sum of (x - mu)^2 into sq.
template <typename U, typename A, class Params>
GPUOPT_DEV void looped_group_sq(const Params& p, const RowConsts<A>& rc, const U* xr, int64_t g, A mu, A (&v)[kGroup],
                                A& sq) {
  const int valid = group_size(rc.N, g * kGroup);
  load_group(xr + g * kGroup, valid, p.x_vec, v);
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    const A d = j < valid ? v[j] - mu : A(0);
    sq += d * d;
  }
}

// The output pass, group g of the row xr: y = (x - mu) * rs * w + b; NdKind's out = relu(dropout(y)),
// DanKind's out = y.
template <class K, typename U, typename A, class Params>
GPUOPT_DEV void looped_group_output(const Params& p, const RowConsts<A>& rc, const LoopedRowAt& at, const U* xr,
                                    int64_t g, A mu, A rs, A (&v)[kGroup], A (&w)[kGroup], A (&b)[kGroup],
                                    A (&o)[kGroup]) {
  const int64_t c0 = g * kGroup;
  const int valid = group_size(rc.N, c0);
  load_group(xr + c0, valid, p.x_vec, v);
  load_param_group(p.weight, c0, valid, p.p_vec, A(1), w);
  load_param_group(p.bias, c0, valid, p.p_vec, A(0), b);
  if constexpr (!K::kDropPre) {
    const uint32_t keep = keep_bits(rc.seed, at.drop0 + c0, valid, p.threshold, rc.one_call);
#pragma unroll
    for (int j = 0; j < kGroup; ++j)
      o[j] = nd_forward_element<A>(affine((v[j] - mu) * rs, w[j], b[j]), (keep >> j) & 1u, p.scale, p.relu);
  } else {
#pragma unroll
    for (int j = 0; j < kGroup; ++j) o[j] = affine((v[j] - mu) * rs, w[j], b[j]);
  }
  store_group(p.out + at.row * rc.N + c0, valid, p.x_vec, o);
}

template <class K, typename S, typename P, typename A, bool kMapped, class Params>
GPUOPT_DEV void norm_forward_looped(const Params& p) {
  using U = typename K::U;
  GPUOPT_SHARED_ARRAY(A, red, 2 * kWarpSize);
  const RowConsts<A> rc(p);
  const int64_t N = rc.N, groups = rc.groups;
  const bool rms = p.rms;  // a launch argument of both kinds
  int parity = 0;

  for (int64_t row = blockIdx.x; row < p.M; row += gridDim.x) {
    const U* xr;  // the norm's input row
    // drop0: the row's first dropout index
    const LoopedRowAt at{row, row_dropout_index<kMapped>(p, row * N)};
    A sum = A(0);
    if constexpr (!K::kDropPre) {
      xr = p.x + row * N;
      for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
        A v[kGroup];
        looped_group_sum_x(p, rc, xr, g, rms, v, sum);
      }
    } else {
      xr = p.sum + row * N;
      for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
        A xv[kGroup], rv[kGroup], s[kGroup];
        looped_group_form_sum<U>(p, rc, at, g, rms, xv, rv, s, sum);
      }
    }
    A mu = A(0), var;
    if (!rms) {
      mu = row_sum(sum, red) * rc.inv_n;
      A sq = A(0);
      for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
        A v[kGroup];
        looped_group_sq(p, rc, xr, g, mu, v, sq);
      }
      var = row_sum(sq, red + kWarpSize) * rc.inv_n;
    } else {
      parity ^= 1;
      var = row_sum(sum, red + parity * kWarpSize) * rc.inv_n;
    }
    const A rs = A(1) / sqrt(var + p.eps);
    if (threadIdx.x == 0) {
      if (!rms) p.mean[row] = mu;
      p.rstd[row] = rs;
    }
    for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
      A v[kGroup], w[kGroup], b[kGroup], o[kGroup];
      looped_group_output<K>(p, rc, at, xr, g, mu, rs, v, w, b, o);
    }
  }
}

// The looped forwards, the rows forward's formulas (norm_rows_forward.cuh) for rows too long to hold:
// layer_norm_dropout_relu's out = relu(dropout(xhat * w + b)); dropout_add_norm's sum = dropout(x) (+ residual),
// out = xhat(sum) * w + b; mean and rstd stored a row. The *_mapped_kernel twins number the dropout lanes
// through the seed's shard map.
template <typename S, typename P, typename A>
__global__ void __launch_bounds__(cuda::kLoopedThreads) nd_forward_looped_kernel(NdForwardParams<S, P, A> p) {
  norm_forward_looped<NdKind<S>, S, P, A, false>(p);
}

template <typename S, typename P, typename A>
__global__ void __launch_bounds__(cuda::kLoopedThreads) nd_forward_looped_mapped_kernel(NdForwardParams<S, P, A> p) {
  norm_forward_looped<NdKind<S>, S, P, A, true>(p);
}

template <typename S, typename U, typename P, typename A>
__global__ void __launch_bounds__(cuda::kLoopedThreads) dan_forward_looped_kernel(DanForwardParams<S, U, P, A> p) {
  norm_forward_looped<DanKind<U>, S, P, A, false>(p);
}

template <typename S, typename U, typename P, typename A>
__global__ void __launch_bounds__(cuda::kLoopedThreads)
    dan_forward_looped_mapped_kernel(DanForwardParams<S, U, P, A> p) {
  norm_forward_looped<DanKind<U>, S, P, A, true>(p);
}

// ------------------------------------------------------------------------------------------ backward, looped
// Step 1 (one row a block, like nd_forward_looped_kernel): the row means c1 = mean(dxhat * xhat) and
// c2 = mean(dxhat) of the grad_x formula (dxhat = dy * w, xhat = (x - mean) * rstd, as the rows backward).
// A thread takes U of its groups (g, g + T, ...) at a time: all their loads first, then the math. U is what fits
// its 128 registers: 4 with 16-bit x and parameters on the 16-byte vector path, 2 with 32-bit ones, else 1.
// kVec: the 16-byte vector path and one Philox call a group (with its key schedule computed once).
// (dropout_add_norm: S here is the dtype of its norm input, the sum.)
template <typename S, typename P, bool kVec>
constexpr int row_stats_groups() {
  return !kVec || sizeof(S) == 8 ? 1 : (sizeof(S) == 2 && sizeof(P) == 2 ? 4 : 2);
}

template <class K, typename S, typename P, typename A, bool kVec, bool kMapped, class Params>
GPUOPT_DEV void norm_backward_row_stats(const Params& p) {
  using NT = typename K::U;  // the norm's input
  constexpr int U = row_stats_groups<NT, P, kVec>();
  GPUOPT_SHARED_ARRAY(A, red, 4 * kWarpSize);
  const RowConsts<A> rc(p);
  const GroupDropout<kVec && sizeof(A) == 4> drop(rc.seed, p.threshold);  // every lane is active here
  const int64_t N = rc.N, groups = rc.groups;
  const int T = blockDim.x;
  const bool rms = p.rms;  // a launch argument of both kinds
  const P one = from_acc<P>(acc_t_of<P>(1)), zero = from_acc<P>(acc_t_of<P>(0));
  int parity = 0;
  for (int64_t row = blockIdx.x; row < p.M; row += gridDim.x) {
    parity ^= 1;
    const A mu = rms ? A(0) : p.mean[row], rs = p.rstd[row];
    const int64_t drop0 = row_dropout_index<kMapped>(p, row * N);  // the row's first dropout index
    A c1 = A(0), c2 = A(0);
    for (int64_t g0 = threadIdx.x; g0 < groups; g0 += U * T) {
      Group<NT> xs[U];
      Group<S> gs[U];
      Group<P> ws[U], bs[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {  // every load of the U groups first
        const int64_t g = g0 + int64_t(u) * T;
        if (g < groups) {
          const int64_t c0 = g * kGroup;
          const int valid = kVec ? kGroup : group_size(N, c0);
          load_raw_group(p.x + row * N + c0, valid, kVec, xs[u]);
          load_raw_group(p.grad_out + row * N + c0, valid, kVec, gs[u]);
          load_raw_param(p.weight, c0, valid, kVec, one, ws[u]);
          load_raw_param(K::kDropPre ? nullptr : p.bias, c0, valid, kVec, zero, bs[u]);  // only the ReLU bit's
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t g = g0 + int64_t(u) * T;
        if (g < groups) {
          const int64_t c0 = g * kGroup;
          const int valid = kVec ? kGroup : group_size(N, c0);
          bool keep[kGroup];
          if constexpr (!K::kDropPre)
            group_keep<kVec>(drop, rc, p.threshold, (kMapped ? drop0 : row * N) / kGroup, g,
                             (kMapped ? drop0 : row * N) + c0, valid, keep);
#pragma unroll
          for (int j = 0; j < kGroup; ++j) {
            const bool in = j < valid;
            const A wj = static_cast<A>(to_acc(ws[u].v[j])), bj = static_cast<A>(to_acc(bs[u].v[j]));
            const A xhat = in ? (static_cast<A>(to_acc(xs[u].v[j])) - mu) * rs : A(0);
            A dy;
            if constexpr (K::kDropPre) {
              (void)bj;
              dy = in ? static_cast<A>(to_acc(gs[u].v[j])) : A(0);
            } else {
              dy = in ? nd_backward_element<A>(to_acc(gs[u].v[j]), affine(xhat, wj, bj), keep[j], p.scale, p.relu)
                      : A(0);
            }
            const A dxhat = dy * wj;
            c1 += dxhat * xhat;
            c2 += dxhat;
          }
        }
      }
    }
    row_sum2(c1, c2, red + parity * 2 * kWarpSize);
    if (threadIdx.x == 0) {
      p.row_stats[2 * row] = c1 * rc.inv_n;
      p.row_stats[2 * row + 1] = rms ? A(0) : c2 * rc.inv_n;
    }
  }
}

// Step 1 of the looped backwards: row_stats[r] = (c1, c2) = (mean(dxhat * xhat), mean(dxhat)) (RMSNorm: c2 = 0).
template <typename S, typename P, typename A, bool kVec>
__global__ void __launch_bounds__(cuda::kLoopedThreads) nd_backward_row_stats_kernel(NdBackwardParams<S, P, A> p) {
  norm_backward_row_stats<NdKind<S>, S, P, A, kVec, false>(p);
}

template <typename S, typename P, typename A, bool kVec>
__global__ void __launch_bounds__(cuda::kLoopedThreads)
    nd_backward_row_stats_mapped_kernel(NdBackwardParams<S, P, A> p) {
  norm_backward_row_stats<NdKind<S>, S, P, A, kVec, true>(p);
}

template <typename S, typename U, typename P, typename A, bool kVec>
__global__ void __launch_bounds__(cuda::kLoopedThreads) dan_backward_row_stats_kernel(DanBackwardParams<S, U, P, A> p) {
  norm_backward_row_stats<DanKind<U>, S, P, A, kVec, false>(p);
}

template <typename S, typename U, typename P, typename A, bool kVec>
__global__ void __launch_bounds__(cuda::kLoopedThreads)
    dan_backward_row_stats_mapped_kernel(DanBackwardParams<S, U, P, A> p) {
  norm_backward_row_stats<DanKind<U>, S, P, A, kVec, true>(p);
}

// Step 2, tiled: blockDim (TX, TY), gridDim (column tiles, row blocks). Thread (tx, ty) of block (bx, by) takes
// the group of columns 8 * (bx * TX + tx) in rows by * TY + ty, + gridDim.y * TY, ...: grad_x, and dgamma /
// dbeta of its 8 columns over its rows in registers, summed over ty at the end into row by of the partials.
// It takes kTiledRows rows of its stride at a time: all their loads (predicated on row < M) first, then the
// math. kVec: the 16-byte vector path and one Philox call a group (with its key schedule computed once).
// DanKind: grad_sum joins the rows' loads; dS is stored as grad_residual and, through the dropout, as grad_x.
constexpr int kTiledRows = 2;

// The tiled backward's loads of U rows of its stride (row, row + stride, ...; those < M), all issued before any
// math: the thread's group of x (the norm's input), grad_out and DanKind's grad_sum, and the rows' mean, rstd
// and row stats c1, c2.
template <class K, bool kVec, int U, typename S, typename A, class Params>
GPUOPT_DEV void load_tiled_rows(const Params& p, int64_t row, int64_t stride, int64_t N, int64_t M, int64_t c0,
                                int valid, bool rms, Group<typename K::U> (&xs)[U], Group<S> (&gs)[U],
                                [[maybe_unused]] Group<typename K::U> (&gsum)[K::kDropPre ? U : 1], A (&mu)[U],
                                A (&rs)[U], A (&c1)[U], A (&c2)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {  // every load of the U rows first
    const int64_t r = row + u * stride;
    if (r < M) {
      load_raw_group(p.x + r * N + c0, valid, kVec, xs[u]);
      load_raw_group(p.grad_out + r * N + c0, valid, kVec, gs[u]);
      if constexpr (K::kDropPre) {
        if (p.grad_sum != nullptr) load_raw_group(p.grad_sum + r * N + c0, valid, kVec, gsum[u]);
      }
      // NdKind reads mean unconditionally (RMSNorm: run_nd_backward points it at rstd) and drops it below:
      // a load under the flag costs its scalar path 17-24 registers (two blocks a SM become one)
      mu[u] = K::kDropPre && rms ? A(0) : p.mean[r];
      rs[u] = p.rstd[r];
      c1[u] = p.row_stats[2 * r];
      c2[u] = p.row_stats[2 * r + 1];
    }
  }
}

template <class K, typename S, typename P, typename A, bool kVec, bool kMapped, class Params>
GPUOPT_DEV void norm_backward_tiled(const Params& p) {
  using NT = typename K::U;  // the norm's input
  constexpr int U = kTiledRows;
  GPUOPT_SHARED_ARRAY(A, comb, cuda::kTiledThreads * kGroup);
  const RowConsts<A> rc(p);
  const GroupDropout<kVec> drop(rc.seed, p.threshold);  // every lane is active here
  const int64_t N = rc.N, M = p.M;
  const bool rms = p.rms;  // a launch argument of both kinds
  const int64_t c0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kGroup;
  const int valid = c0 < N ? (kVec ? kGroup : group_size(N, c0)) : 0;
  A dw[kGroup], db[kGroup], w[kGroup], b[kGroup];
#pragma unroll
  for (int j = 0; j < kGroup; ++j) dw[j] = db[j] = A(0);
  if (valid > 0) {
    load_param_group(p.weight, c0, valid, kVec, A(1), w);
    load_param_group(K::kDropPre ? nullptr : p.bias, c0, valid, kVec, A(0), b);
    const int64_t stride = int64_t(gridDim.y) * blockDim.y;
    for (int64_t row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; row < M; row += U * stride) {
      Group<NT> xs[U];
      Group<S> gs[U];
      A mu[U], rs[U], c1[U], c2[U];
      [[maybe_unused]] Group<NT> gsum[K::kDropPre ? U : 1];
      load_tiled_rows<K, kVec>(p, row, stride, N, M, c0, valid, rms, xs, gs, gsum, mu, rs, c1, c2);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t r = row + u * stride;
        if (r < M) {
          // the keep bits of row r's group; dropout_add_norm with 16-bit x under a shard map draws them after its
          // math (drawn first they cost its registers for two blocks a SM)
          constexpr bool kDrawLate = kMapped && K::kDropPre && sizeof(S) == 2;
          bool keep[kGroup];
          auto draw = [&] {
            const int64_t d0 = row_dropout_index<kMapped>(p, r * N);  // row r's first dropout index
            group_keep<kVec>(drop, rc, p.threshold, d0 / kGroup, c0 / kGroup, d0 + c0, valid, keep);
          };
          if constexpr (!kDrawLate) draw();
          A o[kGroup];
          [[maybe_unused]] A ds[kGroup];
#pragma unroll
          for (int j = 0; j < kGroup; ++j) {
            const bool in = j < valid;
            const A m = !K::kDropPre && rms ? A(0) : mu[u];
            const A xhat = in ? (static_cast<A>(to_acc(xs[u].v[j])) - m) * rs[u] : A(0);
            A dy;
            if constexpr (K::kDropPre) {
              dy = in ? static_cast<A>(to_acc(gs[u].v[j])) : A(0);
            } else {
              dy = in ? nd_backward_element<A>(to_acc(gs[u].v[j]), affine(xhat, w[j], b[j]), keep[j], p.scale, p.relu)
                      : A(0);
            }
            const A dxhat = dy * w[j];
            dw[j] += dy * xhat;
            db[j] += dy;
            if constexpr (K::kDropPre) {
              ds[j] = rs[u] * (dxhat - xhat * c1[u] - c2[u]);
              if (p.grad_sum != nullptr) ds[j] += static_cast<A>(to_acc(gsum[K::kDropPre ? u : 0].v[j]));
              if constexpr (!kDrawLate) o[j] = dan_dropout<A>(ds[j], keep[j], p.scale);
            } else {
              o[j] = rs[u] * (dxhat - xhat * c1[u] - c2[u]);
            }
          }
          if constexpr (kDrawLate) {
            draw();
#pragma unroll
            for (int j = 0; j < kGroup; ++j) o[j] = dan_dropout<A>(ds[j], keep[j], p.scale);
          }
          if constexpr (K::kDropPre) {
            if (p.grad_residual != nullptr) store_group(p.grad_residual + r * N + c0, valid, kVec, ds);
          }
          store_group(p.grad_x + r * N + c0, valid, kVec, o);
        }
      }
    }
  }
  if (p.partial_w != nullptr) write_tile_partials(dw, p.partial_w, p.ldp, N, comb);
  if (p.partial_b != nullptr) write_tile_partials(db, p.partial_b, p.ldp, N, comb);
}

// Step 2 of the looped backwards: grad_x = rstd * (dxhat - xhat * c1 - c2) (dropout_add_norm: dS = that +
// grad_sum, grad_residual = dS, grad_x = dropout(dS)), and the partial column sums of dy * xhat and dy.
template <typename S, typename P, typename A, bool kVec>
__global__ void __launch_bounds__(cuda::kTiledThreads) nd_backward_tiled_kernel(NdBackwardParams<S, P, A> p) {
  norm_backward_tiled<NdKind<S>, S, P, A, kVec, false>(p);
}

template <typename S, typename P, typename A, bool kVec>
__global__ void __launch_bounds__(cuda::kTiledThreads) nd_backward_tiled_mapped_kernel(NdBackwardParams<S, P, A> p) {
  norm_backward_tiled<NdKind<S>, S, P, A, kVec, true>(p);
}

template <typename S, typename U, typename P, typename A, bool kVec>
__global__ void __launch_bounds__(cuda::kTiledThreads) dan_backward_tiled_kernel(DanBackwardParams<S, U, P, A> p) {
  norm_backward_tiled<DanKind<U>, S, P, A, kVec, false>(p);
}

template <typename S, typename U, typename P, typename A, bool kVec>
__global__ void __launch_bounds__(cuda::kTiledThreads)
    dan_backward_tiled_mapped_kernel(DanBackwardParams<S, U, P, A> p) {
  norm_backward_tiled<DanKind<U>, S, P, A, kVec, true>(p);
}

}  // namespace dev
}  // namespace gpuopt
