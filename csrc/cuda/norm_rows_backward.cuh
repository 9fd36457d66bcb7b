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

}  // namespace dev
}  // namespace gpuopt
