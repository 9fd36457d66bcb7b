// The rows backward of the normalised-rows ops: a warp or a block a row (rows kernels), or a block a row with its
// column sums in shared memory (wide kernels), the row held in registers.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda/norm_common.cuh"

namespace gpuopt {
namespace dev {

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
// Launch shape of nd_forward_rows_kernel; grid = G blocks, each owning the rows (blockIdx.x + i * G) * R + ty.
// With xhat = (x - mean) * rstd, y = xhat * w + b, dy the gradient reaching y (LayerNorm-dropout-ReLU: grad_out
// through the dropout and the ReLU bit of y; dropout-add-norm: grad_out itself) and dxhat = dy * w, a row takes
//   c1 = mean(dxhat * xhat), c2 = mean(dxhat) (RMSNorm: no mean, c2 = 0)
//   layer_norm_dropout_relu: grad_x = rstd * (dxhat - xhat * c1 - c2)
//   dropout_add_norm:        dS = rstd * (dxhat - xhat * c1 - c2) + grad_sum, grad_residual = dS,
//                            grad_x = dropout(dS)
// and every thread adds dgamma += dy * xhat, dbeta += dy over its rows, one partial row a block.
// Each row issues all its loads (mean, rstd, x and grad_out of the thread's groups; the weight and bias too when
// they are not held) before any math, computes xhat and dxhat once into fp32 registers, and after the row
// reduction only combines them into grad_x. Weight and bias are loaded once, before the row loop, where
// hold_params allows (as the forward).
// kWide (8192 < N <= 18432, up to cuda::kWideThreads threads, fp32 accumulation, the 16-byte path): the
// registers hold the row's groups and their xhat / dxhat; dgamma / dbeta accumulate in dynamic shared memory
// (wide_load / wide_store), the weight and bias are loaded raw with the row (fp32 ones at 6 groups a thread with
// each group's math), and at 6 groups a thread the row's dxhat waits in shared memory too (kTight below).

// A group's scratch registers in backward_group_sums: its keep bits, its parameters (fp64: loaded for the group;
// wide at 6 groups a thread: unpacked) and, at 6 groups a thread, its unpacked x and grad_out. Declared by the
// caller inside its group loop, where the kernel declared them before it was split: a helper's own arrays would be
// placed ahead of the row's arrays, and that order alone changes ptxas's register allocation.
template <class Plan>
struct BackwardGroupScratch {
  bool keep[kGroup];
  typename Plan::A wg[kGroup], bg[kGroup];
  typename Plan::A xu[Plan::kTight ? kGroup : 1], gu[Plan::kTight ? kGroup : 1];
};

// The compile-time choices of one rows or wide backward instance, each with its reason; the helpers below read
// them from here.
template <class K, typename S, typename P, typename A, bool kVec_, bool kWarpRow_, int VPT_, bool kWide_>
struct NormBackwardRowsPlan : NormTypes<K, S, P, A> {
  using U = typename K::U;
  static constexpr bool kVec = kVec_, kWarpRow = kWarpRow_, kWide = kWide_;
  static constexpr int VPT = VPT_;
  static_assert(!kWide || (kVec && !kWarpRow && sizeof(A) == 4), "the wide backward is fp32, 16-byte, a block a row");
  // fp64 (gradcheck's dtype) neither holds the parameters nor loads them with the row: its registers hold the
  // row's xhat, dxhat and dgamma / dbeta at twice the size, so each group loads its own after the row's loads.
  // DanKind with an fp32 sum: its block rows' registers hold the fp32 sum and grad_sum groups instead
  static constexpr bool kHold =
      !kWide && sizeof(A) == 4 && hold_params<kVec, kWarpRow, P, VPT>() && (kWarpRow || !K::kDropPre || sizeof(U) == 2);
  static constexpr bool kBatchParams = !kHold && !kWide && sizeof(A) == 4;  // reloaded ones come with the row's loads
  static constexpr int kHeld = kHold ? VPT : 1;
  static constexpr int kBatched = kBatchParams ? VPT : 1;
  using R = param_reg_t<A, P, kWarpRow>;
  // the key schedule held through the row (DanKind needs the keep bits only after the row sum; the wide
  // LayerNorm-dropout-ReLU holds it too: 20 registers for 2.5 instructions an element)
  static constexpr bool kHoistKeys = kWarpRow || (!K::kDropPre && (kHold || kWide) && sizeof(S) == 2);
  static constexpr int kSums = kWide ? 1 : VPT;  // groups whose dgamma / dbeta sums live in registers
  // At 6 groups a thread (kTight) the wide kernel saves registers where 4 and 3 spend instructions: the row's
  // dxhat waits in shared memory (kPark; dropout_add_norm's always), LayerNorm-dropout-ReLU with 16-bit x takes
  // xhat again from x's raw group after the row sum (kRecompute), and dropout_add_norm with an fp32 sum reads
  // the sum again, from L2, there (kReloadSum: the row's groups at once; two at a time with fp16 x), rather than
  // hold them across it.
  static constexpr bool kTight = kWide && VPT > 4;
  static constexpr bool kPark = kTight || (kWide && K::kDropPre);
  static constexpr bool kRecompute = kTight && !K::kDropPre && sizeof(U) == 2;
  static constexpr bool kReloadSum = kTight && K::kDropPre && sizeof(U) == 4;
  // wide: the parameters reloaded with the row, in their own type (fp32 ones at 6 groups a thread are loaded with
  // each group's math, from L2, which frees the registers of the row's loads)
  static constexpr bool kRawParams = kWide && (sizeof(P) == 2 || !kTight);
  // The wide kernel loads and takes in a row in parts where its 168 registers do not hold all of the row's raw
  // groups next to their xhat / dxhat: one part at 3 groups a thread and at 4 with 16-bit x; else 2 (fp32 x at
  // 4, dropout_add_norm at 6) or 3 (LayerNorm-dropout-ReLU at 6). Each part issues its loads before its math.
  static constexpr int kParts =
      !kWide || VPT == 3 || (VPT == 4 && sizeof(S) == 2) ? 1 : (VPT == 6 && !K::kDropPre ? 3 : 2);
  // kReloadSum: the row's sum again, kAgain groups at a time, their loads first: the whole row (enough bytes in
  // flight), except with fp16 x, whose 168 registers hold two groups at a time (3 or 6 spill)
  static constexpr int kAgain = kReloadSum && std::is_same_v<S, half_t> ? 2 : VPT;
  static_assert(VPT % kAgain == 0);
};

// A thread's registers of one row, as references to the kernel's arrays: the raw groups of x (the norm's input,
// U) and grad_out, DanKind's grad_sum, the parameters reloaded with the row (kBatchParams: converted;
// kRawParams: as stored), and the groups' xhat and dxhat.
template <class Plan>
struct NormBackwardRow {
  using A = typename Plan::A;
  static constexpr int VPT = Plan::VPT;
  using Batched = A[Plan::kBatched][kGroup];
  using RawParams = Group<typename Plan::P>[Plan::kRawParams ? VPT : 1];
  using Values = A[VPT][kGroup];
  Group<typename Plan::U> (&xs)[VPT];
  Group<typename Plan::S> (&gs)[VPT];
  Group<typename Plan::U> (&gsum)[Plan::K::kDropPre ? VPT : 1];
  Batched& wl;
  Batched& bl;
  RawParams& wr;
  RawParams& br;
  Values& xhat;
  Values& dxhat;
};

// A row's scalars: its first element's offset row * N, its first dropout index and (N % 8 == 0) Philox group,
// mean and rstd, and the thread's column step (the wide kernel reads blockDim.x afresh each row, so the compiler
// does not keep a 64-bit parameter address a group across the row loop).
template <typename A>
struct NormBackwardRowAt {
  int64_t base, drop0, group0;
  A mu, rs;
  int Tr;
};

// The wide kernel's start: the thread's shared slots (cuda::wide_slots(VPT) of 16 bytes), the dgamma / dbeta
// sums zeroed.
template <typename A, int VPT>
GPUOPT_DEV A* start_wide_slots(int tx) {
  GPUOPT_DYNAMIC_SHARED(A, dyn);
  A* wide_acc = dyn + int64_t(tx) * cuda::wide_slots(VPT) * 4;
  const uint4 zero{0u, 0u, 0u, 0u};
#pragma unroll
  for (int i = 0; i < 4 * VPT; ++i) store16(wide_slot(wide_acc, i), zero);
  return wide_acc;
}

// Part h of a row's loads, all issued before its math: x and grad_out, DanKind's grad_sum, and the parameters
// the plan reloads with the row. Unconditional: an absent last group loads the row's first group instead, unused.
template <class Plan, class Params>
GPUOPT_DEV void load_backward_row_part(const Params& p, const typename Plan::P* bias,
                                       const NormBackwardRowAt<typename Plan::A>& at, int h, int tx, int groups,
                                       int64_t N, bool has_gs, const NormBackwardRow<Plan>& r) {
  using A = typename Plan::A;
  using K = typename Plan::K;
  constexpr int VPT = Plan::VPT, kParts = Plan::kParts;
  constexpr bool kVec = Plan::kVec, kBatchParams = Plan::kBatchParams, kRawParams = Plan::kRawParams;
#pragma unroll
  for (int k = h * VPT / kParts; k < (h + 1) * VPT / kParts; ++k) {
    int g = tx + k * at.Tr;
    g = has_group<VPT>(k, g, groups) ? g : 0;
    const int c0 = g * kGroup;
    const int valid = kVec ? kGroup : group_size(N, c0);
    load_raw_group(p.x + at.base + c0, valid, kVec, r.xs[k]);
    load_raw_group(p.grad_out + at.base + c0, valid, kVec, r.gs[k]);
    if constexpr (K::kDropPre) {
      if (has_gs) load_raw_group(grad_sum_of<K>(p) + at.base + c0, valid, kVec, r.gsum[K::kDropPre ? k : 0]);
    }
    if (kBatchParams) {
      load_param_group(p.weight, c0, valid, kVec, A(1), r.wl[kBatchParams ? k : 0]);
      load_param_group(bias, c0, valid, kVec, A(0), r.bl[kBatchParams ? k : 0]);
    }
    if constexpr (kRawParams) {
      load_raw_param(p.weight, c0, kGroup, true, from_acc<typename Plan::P>(A(1)), r.wr[kRawParams ? k : 0]);
      load_raw_param(bias, c0, kGroup, true, from_acc<typename Plan::P>(A(0)), r.br[kRawParams ? k : 0]);
    }
  }
}

// Group k's share of the row's sums, from its loaded registers: xhat = (x - mean) * rstd, dy, dxhat = dy * w;
// dgamma += dy * xhat, dbeta += dy, c1 += dxhat * xhat, c2 += dxhat. DanKind then keeps rstd * dxhat + grad_sum
// in dxhat (two of dS's terms: grad_sum is read with the row's other loads and not held across the row sum).
// The wide kernel's sums are loaded from its slots before the group's math and stored after it (one FMA an
// element, as in registers); kPark stores the group's dxhat there too, to wait across the row sum.
template <class Plan, class Params, class Drop>
GPUOPT_DEV void backward_group_sums(const Params& p, const RowConsts<typename Plan::A>& rc, const Drop& drop,
                                    const typename Plan::P* bias, const NormBackwardRowAt<typename Plan::A>& at, int k,
                                    int g, int64_t N, bool has_gs, typename Plan::R (&w)[Plan::kHeld][kGroup],
                                    typename Plan::R (&b)[Plan::kHeld][kGroup],
                                    typename Plan::A (&dw)[Plan::kSums][kGroup],
                                    typename Plan::A (&db)[Plan::kSums][kGroup], typename Plan::A* wide_acc,
                                    const NormBackwardRow<Plan>& r, typename Plan::A& c1, typename Plan::A& c2,
                                    BackwardGroupScratch<Plan>& t) {
  auto& keep = t.keep;
  auto& wg = t.wg;  // fp64: this group's parameters only; wide: the raw parameters, unpacked
  auto& bg = t.bg;
  auto& xu = t.xu;
  auto& gu = t.gu;
  using A = typename Plan::A;
  using K = typename Plan::K;
  constexpr int VPT = Plan::VPT;
  constexpr bool kVec = Plan::kVec, kWide = Plan::kWide, kHold = Plan::kHold, kTight = Plan::kTight;
  constexpr bool kBatchParams = Plan::kBatchParams, kRawParams = Plan::kRawParams;
  const int c0 = g * kGroup;
  const int valid = kVec ? kGroup : group_size(N, c0);
  if constexpr (!K::kDropPre) group_keep<kVec>(drop, rc, p.threshold, at.group0, g, at.drop0 + c0, valid, keep);
  if constexpr (kWide) {
    wide_load(wide_acc, 4 * k, dw[0]);
    wide_load(wide_acc, 4 * k + 2, db[0]);
  }
  if (!kHold && !kBatchParams && !kRawParams) {
    load_param_group(p.weight, c0, valid, kVec, A(1), wg);
    load_param_group(bias, c0, valid, kVec, A(0), bg);
  }
  // kTight: x, grad_out and the parameters unpacked a group at a time (unpack_group): fewer instructions there,
  // more at 3 and 4 groups a thread
  if constexpr (kTight) {
    unpack_group(r.xs[k], xu);
    unpack_group(r.gs[k], gu);
  }
  if constexpr (kRawParams && kTight) {
    unpack_group(r.wr[kRawParams ? k : 0], wg);
    unpack_group(r.br[kRawParams ? k : 0], bg);
  }
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    const A wj = kHold                   ? static_cast<A>(to_acc(w[kHold ? k : 0][j]))
                 : kRawParams && !kTight ? static_cast<A>(to_acc(r.wr[kRawParams ? k : 0].v[j]))
                                         : (kBatchParams ? r.wl[kBatchParams ? k : 0][j] : wg[j]);
    const A bj = kHold                   ? static_cast<A>(to_acc(b[kHold ? k : 0][j]))
                 : kRawParams && !kTight ? static_cast<A>(to_acc(r.br[kRawParams ? k : 0].v[j]))
                                         : (kBatchParams ? r.bl[kBatchParams ? k : 0][j] : bg[j]);
    const bool in = j < valid;
    const A xj = kTight ? xu[kTight ? j : 0] : static_cast<A>(to_acc(r.xs[k].v[j]));
    const A gj = kTight ? gu[kTight ? j : 0] : static_cast<A>(to_acc(r.gs[k].v[j]));
    r.xhat[k][j] = in ? (xj - at.mu) * at.rs : A(0);
    A dy;
    if constexpr (K::kDropPre) {
      (void)bj;
      dy = in ? gj : A(0);
    } else {
      dy = in ? nd_backward_element<A>(gj, affine(r.xhat[k][j], wj, bj), keep[j], p.scale, p.relu) : A(0);
    }
    r.dxhat[k][j] = dy * wj;
    dw[kWide ? 0 : k][j] += dy * r.xhat[k][j];
    db[kWide ? 0 : k][j] += dy;
    c1 += r.dxhat[k][j] * r.xhat[k][j];
    c2 += r.dxhat[k][j];
    if constexpr (K::kDropPre) {
      r.dxhat[k][j] *= at.rs;
      if (has_gs) r.dxhat[k][j] += static_cast<A>(to_acc(r.gsum[K::kDropPre ? k : 0].v[j]));
    }
  }
  if constexpr (kWide) {
    wide_store(wide_acc, 4 * k, dw[0]);
    wide_store(wide_acc, 4 * k + 2, db[0]);
  }
  if constexpr (Plan::kPark) wide_store(wide_acc, 4 * VPT + 2 * k, r.dxhat[k]);
}

// LayerNorm-dropout-ReLU's grad_x of the row, c1 and c2 being the row means: rstd * (dxhat - xhat * c1 - c2);
// the wide kernel in two FMAs an element, rstd * dxhat - rstd c2 - (rstd c1) xhat (kRecompute: xhat again from
// x's raw group, rstd * dxhat - rstd c2 - (rstd^2 c1) (x - mean)).
template <class Plan, class Params>
GPUOPT_DEV void nd_backward_grad_x(const Params& p, const NormBackwardRowAt<typename Plan::A>& at, typename Plan::A c1,
                                   typename Plan::A c2, int tx, int groups, int64_t N, typename Plan::A* wide_acc,
                                   const NormBackwardRow<Plan>& r) {
  using A = typename Plan::A;
  constexpr int VPT = Plan::VPT;
  constexpr bool kVec = Plan::kVec, kRecompute = Plan::kRecompute;
  const A rs = at.rs;
  [[maybe_unused]] const A rs_c1 = rs * c1, rs2_c1 = rs * rs_c1, rs_c2 = rs * c2;  // the wide kernel's forms
  typename Plan::S* __restrict__ gxr = p.grad_x + at.base;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int g = tx + k * at.Tr;
    if (has_group<VPT>(k, g, groups)) {
      const int c0 = g * kGroup;
      if constexpr (Plan::kPark) wide_load(wide_acc, 4 * VPT + 2 * k, r.dxhat[k]);
      A o[kGroup];
      [[maybe_unused]] A xu[kRecompute ? kGroup : 1];
      if constexpr (kRecompute) unpack_group(r.xs[k], xu);
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        if constexpr (Plan::kWide) {
          const A t = r.dxhat[k][j] * rs - rs_c2;
          o[j] = kRecompute ? t - rs2_c1 * (xu[kRecompute ? j : 0] - at.mu) : t - rs_c1 * r.xhat[k][j];
        } else {
          o[j] = rs * (r.dxhat[k][j] - r.xhat[k][j] * c1 - c2);
        }
      }
      store_group(gxr + c0, kVec ? kGroup : group_size(N, c0), kVec, o);
    }
  }
}

