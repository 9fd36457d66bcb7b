// CUDA kernels of gpuopt::layer_norm_dropout_relu and gpuopt::dropout_add_norm and their backwards, one body
// per path shared by both ops (NormKind below; DESIGN.md is the contract; the paths and their launch shapes are
// described in launch_config.h). Raw pointers and plain structs only.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

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
  A inv_n;  // 1 / N, rounded once on the host (a constant-bank operand, not a register a thread)
  A eps;
  A scale;             // dropout scale 65536 / (65536 - threshold), in the accumulation type
  uint32_t threshold;  // keep <=> 16-bit lane >= threshold
  bool x_vec;          // N % 8 == 0 and x, out 16-byte aligned: 16-byte vector access to rows
  bool p_vec;          // N % 8 == 0 and weight, bias 16-byte aligned
  bool rms;            // RMSNorm (mean is nullptr): norm_dropout / dropout_add_norm; LayerNorm otherwise
  bool relu;           // ReLU after the dropout (layer_norm_dropout_relu: true; unused by dropout_add_norm)
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
  A inv_n;  // 1 / N
  A scale;
  uint32_t threshold;
  bool x_vec;  // N % 8 == 0, x, grad_out, grad_x 16-byte aligned
  bool p_vec;
  bool rms;   // RMSNorm: mean is nullptr, c2 = 0 (norm_dropout)
  bool relu;  // the ReLU bit enters dy (layer_norm_dropout_relu: true)
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
        inv_n(p.inv_n) {}
};

// The keep bits of a group as booleans: the 16-byte vector path (kVec: N % 8 == 0) uses the precomputed key
// schedule, the other path keep_bits (one Philox call a group when N % 8 == 0, else one an element).
// idx0 = dropout_index(row * N) + c0 is the group's first dropout index (its linear index, or its index in the whole
// tensor under a shard map: a row ops' map moves whole rows), group0 + g = idx0 / 8 its Philox group when
// N % 8 == 0 (then the row's first index is a multiple of 8 under a map too).
template <bool kVec, bool kHoist, typename A>
GPUOPT_DEV void group_keep(const GroupDropout<kHoist>& drop, const RowConsts<A>& rc, uint32_t threshold, int64_t group0,
                           int64_t g, int64_t idx0, int valid, bool (&keep)[kGroup]) {
  if (kVec) {
    drop.keep(group0 + g, keep);
  } else {
    const uint32_t bits = keep_bits(rc.seed, idx0, valid, threshold, rc.one_call);
#pragma unroll
    for (int j = 0; j < kGroup; ++j) keep[j] = (bits >> j) & 1u;
  }
}

// The dropout index of a row's first element i = row * N (dropout_index). kMapped is a kernel's template argument:
// its true instances (launched only when the seed holds a shard map and the RNG runs, dev::read_map) read the map,
// the others take i itself with no map code at all, so a 1-element seed's kernels keep the registers they had
// before shard maps.
template <bool kMapped, class Params>
GPUOPT_DEV int64_t row_dropout_index(const Params& p, int64_t i) {
  if constexpr (kMapped) {
    return dropout_index(p.seed, true, i);
  } else {
    return i;
  }
}

// Whether a rows kernel holds its columns' weight and bias in registers across rows, and in which type: always
// for one warp a row (up to 255 registers a thread; in fp32), and for one block a row on the 16-byte vector
// path when they take at most 32 registers in their own type (converted on use): 16-bit parameters of 4 groups,
// fp32 of 2. Otherwise (a block row's registers are full, or the scalar path) each row reloads them, from L1 / L2.
template <bool kVec, bool kWarpRow, typename P, int VPT>
constexpr bool hold_params() {
  return kWarpRow || (kVec && VPT * kGroup * 2 * sizeof(P) <= 32 * 4);
}
template <typename A, typename P, bool kWarpRow>
using param_reg_t = typename std::conditional<(kWarpRow && sizeof(A) == 4), A, P>::type;

// The weight and bias of a thread's VPT groups (columns 8 * (tx + k * T)), absent ones as 1 / 0.
template <bool kVec, typename P, typename R, int VPT>
GPUOPT_DEV void load_row_params(const P* __restrict__ weight, const P* __restrict__ bias, int64_t N, int groups,
                                R (&w)[VPT][kGroup], R (&b)[VPT][kGroup]) {
  using A = acc_t_of<P>;
  const int T = blockDim.x, tx = threadIdx.x;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int g = tx + k * T;
    const int c0 = g * kGroup;
    const int valid = g < groups ? (kVec ? kGroup : group_size(N, c0)) : 0;
    A wa[kGroup], ba[kGroup];
    load_param_group(valid > 0 ? weight : nullptr, c0, valid, kVec, A(1), wa);
    load_param_group(valid > 0 ? bias : nullptr, c0, valid, kVec, A(0), ba);
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      w[k][j] = from_acc<R>(wa[j]);
      b[k][j] = from_acc<R>(ba[j]);
    }
  }
}

