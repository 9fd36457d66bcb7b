// The rows forward of the normalised-rows ops: a warp or a block a row, the row held in registers (N <= 16384).
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/norm_common.cuh"

namespace gpuopt {
namespace dev {

// ------------------------------------------------------------------------------------------------ forward, rows
// Per row, of the norm's input x (layer_norm_dropout_relu: the op's x; dropout_add_norm: the sum
// s = dropout(x) (+ residual) it forms and stores first, as rounded to U):
//   mean = sum(x) / N (RMSNorm: 0), rstd = 1 / sqrt(sum((x - mean)^2) / N + eps), xhat = (x - mean) * rstd,
//   y = xhat * w + b;  out = relu(dropout(y)) (layer_norm_dropout_relu; the ReLU when p.relu), y (dropout_add_norm)
// with mean and rstd stored a row for the backward.
// blockDim (T, R): T threads per row (R rows a block when T == 32, else R == 1); VPT groups per thread, group
// k of thread t at columns 8 * (t + k * T). kVec (the launcher's choice: N % 8 == 0, x, out, weight and bias
// 16-byte aligned) makes every access a 16-byte vector and every group one Philox call at compile time.
// Weight and bias are loaded once, before the row loop (a thread's columns are the same in every row).
// LdrKind: a software pipeline over a warp's (a block's) rows. Each row issues the loads of the row kAhead rows
// on (ldr_rows_ahead: 2 for one warp a row with 16-bit x, 1 for the other 16-bit and fp32 rows, 0 for fp64)
// before its own math, so the warp keeps those rows' loads in flight while it reduces, draws the keep bits and
// stores, instead of waiting a full load latency at the top of every row. A row is held raw (16-bit x: half the
// registers of fp32) and converted again where it is used (the same conversion, so the same bits; `opaque` keeps
// the compiler from holding the fp32 copy instead). A group's keep bits are drawn where the output consumes
// them, as booleans (a 32-bit mask drawn before the row sums cost ~4 more instructions an element to pack and
// test; the rows ahead already keep the loads in flight through the row's math).
// DanKind: each row issues its loads (x and the residual) at the top; the sum is formed, stored and read back as
// rounded to U in the same pass, so the norm sees s as stored.
template <class K, typename S, typename P, typename A, bool kVec, bool kWarpRow, int VPT, bool kMapped, class Params>
GPUOPT_DEV void norm_forward_rows(const Params& p) {
  using U = typename K::U;
  GPUOPT_SHARED_ARRAY(A, red, 2 * kWarpSize);
  const RowConsts<A> rc(p);
  // DanKind's block rows also hold the residual's row: their parameters are reloaded (from L1 / L2) every row
  constexpr bool kHold = hold_params<kVec, kWarpRow, P, VPT>() && (kWarpRow || !K::kDropPre);
  using R = param_reg_t<A, P, kWarpRow>;
  // the key schedule's 20 registers fit next to a block row when it and its parameters are 16-bit (and, for
  // layer_norm_dropout_relu, there is no residual row beside it)
  const GroupDropout<kWarpRow || (!K::kDropPre && kHold && sizeof(S) == 2)> drop(rc.seed, p.threshold);
  const int64_t N = rc.N;
  const int groups = static_cast<int>(rc.groups);  // rows path: N <= 16384, so column offsets fit an int
  const int T = kWarpRow ? kWarpSize : blockDim.x, tx = threadIdx.x;
  const bool rms = p.rms;  // a launch argument of both kinds
  constexpr int kHeld = kHold ? VPT : 1;
  R w[kHeld][kGroup], b[kHeld][kGroup];
  if (kHold) load_row_params<kVec>(p.weight, p.bias, N, groups, w, b);
  // The plan makes VPT = ceil(groups / T) with groups >= (VPT - 1) * T: only a thread's last group can be absent.
  auto has = [&](int k, int g) { return k < VPT - 1 || g < groups; };
  using RowRaw = Group<S>[VPT];  // a thread's groups of one row, as loaded
  auto load_row = [&](int64_t r, RowRaw& raw) {
    const S* __restrict__ xr = p.x + r * N;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {  // every load of the row first
      const int g = tx + k * T;
      if (has(k, g)) load_raw_group(xr + g * kGroup, kVec ? kGroup : group_size(N, g * kGroup), kVec, raw[k]);
    }
  };

  // One warp a row: a warp's rows end together (nothing waits for the block); one block a row: R == 1, so the
  // block's threads share every row and its barriers.
  const int64_t stride = int64_t(gridDim.x) * blockDim.y;
  int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= p.M) return;
  // Rows whose x is in flight while a row is reduced (ldr_rows_ahead; DanKind: none, its loads start each row)
  constexpr int kAhead = K::kDropPre ? 0 : cuda::ldr_rows_ahead(kWarpRow, sizeof(S));
  Group<S> raw[VPT], ahead[kAhead > 0 ? kAhead : 1][VPT];
  if constexpr (kAhead > 0) {
    load_row(row, raw);
#pragma unroll
    for (int a = 0; a + 1 < kAhead; ++a)
      if (row + (a + 1) * stride < p.M) load_row(row + (a + 1) * stride, ahead[a]);
  }
  int parity = 0;  // RMSNorm's one row sum a row alternates between the two halves of `red`
  // LdrKind's block rows under a shard map (kMapped) draw their keep bits where their registers are fullest (a
  // 16-bit row of 4 groups a thread spills there if it holds one more value): thread 0 writes the row's first
  // dropout index at the top of the row into one of two slots (a row's barriers lie between its write and the
  // reads; the next row writes the other slot), and each group reads it back. Mapped warp rows, whose registers
  // have room, take it at each group; without a map it is the row's base.
  GPUOPT_SHARED_ARRAY(int64_t, row_drop, 2);
  int slot = 0;
  for (;;) {
    const int64_t base = row * N;
    const int64_t group0 = base / kGroup;  // the row's first Philox group without a map (used when N % 8 == 0)
    const int64_t next = row + stride;
    const bool more = next < p.M;
    if constexpr (kMapped && !kWarpRow && !K::kDropPre) {
      slot ^= 1;
      if (tx == 0) row_drop[slot] = row_dropout_index<kMapped>(p, base);
    }
    if constexpr (kAhead > 0) {
      if (row + kAhead * stride < p.M) load_row(row + kAhead * stride, ahead[kAhead - 1]);
    } else {
      load_row(row, raw);
    }
    A v[K::kDropPre ? VPT : 1][kGroup];  // DanKind: s as stored; LdrKind converts `raw` where it is used
    A sum = A(0);
    if constexpr (!K::kDropPre) {
      if (!rms) {  // RMSNorm skips the mean's sum
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
          const bool h = has(k, tx + k * T);
          A x[kGroup];
          if (h) unpack_group(raw[k], x);
#pragma unroll
          for (int j = 0; j < kGroup; ++j) sum += h ? x[j] : A(0);  // absent elements are 0
        }
      }
    } else {
      const bool res = p.residual != nullptr;
      const int64_t drop0 = row_dropout_index<kMapped>(p, base);  // the row's first dropout index
      const int64_t dgroup0 = kMapped ? drop0 / kGroup : group0;  // its Philox group (used when N % 8 == 0)
      Group<U> rr[VPT];
      if (res) {
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
          const int g = tx + k * T;
          if (has(k, g))
            load_raw_group(p.residual + base + g * kGroup, kVec ? kGroup : group_size(N, g * kGroup), kVec, rr[k]);
        }
      }
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int g = tx + k * T;
#pragma unroll
        for (int j = 0; j < kGroup; ++j) v[k][j] = A(0);  // absent elements are 0
        if (has(k, g)) {
          const int c0 = g * kGroup;
          const int valid = kVec ? kGroup : group_size(N, c0);
          bool keep[kGroup];
          group_keep<kVec>(drop, rc, p.threshold, dgroup0, g, drop0 + c0, valid, keep);
          A s[kGroup];
#pragma unroll
          for (int j = 0; j < kGroup; ++j) {
            const A d = dan_dropout<A>(to_acc(raw[k].v[j]), keep[j], p.scale);
            s[j] = res ? d + static_cast<A>(to_acc(rr[k].v[j])) : d;
          }
          store_group(p.sum + base + c0, valid, kVec, s);
#pragma unroll
          for (int j = 0; j < kGroup; ++j) {
            v[k][j] = j < valid ? static_cast<A>(to_acc(from_acc<U>(s[j]))) : A(0);  // s as stored
            sum += rms ? v[k][j] * v[k][j] : v[k][j];
          }
        }
      }
    }
    // The centred value of element j of the thread's group k: LdrKind converts x again (exactly) and subtracts
    // the mean again (the same operation, so the same bits as the centred pass); DanKind keeps it in v.
    auto centred = [&](int k, int j, int valid, const A(&x)[kGroup], A mu) -> A {
      if constexpr (K::kDropPre) {
        return v[k][j];
      } else {
        return j < valid ? x[j] - mu : A(0);
      }
    };
    A mu = A(0), var;
    // LdrKind's RMSNorm skips the mean's sum (`sum` goes unused) and takes LayerNorm's centred pass with mu = 0
    // (x - 0 is x: sq is the sum of x^2), so its code is LayerNorm's plus two uniform branches (a shared-memory
    // offset chosen at run time, as DanKind's parity, costs the LayerNorm rows 17 registers on the scalar path).
    if (!K::kDropPre || !rms) {
      if (!rms) mu = row_sum<kWarpRow>(sum, red) * rc.inv_n;
      A sq = A(0);
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int g = tx + k * T;
        if (has(k, g)) {
          const int valid = kVec ? kGroup : group_size(N, g * kGroup);
          A x[kGroup];
          if constexpr (!K::kDropPre) {
            opaque(raw[k]);
            unpack_group(raw[k], x);
          }
#pragma unroll
          for (int j = 0; j < kGroup; ++j) {
            if constexpr (K::kDropPre) v[k][j] = j < valid ? v[k][j] - mu : A(0);  // x - mean, kept for the output
            const A d = centred(k, j, valid, x, mu);
            sq += d * d;
          }
        }
      }
      var = row_sum<kWarpRow>(sq, red + kWarpSize) * rc.inv_n;
      // RMSNorm: this is the row's only block sum, so the next row's must not overwrite `red + kWarpSize` before
      // every thread has read it (LayerNorm's sum into `red` in between is that barrier)
      if (!kWarpRow && rms) __syncthreads();
    } else {
      parity ^= 1;
      var = row_sum<kWarpRow>(sum, red + parity * kWarpSize) * rc.inv_n;  // mean of s^2
    }
    const A rs = A(1) / sqrt(var + p.eps);  // IEEE sqrt and division, as on the CPU
    if (tx == 0) {
      if (!rms) p.mean[row] = mu;
      p.rstd[row] = rs;
    }
    S* __restrict__ outr = p.out + base;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int g = tx + k * T;
      if (has(k, g)) {
        const int c0 = g * kGroup;
        const int valid = kVec ? kGroup : group_size(N, c0);
        A wa[kGroup], ba[kGroup], o[kGroup];
        if (kHold) {
          // bf16 block rows: the weight converted again each row (one shift an element), not hoisted out of the
          // row loop by the compiler into more registers than a 512-thread block's 128 (it spilled one)
          if constexpr (!kWarpRow && !K::kDropPre && std::is_same<R, bfloat16_t>::value) opaque(w[kHold ? k : 0]);
#pragma unroll
          for (int j = 0; j < kGroup; ++j) {
            wa[j] = static_cast<A>(to_acc(w[kHold ? k : 0][j]));
            ba[j] = static_cast<A>(to_acc(b[kHold ? k : 0][j]));
          }
        } else {
          load_param_group(p.weight, c0, valid, kVec, A(1), wa);
          load_param_group(p.bias, c0, valid, kVec, A(0), ba);
        }
        A x[kGroup];
        bool keep[kGroup];
        if constexpr (!K::kDropPre) {
          // the row's first dropout index, taken at each group: no register holds it through the output loop
          const int64_t drop0 = !kMapped || kWarpRow ? row_dropout_index<kMapped>(p, base)
                                                     : load_volatile(row_drop + (kWarpRow ? 0 : slot));
          group_keep<kVec>(drop, rc, p.threshold, kMapped ? drop0 / kGroup : group0, g, drop0 + c0, valid, keep);
          opaque(raw[k]);
          unpack_group(raw[k], x);
        }
#pragma unroll
        for (int j = 0; j < kGroup; ++j) {
          const A y = affine(centred(k, j, valid, x, mu) * rs, wa[j], ba[j]);
          if constexpr (K::kDropPre) {
            o[j] = y;
          } else {
            o[j] = nd_forward_element<A>(y, keep[j], p.scale, p.relu);
          }
        }
        store_group(outr + c0, valid, kVec, o);
      }
    }
    if (!more) break;
    if constexpr (kAhead > 0) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        raw[k] = ahead[0][k];