// dropout_add_norm's gradients of the row: dS = rstd * dxhat + grad_sum - rstd * (xhat * c1 + c2), dxhat holding
// the first two terms; grad_residual = dS and grad_x = dropout(dS), the keep bits drawn here (after the row sum).
// A block row takes xhat again from the sum's raw group (16-bit: half the registers of holding it); the wide
// kernel in two FMAs an element, (dxhat - rstd c2) - (rstd^2 c1) (s - mean), with kReloadSum's loads of the sum.
template <class Plan, bool kMapped, class Params, class Drop>
GPUOPT_DEV void dan_backward_grads(const Params& p, const RowConsts<typename Plan::A>& rc, const Drop& drop,
                                   const NormBackwardRowAt<typename Plan::A>& at, typename Plan::A c1,
                                   typename Plan::A c2, int tx, int groups, int64_t N, typename Plan::A* wide_acc,
                                   const NormBackwardRow<Plan>& r) {
  using A = typename Plan::A;
  using K = typename Plan::K;
  constexpr int VPT = Plan::VPT, kAgain = Plan::kAgain;
  constexpr bool kVec = Plan::kVec, kWide = Plan::kWide, kTight = Plan::kTight;
  const A mu = at.mu, rs = at.rs;
  [[maybe_unused]] const A rs_c1 = rs * c1, rs2_c1 = rs * rs_c1, rs_c2 = rs * c2;
  typename Plan::S* __restrict__ gxr = p.grad_x + at.base;
  // the row's first dropout index under a map, taken here: held from the row's top, the wide kernel at 6 groups a
  // thread with an fp32 sum spills
  const int64_t late0 = kMapped ? row_dropout_index<kMapped>(p, at.base) : at.drop0;
#pragma unroll
  for (int k0 = 0; k0 < VPT; k0 += kAgain) {
    if constexpr (Plan::kReloadSum) {
#pragma unroll
      for (int k = k0; k < k0 + kAgain; ++k) {
        const int gl = has_group<VPT>(k, tx + k * at.Tr, groups) ? tx + k * at.Tr : 0;
        load_raw_group(p.x + at.base + gl * kGroup, kGroup, true, r.xs[k]);
      }
    }
#pragma unroll
    for (int k = k0; k < k0 + kAgain; ++k) {
      const int g = tx + k * at.Tr;
      if (!has_group<VPT>(k, g, groups)) continue;
      const int c0 = g * kGroup;
      const int valid = kVec ? kGroup : group_size(N, c0);
      if constexpr (Plan::kPark) wide_load(wide_acc, 4 * VPT + 2 * k, r.dxhat[k]);
      bool keep[kGroup];
      group_keep<kVec>(drop, rc, p.threshold, kMapped ? late0 / kGroup : at.group0, g, late0 + c0, valid, keep);
      A ds[kGroup], o[kGroup];
      [[maybe_unused]] A xu[kTight ? kGroup : 1];
      if constexpr (kTight) unpack_group(r.xs[k], xu);
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        if constexpr (kWide) {
          const A xj = kTight ? xu[kTight ? j : 0] : static_cast<A>(to_acc(r.xs[k].v[j]));
          ds[j] = (r.dxhat[k][j] - rs_c2) - rs2_c1 * (xj - mu);
        } else {
          const A xh =
              Plan::kWarpRow ? r.xhat[k][j] : (j < valid ? (static_cast<A>(to_acc(r.xs[k].v[j])) - mu) * rs : A(0));
          ds[j] = r.dxhat[k][j] - rs * (xh * c1 + c2);
        }
        o[j] = dan_dropout<A>(ds[j], keep[j], p.scale);
      }
      if (grad_residual_of<K>(p) != nullptr) store_group(grad_residual_of<K>(p) + at.base + c0, valid, kVec, ds);
      store_group(gxr + c0, valid, kVec, o);
    }
  }
}