// ---------------------------------------------------------------------------------------------- fused norm kinds
// The row kernels below serve two ops; K says which, at compile time:
//   layer_norm_dropout_relu  (LdrKind) LayerNorm of x, then dropout and ReLU of the affine output; norm_dropout
//                            runs the same kernels with RMSNorm (p.rms) and the ReLU (p.relu) launch arguments
//                            (one uniform branch a row, a predicate an element): no instantiation of its own.
//   dropout_add_norm         (DanKind) s = dropout(x) (+ residual), stored as `sum` in dtype U; LayerNorm or
//                            RMSNorm (p.rms, a launch argument: one uniform branch a row) of s as stored; the
//                            affine output. The backward adds grad_sum and applies the dropout to dS last.
// In the bodies, U is the dtype of the norm's input (x for LdrKind, the stored sum for DanKind) and p.x points
// at it; S is x's (and out's, grad_out's, grad_x's) dtype.
template <bool kDropPre_, typename U_>
struct NormKind {
  static constexpr bool kDropPre = kDropPre_;  // dropout (and the residual) before the norm
  using U = U_;
};
template <typename S>
using LdrKind = NormKind<false, S>;
template <typename U>
using DanKind = NormKind<true, U>;

// dropout_add_norm's launch arguments: layer_norm_dropout_relu's plus the residual, the sum and the norm kind.
// x: the op's x (dtype S); mean: nullptr for RMSNorm.
template <typename S, typename U, typename P, typename A>
struct DanForwardParams : LdrForwardParams<S, P, A> {
  const U* residual;  // nullptr: no residual
  U* sum;             // s = dropout(x) + residual, dtype U
};

// x: the stored sum s (dtype U, the norm's input); grad_x: the op's grad_x (dtype S).
template <typename S, typename U, typename P, typename A>
struct DanBackwardParams {
  const S* grad_out;
  const U* x;         // sum
  const U* grad_sum;  // nullptr: none
  const P* weight;
  const P* bias;  // unused by the math (dbeta needs only grad_out); kept for the shared bodies
  const A* mean;  // nullptr for RMSNorm
  const A* rstd;
  const int64_t* seed;
  S* grad_x;
  U* grad_residual;  // nullptr: no residual
  A* partial_w;
  A* partial_b;
  A* row_stats;
  int64_t M, N, ldp;
  A inv_n;  // 1 / N
  A scale;
  uint32_t threshold;
  bool x_vec;  // N % 8 == 0, every row buffer 16-byte aligned
  bool p_vec;
  bool rms;
};

// DanKind's extra row buffers (nullptr for LdrKind, whose params have none).
template <class K, class Params>
GPUOPT_DEV auto grad_sum_of(const Params& p) {
  if constexpr (K::kDropPre) {
    return p.grad_sum;
  } else {
    return static_cast<const typename K::U*>(nullptr);
  }
}
template <class K, class Params>
GPUOPT_DEV auto grad_residual_of(const Params& p) {
  if constexpr (K::kDropPre) {
    return p.grad_residual;
  } else {
    return static_cast<typename K::U*>(nullptr);
  }
}

// dropout_add_norm's dropout of one element: the kept value times the scale, or an exact 0 (a select). The
// product is rounded on its own, never contracted with the residual's add into an FMA, so the stored sum has the
// CPU backend's bits.
template <typename A>
GPUOPT_DEV A dan_dropout(A v, bool keep, A scale) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(A) == 4) {
    return keep ? __fmul_rn(v, scale) : A(0);
  } else {
    return keep ? __dmul_rn(v, scale) : A(0);
  }
#else
  return keep ? v * scale : A(0);
#endif
}

// ------------------------------------------------------------------------------------------------ forward, rows
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