#pragma unroll
        for (int a = 0; a + 1 < kAhead; ++a) ahead[a][k] = ahead[a + 1][k];
      }
    }
    row = next;
  }
}

// layer_norm_dropout_relu (and norm_dropout: p.rms, p.relu), rows path: out = relu(dropout(xhat * w + b)), mean,
// rstd (the formulas above).
template <typename S, typename P, typename A, bool kVec, bool kWarpRow, int VPT>
__global__ void __launch_bounds__(cuda::ldr_rows_forward_max_threads(kWarpRow, sizeof(S)))
    ldr_forward_rows_kernel(LdrForwardParams<S, P, A> p) {
  norm_forward_rows<LdrKind<S>, S, P, A, kVec, kWarpRow, VPT, false>(p);
}

// Every row kernel has a *_mapped_kernel twin (kMapped: the row's dropout lanes numbered through the seed's shard
// map, row_dropout_index), launched only where the seed holds a map and the RNG runs, so the 1-element seed's
// instances keep the code and registers they had without maps.
template <typename S, typename P, typename A, bool kVec, bool kWarpRow, int VPT>
__global__ void __launch_bounds__(cuda::ldr_rows_forward_max_threads(kWarpRow, sizeof(S)))
    ldr_forward_rows_mapped_kernel(LdrForwardParams<S, P, A> p) {
  norm_forward_rows<LdrKind<S>, S, P, A, kVec, kWarpRow, VPT, true>(p);
}

// dropout_add_norm, rows path: sum = dropout(x) (+ residual), out = xhat(sum) * w + b, mean and rstd of sum.
// dropout_add_norm runs its rows kernels on the 16-byte vector path only (the launcher sends the rest to the
// looped kernels), so there is no kVec argument; the bound is that of the wider of x and the sum.
template <typename S, typename U, typename P, typename A, bool kWarpRow, int VPT>
__global__ void __launch_bounds__(cuda::ldr_rows_forward_max_threads(kWarpRow, cuda::dan_elem(sizeof(S), sizeof(U))))
    dan_forward_rows_kernel(DanForwardParams<S, U, P, A> p) {
  norm_forward_rows<DanKind<U>, S, P, A, true, kWarpRow, VPT, false>(p);
}

template <typename S, typename U, typename P, typename A, bool kWarpRow, int VPT>
__global__ void __launch_bounds__(cuda::ldr_rows_forward_max_threads(kWarpRow, cuda::dan_elem(sizeof(S), sizeof(U))))
    dan_forward_rows_mapped_kernel(DanForwardParams<S, U, P, A> p) {
  norm_forward_rows<DanKind<U>, S, P, A, true, kWarpRow, VPT, true>(p);
}

}  // namespace dev
}  // namespace gpuopt
