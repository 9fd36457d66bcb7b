// The normalised-rows kernels' common part: their launch parameters, the two norm kinds (norm-dropout, NdKind, and
// dropout-add-norm, DanKind: NormKind), and the per-row helpers every path uses (row constants, keep bits, dropout index,
// held parameters). The kernels serve layer_norm_dropout_relu, norm_dropout (its RMSNorm launch) and
// dropout_add_norm; DESIGN.md is the contract, launch_config.h describes the paths and their launch shapes. Raw
// pointers and plain structs only.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/kernel_utils.cuh"
#include "cuda/launch_config.h"
#include "fused_math.h"

namespace gpuopt {
namespace dev {

template <typename S, typename P, typename A>
struct NdForwardParams {
  const S* x;           // (M, N)
  const P* weight;      // (N); nullptr: no weight (1)
  const P* bias;        // (N); nullptr: no bias (0)
  const int64_t* seed;  // (1) the seed, or (4) a shard map [seed, base, period, jump] (dropout_index)
  S* out;               // (M, N)
  A* mean;              // (M); nullptr for RMSNorm
  A* rstd;              // (M)
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
struct NdBackwardParams {
  const S* grad_out;    // (M, N)
  const S* x;           // (M, N)
  const P* weight;      // (N); nullptr: no weight
  const P* bias;        // (N); nullptr: no bias
  const A* mean;        // (M); RMSNorm: the tiled kernel reads it unconditionally (the launcher points it at rstd)
  const A* rstd;        // (M)
  const int64_t* seed;  // (1) or (4), as the forward's
  S* grad_x;            // (M, N)
  A* partial_w;         // (G, ldp) per-block column sums of grad_out' * xhat, or nullptr when there is no weight
  A* partial_b;         // (G, ldp) per-block column sums of grad_out', or nullptr when there is no bias
  A* row_stats;         // looped path: (M, 2) the row means c1 = mean(dxhat * xhat), c2 = mean(dxhat)
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

// Whether group k of a thread (column group g) lies in the row: the plan makes VPT = ceil(groups / T) with
// groups >= (VPT - 1) * T, so only a thread's last group can be absent.
template <int VPT>
GPUOPT_DEV bool has_group(int k, int g, int groups) {
  return k < VPT - 1 || g < groups;
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
// The row kernels below serve two norm kinds (three ops); K says which, at compile time:
//   norm_dropout             (NdKind, the nd_*_kernel entries) the norm of x, then dropout and (p.relu) ReLU of the
//                            affine output; layer_norm_dropout_relu is its LayerNorm-with-ReLU case, and both ops
//                            run the same kernels with RMSNorm (p.rms) and the ReLU (p.relu) launch arguments
//                            (one uniform branch a row, a predicate an element): no instantiation of either op's.
//   dropout_add_norm         (DanKind) s = dropout(x) (+ residual), stored as `sum` in dtype U; LayerNorm or
//                            RMSNorm (p.rms, a launch argument: one uniform branch a row) of s as stored; the
//                            affine output. The backward adds grad_sum and applies the dropout to dS last.
// In the bodies, U is the dtype of the norm's input (x for NdKind, the stored sum for DanKind) and p.x points
// at it; S is x's (and out's, grad_out's, grad_x's) dtype.
template <bool kDropPre_, typename U_>
struct NormKind {
  static constexpr bool kDropPre = kDropPre_;  // dropout (and the residual) before the norm
  using U = U_;
};
template <typename S>
using NdKind = NormKind<false, S>;
template <typename U>
using DanKind = NormKind<true, U>;

// The types of a rows instance, for its plan's users: K the norm kind, S the dtype of x (and out, grad_out,
// grad_x), P the parameters', A the accumulation type, U the norm input's (K::U).
template <class K_, typename S_, typename P_, typename A_>
struct NormTypes {
  using K = K_;
  using S = S_;
  using P = P_;
  using A = A_;
  using U = typename K_::U;
};

// dropout_add_norm's launch arguments: norm_dropout's (NdKind's) plus the residual, the sum and the norm kind.
// x: the op's x (dtype S); mean: nullptr for RMSNorm.
template <typename S, typename U, typename P, typename A>
struct DanForwardParams : NdForwardParams<S, P, A> {
  const U* residual;  // (M, N); nullptr: no residual
  U* sum;             // (M, N) s = dropout(x) + residual, dtype U
};

// x: the stored sum s (dtype U, the norm's input); grad_x: the op's grad_x (dtype S).
template <typename S, typename U, typename P, typename A>
struct DanBackwardParams {
  const S* grad_out;    // (M, N)
  const U* x;           // (M, N) the stored sum
  const U* grad_sum;    // (M, N); nullptr: none
  const P* weight;      // (N); nullptr: no weight
  const P* bias;        // (N); unused by the math (dbeta needs only grad_out); kept for the shared bodies
  const A* mean;        // (M); nullptr for RMSNorm
  const A* rstd;        // (M)
  const int64_t* seed;  // (1) or (4), as the forward's
  S* grad_x;            // (M, N)
  U* grad_residual;     // (M, N); nullptr: no residual
  A* partial_w;         // (G, ldp) as NdBackwardParams
  A* partial_b;         // (G, ldp)
  A* row_stats;         // looped path: (M, 2)
  int64_t M, N, ldp;
  A inv_n;  // 1 / N
  A scale;
  uint32_t threshold;
  bool x_vec;  // N % 8 == 0, every row buffer 16-byte aligned
  bool p_vec;
  bool rms;
};

// DanKind's extra row buffers (nullptr for NdKind, whose params have none).
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

}  // namespace dev
}  // namespace gpuopt