// ---------------------------------------------------------------------------------------------- forward, looped
// One row a block of kLoopedThreads threads (grid stride over rows); thread t takes groups t, t + T, ...
// DanKind: the first pass forms and stores the sum, the later passes read it back (each thread its own groups,
// after the row sum's barrier); RMSNorm has no centred pass.
template <class K, typename S, typename P, typename A, bool kMapped, class Params>
GPUOPT_DEV void norm_forward_looped(const Params& p) {
  using U = typename K::U;
  GPUOPT_SHARED_ARRAY(A, red, 2 * kWarpSize);
  const RowConsts<A> rc(p);
  const int64_t N = rc.N, groups = rc.groups;
  const bool rms = p.rms;  // a launch argument of both kinds
  int parity = 0;

  for (int64_t row = blockIdx.x; row < p.M; row += gridDim.x) {
    const U* xr;                                                   // the norm's input row
    const int64_t drop0 = row_dropout_index<kMapped>(p, row * N);  // the row's first dropout index
    A sum = A(0);
    if constexpr (!K::kDropPre) {
      xr = p.x + row * N;
      for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
        A v[kGroup];
        load_group(xr + g * kGroup, group_size(N, g * kGroup), p.x_vec, v);
#pragma unroll
        for (int j = 0; j < kGroup; ++j) sum += rms ? v[j] * v[j] : v[j];
      }
    } else {
      xr = p.sum + row * N;
      for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
        const int64_t c0 = g * kGroup;
        const int valid = group_size(N, c0);
        A xv[kGroup], rv[kGroup], s[kGroup];
        load_group(p.x + row * N + c0, valid, p.x_vec, xv);
        if (p.residual != nullptr) load_group(p.residual + row * N + c0, valid, p.x_vec, rv);
        const uint32_t keep = keep_bits(rc.seed, drop0 + c0, valid, p.threshold, rc.one_call);
#pragma unroll
        for (int j = 0; j < kGroup; ++j) {
          const A d = dan_dropout<A>(xv[j], (keep >> j) & 1u, p.scale);
          s[j] = p.residual != nullptr ? d + rv[j] : d;
        }
        store_group(p.sum + row * N + c0, valid, p.x_vec, s);
#pragma unroll
        for (int j = 0; j < kGroup; ++j) {
          const A v = j < valid ? static_cast<A>(to_acc(from_acc<U>(s[j]))) : A(0);
          sum += rms ? v * v : v;
        }
      }
    }
    A mu = A(0), var;
    if (!rms) {
      mu = row_sum(sum, red) * rc.inv_n;
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
      const int64_t c0 = g * kGroup;
      const int valid = group_size(N, c0);
      A v[kGroup], w[kGroup], b[kGroup], o[kGroup];
      load_group(xr + c0, valid, p.x_vec, v);
      load_param_group(p.weight, c0, valid, p.p_vec, A(1), w);
      load_param_group(p.bias, c0, valid, p.p_vec, A(0), b);
      if constexpr (!K::kDropPre) {
        const uint32_t keep = keep_bits(rc.seed, drop0 + c0, valid, p.threshold, rc.one_call);
#pragma unroll
        for (int j = 0; j < kGroup; ++j)
          o[j] = nd_forward_element<A>(affine((v[j] - mu) * rs, w[j], b[j]), (keep >> j) & 1u, p.scale, p.relu);
      } else {
#pragma unroll
        for (int j = 0; j < kGroup; ++j) o[j] = affine((v[j] - mu) * rs, w[j], b[j]);
      }
      store_group(p.out + row * N + c0, valid, p.x_vec, o);
    }
  }
}

template <typename S, typename P, typename A>
__global__ void __launch_bounds__(cuda::kLoopedThreads) ldr_forward_looped_kernel(LdrForwardParams<S, P, A> p) {
  norm_forward_looped<LdrKind<S>, S, P, A, false>(p);
}

template <typename S, typename P, typename A>
__global__ void __launch_bounds__(cuda::kLoopedThreads) ldr_forward_looped_mapped_kernel(LdrForwardParams<S, P, A> p) {
  norm_forward_looped<LdrKind<S>, S, P, A, true>(p);
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

// A wide backward's dynamic shared memory: each thread owns 6 VPT + 1 consecutive 16-byte slots of 4 fp32
// values (cuda::wide_backward_shared), addressed from one register with constant offsets. Group k: dgamma sums
// in slots 4k, 4k + 1, dbeta sums in 4k + 2, 4k + 3, and the row's dxhat, waiting across the row sum, in
// 4 VPT + 2k, 4 VPT + 2k + 1; the last slot is padding, so that the 8 threads of a quarter warp (one 16-byte
// access phase) start an odd number of slots apart and cover all 32 banks once. A thread touches its own slots
// only: no barrier. A group's sums are loaded before its math, added to there and stored after it.
template <typename A>
GPUOPT_DEV A* wide_slot(A* base, int slot) {
  return base + slot * 4;
}
template <typename A>
GPUOPT_DEV void wide_load(A* base, int slot, A (&out)[kGroup]) {
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const uint4 raw = load16_shared(wide_slot(base, slot + q));
    memcpy(out + 4 * q, &raw, 16);
  }
}
template <typename A>
GPUOPT_DEV void wide_store(A* base, int slot, const A (&v)[kGroup]) {
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    uint4 raw;
    memcpy(&raw, v + 4 * q, 16);
    store16(wide_slot(base, slot + q), raw);
  }
}

// ----------------------------------------------------------------------------------------------- backward, rows
// Launch shape of ldr_forward_rows_kernel; grid = G blocks, each owning the rows (blockIdx.x + i * G) * R + ty.
// Each row issues all its loads (mean, rstd, x and grad_out of the thread's groups; the weight and bias too when
// they are not held) before any math, computes xhat and dxhat once into fp32 registers, and after the row
// reduction only combines them into grad_x. A thread accumulates its columns' dgamma / dbeta across its rows.
// Weight and bias are loaded once, before the row loop, where hold_params allows (as the forward).
// DanKind: x is the stored sum and dy is grad_out itself (no ReLU, no dropout before the norm); after the row
// reduction the row's grad_sum groups are loaded together, then dS = norm backward + grad_sum is stored as
// grad_residual and, through the dropout, as grad_x. RMSNorm: no mean, and c2 = 0.
// kWide (8192 < N <= 18432, up to cuda::kWideThreads threads, fp32 accumulation, the 16-byte path): the
// registers hold the row's groups and their xhat / dxhat; dgamma / dbeta accumulate in dynamic shared memory
// (wide_load / wide_store), the weight and bias are loaded raw with the row (fp32 ones at 6 groups a thread with
// each group's math), and at 6 groups a thread the row's dxhat waits in shared memory too (kTight below).
template <class K, typename S, typename P, typename A, bool kVec, bool kWarpRow, int VPT, bool kWide, bool kMapped,
          class Params>