// The wide kernel's dgamma / dbeta sums as the block's partial rows (R == 1: the thread's own slots are the
// block's sums).
template <class Plan, class Params>
GPUOPT_DEV void write_wide_partials(const Params& p, int T, int tx, int groups, typename Plan::A* wide_acc) {
  using A = typename Plan::A;
#pragma unroll
  for (int k = 0; k < Plan::VPT; ++k) {
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
}

// The rows and wide backward: per row, its loads and sums part by part, the row sums of c1 and c2, then grad_x
// (and DanKind's grad_residual); the column sums at the end.
template <class K, typename S, typename P, typename A, bool kVec, bool kWarpRow, int VPT, bool kWide, bool kMapped,
          class Params>
GPUOPT_DEV void norm_backward_rows(const Params& p) {
  using Plan = NormBackwardRowsPlan<K, S, P, A, kVec, kWarpRow, VPT, kWide>;
  GPUOPT_SHARED_ARRAY(A, red, 4 * kWarpSize);
  const RowConsts<A> rc(p);
  const GroupDropout<Plan::kHoistKeys> drop(rc.seed, p.threshold);
  const int64_t N = rc.N;
  const int groups = static_cast<int>(rc.groups);  // rows and wide paths: N <= 18432
  [[maybe_unused]] const bool has_gs = K::kDropPre && grad_sum_of<K>(p) != nullptr;
  const int T = kWarpRow ? kWarpSize : blockDim.x, tx = threadIdx.x;
  const bool rms = p.rms;  // a launch argument of both kinds
  // the bias enters only layer_norm_dropout_relu's math (its ReLU bit)
  const P* __restrict__ bias = K::kDropPre ? nullptr : p.bias;
  typename Plan::R w[Plan::kHeld][kGroup], b[Plan::kHeld][kGroup];
  if (Plan::kHold) load_row_params<kVec>(p.weight, bias, N, groups, w, b);
  A dw[Plan::kSums][kGroup], db[Plan::kSums][kGroup];
#pragma unroll
  for (int k = 0; k < Plan::kSums; ++k)
#pragma unroll
    for (int j = 0; j < kGroup; ++j) dw[k][j] = db[k][j] = A(0);
  [[maybe_unused]] A* wide_acc = nullptr;
  if constexpr (kWide) wide_acc = start_wide_slots<A, VPT>(tx);
  // the block's row step `it` (32 bits: rows past 2^31 grid strides do not occur) gives the row and the parity,
  // so no 64-bit row counter lives across the row's math
  for (int it = 0;; ++it) {
    const int64_t row0 = (int64_t(it) * gridDim.x + blockIdx.x) * blockDim.y;
    if (row0 >= p.M) break;
    const int64_t row = row0 + threadIdx.y;
    const int parity = it & 1;
    if (row >= p.M) continue;  // R > 1 only: one warp a row, no barrier below
    const int Tr = kWide ? opaque_block_dim_x() : T;
    const int64_t base = row * N;
    const A mu = rms ? A(0) : p.mean[row], rs = p.rstd[row];
    // NdKind's keep bits come with the row's loads: the row's first dropout index (DanKind under a map takes its
    // own after the row sum)
    Group<typename K::U> xs[VPT];
    Group<S> gs[VPT];
    [[maybe_unused]] Group<typename K::U> gsum[K::kDropPre ? VPT : 1];
    typename NormBackwardRow<Plan>::Batched wl, bl;
    [[maybe_unused]] typename NormBackwardRow<Plan>::RawParams wr, br;
    const int64_t drop0 = K::kDropPre && kMapped ? 0 : row_dropout_index<kMapped>(p, base);
    const int64_t group0 = drop0 / kGroup;  // used when N % 8 == 0
    A xhat[VPT][kGroup], dxhat[VPT][kGroup];
    A c1 = A(0), c2 = A(0);
    const NormBackwardRowAt<A> at{base, drop0, group0, mu, rs, Tr};
    const NormBackwardRow<Plan> r{xs, gs, gsum, wl, bl, wr, br, xhat, dxhat};
#pragma unroll
    for (int h = 0; h < Plan::kParts; ++h) {
      load_backward_row_part<Plan>(p, bias, at, h, tx, groups, N, has_gs, r);
#pragma unroll
      for (int k = h * VPT / Plan::kParts; k < (h + 1) * VPT / Plan::kParts; ++k) {
        const int g = tx + k * Tr;
        if (has_group<VPT>(k, g, groups)) {
          BackwardGroupScratch<Plan> t;
          backward_group_sums<Plan>(p, rc, drop, bias, at, k, g, N, has_gs, w, b, dw, db, wide_acc, r, c1, c2, t);
        }
      }
    }
    row_sum2<kWarpRow>(c1, c2, red + parity * 2 * kWarpSize);
    c1 *= rc.inv_n;
    c2 = rms ? A(0) : c2 * rc.inv_n;
    if constexpr (!K::kDropPre) {
      nd_backward_grad_x<Plan>(p, at, c1, c2, tx, groups, N, wide_acc, r);
    } else {
      dan_backward_grads<Plan, kMapped>(p, rc, drop, at, c1, c2, tx, groups, N, wide_acc, r);
    }
  }
  if constexpr (kWide) {
    write_wide_partials<Plan>(p, T, tx, groups, wide_acc);
  } else {
    // every thread of the block runs the same number of row iterations, so all reach these barriers
    GPUOPT_SHARED_ARRAY(A, comb, 4 * kWarpSize * kGroup);  // R * T * 8 with R > 1 only when T == 32, R <= 4
    if (p.partial_w != nullptr) write_row_partials<A, VPT>(dw, p.partial_w, p.ldp, groups, comb);
    if (p.partial_b != nullptr) write_row_partials<A, VPT>(db, p.partial_b, p.ldp, groups, comb);
  }
}

// The rows backwards (formulas at the top of this section): layer_norm_dropout_relu's grad_x, dropout_add_norm's
// grad_x and grad_residual, and both ops' per-block partial sums of dgamma = sum(dy * xhat), dbeta = sum(dy).
template <typename S, typename P, typename A, bool kVec, bool kWarpRow, int VPT>
__global__ void __launch_bounds__(cuda::norm_rows_backward_max_threads(kWarpRow, sizeof(S)))
    nd_backward_rows_kernel(NdBackwardParams<S, P, A> p) {
  norm_backward_rows<NdKind<S>, S, P, A, kVec, kWarpRow, VPT, false, false>(p);
}

template <typename S, typename P, typename A, bool kVec, bool kWarpRow, int VPT>
__global__ void __launch_bounds__(cuda::norm_rows_backward_max_threads(kWarpRow, sizeof(S)))
    nd_backward_rows_mapped_kernel(NdBackwardParams<S, P, A> p) {
  norm_backward_rows<NdKind<S>, S, P, A, kVec, kWarpRow, VPT, false, true>(p);
}

template <typename S, typename U, typename P, typename A, bool kWarpRow, int VPT>
__global__ void __launch_bounds__(cuda::norm_rows_backward_max_threads(kWarpRow, cuda::dan_elem(sizeof(S), sizeof(U))))
    dan_backward_rows_kernel(DanBackwardParams<S, U, P, A> p) {
  norm_backward_rows<DanKind<U>, S, P, A, true, kWarpRow, VPT, false, false>(p);
}

template <typename S, typename U, typename P, typename A, bool kWarpRow, int VPT>
__global__ void __launch_bounds__(cuda::norm_rows_backward_max_threads(kWarpRow, cuda::dan_elem(sizeof(S), sizeof(U))))
    dan_backward_rows_mapped_kernel(DanBackwardParams<S, U, P, A> p) {
  norm_backward_rows<DanKind<U>, S, P, A, true, kWarpRow, VPT, false, true>(p);
}

// The wide backwards (8192 < N <= 16384): a block of up to 512 threads a row, dgamma / dbeta in dynamic shared
// memory (cuda::wide_backward_shared bytes).
template <typename S, typename P, typename A, int VPT>
__global__ void __launch_bounds__(cuda::kWideThreads) nd_backward_wide_kernel(NdBackwardParams<S, P, A> p) {
  norm_backward_rows<NdKind<S>, S, P, A, true, false, VPT, true, false>(p);
}

template <typename S, typename P, typename A, int VPT>
__global__ void __launch_bounds__(cuda::kWideThreads) nd_backward_wide_mapped_kernel(NdBackwardParams<S, P, A> p) {
  norm_backward_rows<NdKind<S>, S, P, A, true, false, VPT, true, true>(p);
}

template <typename S, typename U, typename P, typename A, int VPT>
__global__ void __launch_bounds__(cuda::kWideThreads) dan_backward_wide_kernel(DanBackwardParams<S, U, P, A> p) {
  norm_backward_rows<DanKind<U>, S, P, A, true, false, VPT, true, false>(p);
}

template <typename S, typename U, typename P, typename A, int VPT>
__global__ void __launch_bounds__(cuda::kWideThreads) dan_backward_wide_mapped_kernel(DanBackwardParams<S, U, P, A> p) {
  norm_backward_rows<DanKind<U>, S, P, A, true, false, VPT, true, true>(p);
}

}  // namespace dev
}  // namespace gpuopt