GPUOPT_DEV void norm_backward_rows(const Params& p) {
  using U = typename K::U;
  static_assert(!kWide || (kVec && !kWarpRow && sizeof(A) == 4), "the wide backward is fp32, 16-byte, a block a row");
  GPUOPT_SHARED_ARRAY(A, red, 4 * kWarpSize);
  const RowConsts<A> rc(p);
  // fp64 (gradcheck's dtype) neither holds the parameters nor loads them with the row: its registers hold the
  // row's xhat, dxhat and dgamma / dbeta at twice the size, so each group loads its own after the row's loads.
  // DanKind with an fp32 sum: its block rows' registers hold the fp32 sum and grad_sum groups instead
  constexpr bool kHold =
      !kWide && sizeof(A) == 4 && hold_params<kVec, kWarpRow, P, VPT>() && (kWarpRow || !K::kDropPre || sizeof(U) == 2);
  constexpr bool kBatchParams = !kHold && !kWide && sizeof(A) == 4;  // reloaded parameters come with the row's loads
  constexpr int kBatched = kBatchParams ? VPT : 1;
  using R = param_reg_t<A, P, kWarpRow>;
  // (DanKind needs the keep bits only after the row sum: no key schedule held through the row's math)
  // (the wide LayerNorm-dropout-ReLU holds the key schedule too: 20 registers for 2.5 instructions an element)
  const GroupDropout<kWarpRow || (!K::kDropPre && (kHold || kWide) && sizeof(S) == 2)> drop(rc.seed, p.threshold);
  const int64_t N = rc.N;
  const int groups = static_cast<int>(rc.groups);  // rows and wide paths: N <= 18432
  [[maybe_unused]] const bool has_gs = K::kDropPre && grad_sum_of<K>(p) != nullptr;
  const int T = kWarpRow ? kWarpSize : blockDim.x, tx = threadIdx.x;
  const bool rms = p.rms;  // a launch argument of both kinds
  // the bias enters only layer_norm_dropout_relu's math (its ReLU bit)
  const P* __restrict__ bias = K::kDropPre ? nullptr : p.bias;
  // The plan keeps (VPT - 1) * T <= groups: only a thread's last group can lie past the row.
  auto has = [&](int k, int g) { return k < VPT - 1 || g < groups; };
  constexpr int kHeld = kHold ? VPT : 1;
  R w[kHeld][kGroup], b[kHeld][kGroup];
  if (kHold) load_row_params<kVec>(p.weight, bias, N, groups, w, b);
  constexpr int kSums = kWide ? 1 : VPT;  // groups whose dgamma / dbeta sums live in registers
  A dw[kSums][kGroup], db[kSums][kGroup];
#pragma unroll
  for (int k = 0; k < kSums; ++k)
#pragma unroll
    for (int j = 0; j < kGroup; ++j) dw[k][j] = db[k][j] = A(0);
  [[maybe_unused]] A* wide_acc = nullptr;  // the thread's slots
  // At 6 groups a thread (kTight) the wide kernel saves registers where 4 and 3 spend instructions: the row's
  // dxhat waits in shared memory (kPark; dropout_add_norm's always), LayerNorm-dropout-ReLU with 16-bit x takes
  // xhat again from x's raw group after the row sum (kRecompute), and dropout_add_norm with an fp32 sum reads
  // the sum again, from L2, there (kReloadSum: the row's groups at once; two at a time with fp16 x), rather than
  // hold them across it.
  constexpr bool kTight = kWide && VPT > 4;
  constexpr bool kPark = kTight || (kWide && K::kDropPre);
  constexpr bool kRecompute = kTight && !K::kDropPre && sizeof(U) == 2;
  constexpr bool kReloadSum = kTight && K::kDropPre && sizeof(U) == 4;
  if constexpr (kWide) {
    GPUOPT_DYNAMIC_SHARED(A, dyn);
    wide_acc = dyn + int64_t(tx) * cuda::wide_slots(VPT) * 4;
    const uint4 zero{0u, 0u, 0u, 0u};
#pragma unroll
    for (int i = 0; i < 4 * VPT; ++i) store16(wide_slot(wide_acc, i), zero);
  }

  // the block's row step `it` (32 bits: rows past 2^31 grid strides do not occur) gives the row and the parity,
  // so no 64-bit row counter lives across the row's math
  for (int it = 0;; ++it) {
    const int64_t row0 = (int64_t(it) * gridDim.x + blockIdx.x) * blockDim.y;
    if (row0 >= p.M) break;
    const int64_t row = row0 + threadIdx.y;
    const int parity = it & 1;
    if (row >= p.M) continue;  // R > 1 only: one warp a row, no barrier below
    // the wide kernel derives its groups' columns from T afresh each row, so the compiler does not keep a 64-bit
    // parameter address a group across the row loop
    const int Tr = kWide ? opaque_block_dim_x() : T;
    const int64_t base = row * N;
    const A mu = rms ? A(0) : p.mean[row], rs = p.rstd[row];
    Group<U> xs[VPT];
    Group<S> gs[VPT];
    [[maybe_unused]] Group<U> gsum[K::kDropPre ? VPT : 1];  // DanKind: grad_sum
    A wl[kBatched][kGroup], bl[kBatched][kGroup];           // reloaded parameters (kBatchParams)
    // wide: reloaded with the row, in their own type (fp32 ones at 6 groups a thread are loaded with each
    // group's math, from L2, which frees the registers of the row's loads)
    constexpr bool kRawParams = kWide && (sizeof(P) == 2 || !kTight);
    [[maybe_unused]] Group<P> wr[kRawParams ? VPT : 1], br[kRawParams ? VPT : 1];
    // LdrKind's keep bits come with the row's loads: the row's first dropout index (DanKind under a map takes its
    // own after the row sum)
    const int64_t drop0 = K::kDropPre && kMapped ? 0 : row_dropout_index<kMapped>(p, base);
    const int64_t group0 = drop0 / kGroup;  // used when N % 8 == 0
    A xhat[VPT][kGroup], dxhat[VPT][kGroup];
    A c1 = A(0), c2 = A(0);
    // The wide kernel loads and takes in a row in parts where its 168 registers do not hold all of the row's raw
    // groups next to their xhat / dxhat: one part at 3 groups a thread and at 4 with 16-bit x; else 2 (fp32 x at
    // 4, dropout_add_norm at 6) or 3 (LayerNorm-dropout-ReLU at 6). Each part issues its loads before its math.
    constexpr int kParts = !kWide || VPT == 3 || (VPT == 4 && sizeof(S) == 2) ? 1 : (VPT == 6 && !K::kDropPre ? 3 : 2);
#pragma unroll
    for (int h = 0; h < kParts; ++h) {
#pragma unroll
      for (int k = h * VPT / kParts; k < (h + 1) * VPT / kParts; ++k) {  // every load of the row (part) first,
        int g = tx + k * Tr;  // unconditionally: an absent last group loads the row's first group instead, unused
        g = has(k, g) ? g : 0;
        {
          const int c0 = g * kGroup;
          const int valid = kVec ? kGroup : group_size(N, c0);
          load_raw_group(p.x + base + c0, valid, kVec, xs[k]);
          load_raw_group(p.grad_out + base + c0, valid, kVec, gs[k]);
          if constexpr (K::kDropPre) {
            if (has_gs) load_raw_group(grad_sum_of<K>(p) + base + c0, valid, kVec, gsum[K::kDropPre ? k : 0]);
          }
          if (kBatchParams) {
            load_param_group(p.weight, c0, valid, kVec, A(1), wl[kBatchParams ? k : 0]);
            load_param_group(bias, c0, valid, kVec, A(0), bl[kBatchParams ? k : 0]);
          }
          if constexpr (kRawParams) {
            load_raw_param(p.weight, c0, from_acc<P>(A(1)), wr[kRawParams ? k : 0]);
            load_raw_param(bias, c0, from_acc<P>(A(0)), br[kRawParams ? k : 0]);
          }
        }
      }
#pragma unroll
      for (int k = h * VPT / kParts; k < (h + 1) * VPT / kParts; ++k) {
        const int g = tx + k * Tr;
        if (has(k, g)) {
          const int c0 = g * kGroup;
          const int valid = kVec ? kGroup : group_size(N, c0);
          bool keep[kGroup];
          if constexpr (!K::kDropPre) group_keep<kVec>(drop, rc, p.threshold, group0, g, drop0 + c0, valid, keep);
          if constexpr (kWide) {  // the group's sums, added to below (one FMA an element, as in registers)
            wide_load(wide_acc, 4 * k, dw[0]);
            wide_load(wide_acc, 4 * k + 2, db[0]);
          }
          A wg[kGroup], bg[kGroup];  // fp64: this group's parameters only; wide: the raw parameters, unpacked
          if (!kHold && !kBatchParams && !kRawParams) {
            load_param_group(p.weight, c0, valid, kVec, A(1), wg);
            load_param_group(bias, c0, valid, kVec, A(0), bg);
          }
          // kTight: x, grad_out and the parameters unpacked a group at a time (unpack_group): fewer instructions
          // there, more at 3 and 4 groups a thread
          [[maybe_unused]] A xu[kTight ? kGroup : 1], gu[kTight ? kGroup : 1];
          if constexpr (kTight) {
            unpack_group(xs[k], xu);
            unpack_group(gs[k], gu);
          }
          if constexpr (kRawParams && kTight) {
            unpack_group(wr[kRawParams ? k : 0], wg);
            unpack_group(br[kRawParams ? k : 0], bg);
          }
#pragma unroll
          for (int j = 0; j < kGroup; ++j) {
            const A wj = kHold                   ? static_cast<A>(to_acc(w[kHold ? k : 0][j]))
                         : kRawParams && !kTight ? static_cast<A>(to_acc(wr[kRawParams ? k : 0].v[j]))
                                                 : (kBatchParams ? wl[kBatchParams ? k : 0][j] : wg[j]);
            const A bj = kHold                   ? static_cast<A>(to_acc(b[kHold ? k : 0][j]))
                         : kRawParams && !kTight ? static_cast<A>(to_acc(br[kRawParams ? k : 0].v[j]))
                                                 : (kBatchParams ? bl[kBatchParams ? k : 0][j] : bg[j]);
            const bool in = j < valid;
            const A xj = kTight ? xu[kTight ? j : 0] : static_cast<A>(to_acc(xs[k].v[j]));
            const A gj = kTight ? gu[kTight ? j : 0] : static_cast<A>(to_acc(gs[k].v[j]));
            xhat[k][j] = in ? (xj - mu) * rs : A(0);
            A dy;
            if constexpr (K::kDropPre) {
              (void)bj;
              dy = in ? gj : A(0);
            } else {
              dy = in ? nd_backward_element<A>(gj, affine(xhat[k][j], wj, bj), keep[j], p.scale, p.relu) : A(0);
            }
            dxhat[k][j] = dy * wj;
            dw[kWide ? 0 : k][j] += dy * xhat[k][j];
            db[kWide ? 0 : k][j] += dy;
            c1 += dxhat[k][j] * xhat[k][j];
            c2 += dxhat[k][j];
            if constexpr (K::kDropPre) {
              // dS = rs * dxhat + grad_sum - rs * (xhat * c1 + c2): the first two terms now, so grad_sum is read
              // with the row's other loads (one wait a row) and is not held across the row sum
              dxhat[k][j] *= rs;
              if (has_gs) dxhat[k][j] += static_cast<A>(to_acc(gsum[K::kDropPre ? k : 0].v[j]));
            }
          }
          if constexpr (kWide) {
            wide_store(wide_acc, 4 * k, dw[0]);
            wide_store(wide_acc, 4 * k + 2, db[0]);
          }
          if constexpr (kPark) wide_store(wide_acc, 4 * VPT + 2 * k, dxhat[k]);
        }
      }
    }  // parts
    row_sum2<kWarpRow>(c1, c2, red + parity * 2 * kWarpSize);
    c1 *= rc.inv_n;
    c2 = rms ? A(0) : c2 * rc.inv_n;
    [[maybe_unused]] const A rs_c1 = rs * c1, rs2_c1 = rs * rs_c1, rs_c2 = rs * c2;  // the wide kernel's forms
    S* __restrict__ gxr = p.grad_x + base;
    if constexpr (!K::kDropPre) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int g = tx + k * Tr;
        if (has(k, g)) {
          const int c0 = g * kGroup;
          if constexpr (kPark) wide_load(wide_acc, 4 * VPT + 2 * k, dxhat[k]);
          A o[kGroup];
          [[maybe_unused]] A xu[kRecompute ? kGroup : 1];
          if constexpr (kRecompute) unpack_group(xs[k], xu);
#pragma unroll
          for (int j = 0; j < kGroup; ++j) {
            if constexpr (kWide) {
              // two FMAs an element: rs * dxhat - rs c2 - (rs c1) xhat; kRecompute: xhat = rs (x - mu) from the
              // raw group, (rs^2 c1) (x - mu)
              const A t = dxhat[k][j] * rs - rs_c2;
              o[j] = kRecompute ? t - rs2_c1 * (xu[kRecompute ? j : 0] - mu) : t - rs_c1 * xhat[k][j];
            } else {
              o[j] = rs * (dxhat[k][j] - xhat[k][j] * c1 - c2);
            }
          }
          store_group(gxr + c0, kVec ? kGroup : group_size(N, c0), kVec, o);
        }
      }
    } else {
      // kReloadSum: the row's sum again, kAgain groups at a time, their loads first: the whole row (enough bytes
      // in flight), except with fp16 x, whose 168 registers hold two groups at a time (3 or 6 spill)
      constexpr int kAgain = kReloadSum && std::is_same_v<S, half_t> ? 2 : VPT;
      static_assert(VPT % kAgain == 0);
      // the row's first dropout index under a map, taken here (DanKind draws its keep bits after the row sum):
      // held from the row's top, the wide kernel at 6 groups a thread with an fp32 sum spills
      const int64_t late0 = kMapped ? row_dropout_index<kMapped>(p, base) : drop0;
#pragma unroll
      for (int k0 = 0; k0 < VPT; k0 += kAgain) {
        if constexpr (kReloadSum) {
#pragma unroll
          for (int k = k0; k < k0 + kAgain; ++k) {
            const int gl = has(k, tx + k * Tr) ? tx + k * Tr : 0;
            load_raw_group(p.x + base + gl * kGroup, kGroup, true, xs[k]);
          }
        }
#pragma unroll
        for (int k = k0; k < k0 + kAgain; ++k) {
          const int g = tx + k * Tr;
          if (has(k, g)) {
            const int c0 = g * kGroup;
            const int valid = kVec ? kGroup : group_size(N, c0);
            if constexpr (kPark) wide_load(wide_acc, 4 * VPT + 2 * k, dxhat[k]);
            bool keep[kGroup];
            group_keep<kVec>(drop, rc, p.threshold, kMapped ? late0 / kGroup : group0, g, late0 + c0, valid, keep);
            A ds[kGroup], o[kGroup];
            [[maybe_unused]] A xu[kTight ? kGroup : 1];
            if constexpr (kTight) unpack_group(xs[k], xu);
#pragma unroll
            for (int j = 0; j < kGroup; ++j) {
              // a block row takes xhat again from the sum's raw group (16-bit: half the registers of holding it)
              if constexpr (kWide) {  // two FMAs an element, as the LayerNorm-dropout-ReLU kind
                const A xj = kTight ? xu[kTight ? j : 0] : static_cast<A>(to_acc(xs[k].v[j]));
                ds[j] = (dxhat[k][j] - rs_c2) - rs2_c1 * (xj - mu);
              } else {
                const A xh =
                    kWarpRow ? xhat[k][j] : (j < valid ? (static_cast<A>(to_acc(xs[k].v[j])) - mu) * rs : A(0));
                ds[j] = dxhat[k][j] - rs * (xh * c1 + c2);
              }
              o[j] = dan_dropout<A>(ds[j], keep[j], p.scale);
            }
            if (grad_residual_of<K>(p) != nullptr) store_group(grad_residual_of<K>(p) + base + c0, valid, kVec, ds);
            store_group(gxr + c0, valid, kVec, o);
          }
        }
      }
    }
  }
  if constexpr (kWide) {  // R == 1: the thread's own sums are the block's
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int g = tx + k * T;
      if (g >= groups) continue;
      A s[kGroup];
      if (p.partial_w != nullptr) {
        wide_load(wide_acc, 4 * k, s);
        store_group(p.partial_w + int64_t(blockIdx.x) * p.ldp + g * kGroup, kGroup, true, s);
      }
      if (p.partial_b != nullptr) {
        wide_load(wide_acc, 4 * k + 2, s);
        store_group(p.partial_b + int64_t(blockIdx.x) * p.ldp + g * kGroup, kGroup, true, s);
      }
    }
  } else {
    // every thread of the block runs the same number of row iterations, so all reach these barriers
    GPUOPT_SHARED_ARRAY(A, comb, 4 * kWarpSize * kGroup);  // R * T * 8 with R > 1 only when T == 32, R <= 4
    if (p.partial_w != nullptr) write_row_partials<A, VPT>(dw, p.partial_w, p.ldp, groups, comb);
    if (p.partial_b != nullptr) write_row_partials<A, VPT>(db, p.partial_b, p.ldp, groups, comb);
  }
}

template <typename S, typename P, typename A, bool kVec, bool kWarpRow, int VPT>
__global__ void __launch_bounds__(cuda::ldr_rows_backward_max_threads(kWarpRow, sizeof(S)))
    ldr_backward_rows_kernel(LdrBackwardParams<S, P, A> p) {
  norm_backward_rows<LdrKind<S>, S, P, A, kVec, kWarpRow, VPT, false, false>(p);
}

template <typename S, typename P, typename A, bool kVec, bool kWarpRow, int VPT>
__global__ void __launch_bounds__(cuda::ldr_rows_backward_max_threads(kWarpRow, sizeof(S)))
    ldr_backward_rows_mapped_kernel(LdrBackwardParams<S, P, A> p) {
  norm_backward_rows<LdrKind<S>, S, P, A, kVec, kWarpRow, VPT, false, true>(p);
}

template <typename S, typename U, typename P, typename A, bool kWarpRow, int VPT>
__global__ void __launch_bounds__(cuda::ldr_rows_backward_max_threads(kWarpRow, cuda::dan_elem(sizeof(S), sizeof(U))))
    dan_backward_rows_kernel(DanBackwardParams<S, U, P, A> p) {
  norm_backward_rows<DanKind<U>, S, P, A, true, kWarpRow, VPT, false, false>(p);
}

template <typename S, typename U, typename P, typename A, bool kWarpRow, int VPT>
__global__ void __launch_bounds__(cuda::ldr_rows_backward_max_threads(kWarpRow, cuda::dan_elem(sizeof(S), sizeof(U))))
    dan_backward_rows_mapped_kernel(DanBackwardParams<S, U, P, A> p) {
  norm_backward_rows<DanKind<U>, S, P, A, true, kWarpRow, VPT, false, true>(p);
}

// The wide backwards (8192 < N <= 16384): a block of up to 512 threads a row, dgamma / dbeta in dynamic shared
// memory (cuda::wide_backward_shared bytes).
template <typename S, typename P, typename A, int VPT>
__global__ void __launch_bounds__(cuda::kWideThreads) ldr_backward_wide_kernel(LdrBackwardParams<S, P, A> p) {
  norm_backward_rows<LdrKind<S>, S, P, A, true, false, VPT, true, false>(p);
}

template <typename S, typename P, typename A, int VPT>
__global__ void __launch_bounds__(cuda::kWideThreads) ldr_backward_wide_mapped_kernel(LdrBackwardParams<S, P, A> p) {
  norm_backward_rows<LdrKind<S>, S, P, A, true, false, VPT, true, true>(p);
}

template <typename S, typename U, typename P, typename A, int VPT>
__global__ void __launch_bounds__(cuda::kWideThreads) dan_backward_wide_kernel(DanBackwardParams<S, U, P, A> p) {
  norm_backward_rows<DanKind<U>, S, P, A, true, false, VPT, true, false>(p);
}

template <typename S, typename U, typename P, typename A, int VPT>
__global__ void __launch_bounds__(cuda::kWideThreads) dan_backward_wide_mapped_kernel(DanBackwardParams<S, U, P, A> p) {
  norm_backward_rows<DanKind<U>, S, P, A, true, false, VPT, true, true>(p);
}

// ------------------------------------------------------------------------------------------ backward, looped
// Step 1 (one row a block, like ldr_forward_looped_kernel): the row means c1, c2 of the grad_x formula.
// A thread takes U of its groups (g, g + T, ...) at a time: all their loads first, then the math. U is what fits
// its 128 registers: 4 with 16-bit x and parameters on the 16-byte vector path, 2 with 32-bit ones, else 1.
// kVec: the 16-byte vector path and one Philox call a group (with its key schedule computed once).
// (dropout_add_norm: S here is the dtype of its norm input, the sum.)
template <typename S, typename P, bool kVec>
constexpr int ldr_stats_groups() {
  return !kVec || sizeof(S) == 8 ? 1 : (sizeof(S) == 2 && sizeof(P) == 2 ? 4 : 2);
}

template <class K, typename S, typename P, typename A, bool kVec, bool kMapped, class Params>
GPUOPT_DEV void norm_backward_row_stats(const Params& p) {
  using NT = typename K::U;  // the norm's input
  constexpr int U = ldr_stats_groups<NT, P, kVec>();
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
          if (p.weight != nullptr) {
            load_raw_group(p.weight + c0, valid, kVec, ws[u]);
          } else {
#pragma unroll
            for (int j = 0; j < kGroup; ++j) ws[u].v[j] = one;
          }
          if (!K::kDropPre && p.bias != nullptr) {  // the bias enters only the ReLU bit
            load_raw_group(p.bias + c0, valid, kVec, bs[u]);
          } else {
#pragma unroll
            for (int j = 0; j < kGroup; ++j) bs[u].v[j] = zero;
          }
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

template <typename S, typename P, typename A, bool kVec>
__global__ void __launch_bounds__(cuda::kLoopedThreads) ldr_backward_row_stats_kernel(LdrBackwardParams<S, P, A> p) {
  norm_backward_row_stats<LdrKind<S>, S, P, A, kVec, false>(p);
}

template <typename S, typename P, typename A, bool kVec>
__global__ void __launch_bounds__(cuda::kLoopedThreads)
    ldr_backward_row_stats_mapped_kernel(LdrBackwardParams<S, P, A> p) {
  norm_backward_row_stats<LdrKind<S>, S, P, A, kVec, true>(p);
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
// It takes kLdrTiledRows rows of its stride at a time: all their loads (predicated on row < M) first, then the
// math. kVec: the 16-byte vector path and one Philox call a group (with its key schedule computed once).
// DanKind: grad_sum joins the rows' loads; dS is stored as grad_residual and, through the dropout, as grad_x.
constexpr int kLdrTiledRows = 2;

template <class K, typename S, typename P, typename A, bool kVec, bool kMapped, class Params>
GPUOPT_DEV void norm_backward_tiled(const Params& p) {
  using NT = typename K::U;  // the norm's input
  constexpr int U = kLdrTiledRows;
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
#pragma unroll
      for (int u = 0; u < U; ++u) {  // every load of the U rows first
        const int64_t r = row + u * stride;
        if (r < M) {
          load_raw_group(p.x + r * N + c0, valid, kVec, xs[u]);
          load_raw_group(p.grad_out + r * N + c0, valid, kVec, gs[u]);
          if constexpr (K::kDropPre) {
            if (p.grad_sum != nullptr) load_raw_group(p.grad_sum + r * N + c0, valid, kVec, gsum[u]);
          }
          // LdrKind reads mean unconditionally (RMSNorm: run_ldr_backward points it at rstd) and drops it below:
          // a load under the flag costs its scalar path 17-24 registers (two blocks a SM become one)
          mu[u] = K::kDropPre && rms ? A(0) : p.mean[r];
          rs[u] = p.rstd[r];
          c1[u] = p.row_stats[2 * r];
          c2[u] = p.row_stats[2 * r + 1];
        }
      }
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

template <typename S, typename P, typename A, bool kVec>
__global__ void __launch_bounds__(cuda::kTiledThreads) ldr_backward_tiled_kernel(LdrBackwardParams<S, P, A> p) {
  norm_backward_tiled<LdrKind<S>, S, P, A, kVec, false>(p);
}

template <typename S, typename P, typename A, bool kVec>
__global__ void __launch_bounds__(cuda::kTiledThreads) ldr_backward_tiled_mapped_kernel(LdrBackwardParams<S, P, A> p) {
  norm_backward_tiled<LdrKind<S>, S, P, A, kVec, true>(p);
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
