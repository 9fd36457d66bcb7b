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
// blockDim (T, R): T threads per row (R rows a block when T == 32, else R == 1; one warp a row: a warp's rows end
// together, nothing waits for the block; one block a row: the block's threads share every row and its barriers);
// VPT groups per thread, group k of thread t at columns 8 * (t + k * T). kVec (the launcher's choice: N % 8 == 0,
// x, out, weight and bias 16-byte aligned) makes every access a 16-byte vector and every group one Philox call at
// compile time.
// Weight and bias are loaded once, before the row loop (a thread's columns are the same in every row).
// NdKind: a software pipeline over a warp's (a block's) rows. Each row issues the loads of the row kAhead rows
// on (nd_rows_ahead: 2 for one warp a row with 16-bit x, 1 for the other 16-bit and fp32 rows, 0 for fp64)
// before its own math, so the warp keeps those rows' loads in flight while it reduces, draws the keep bits and
// stores, instead of waiting a full load latency at the top of every row. A row is held raw (16-bit x: half the
// registers of fp32) and converted again where it is used (the same conversion, so the same bits; `opaque` keeps
// the compiler from holding the fp32 copy instead). A group's keep bits are drawn where the output consumes
// them, as booleans (a 32-bit mask drawn before the row sums cost ~4 more instructions an element to pack and
// test; the rows ahead already keep the loads in flight through the row's math).
// DanKind: each row issues its loads (x and the residual) at the top; the sum is formed, stored and read back as
// rounded to U in the same pass, so the norm sees s as stored.

// The compile-time choices of one rows forward instance, each with its reason; the helpers below read them from
// here.
template <class K, typename S, typename P, typename A, bool kVec_, bool kWarpRow_, int VPT_, bool kMapped_>
struct NormForwardRowsPlan : NormTypes<K, S, P, A> {
  static constexpr bool kVec = kVec_, kWarpRow = kWarpRow_, kMapped = kMapped_;
  static constexpr int VPT = VPT_;
  // DanKind's block rows also hold the residual's row: their parameters are reloaded (from L1 / L2) every row
  static constexpr bool kHold = hold_params<kVec, kWarpRow, P, VPT>() && (kWarpRow || !K::kDropPre);
  static constexpr int kHeld = kHold ? VPT : 1;
  using R = param_reg_t<A, P, kWarpRow>;
  // the key schedule's 20 registers fit next to a block row when it and its parameters are 16-bit (and, for
  // layer_norm_dropout_relu, there is no residual row beside it)
  static constexpr bool kHoistKeys = kWarpRow || (!K::kDropPre && kHold && sizeof(S) == 2);
  // Rows whose x is in flight while a row is reduced (nd_rows_ahead; DanKind: none, its loads start each row)
  static constexpr int kAhead = K::kDropPre ? 0 : cuda::nd_rows_ahead(kWarpRow, sizeof(S));
  static constexpr int kAheadRows = kAhead > 0 ? kAhead : 1;
  // NdKind's block rows under a shard map draw their keep bits where their registers are fullest (a 16-bit row
  // of 4 groups a thread spills there if it holds one more value): thread 0 writes the row's first dropout index
  // at the top of the row into one of two slots of shared memory (row_drop; a row's barriers lie between its
  // write and the reads, the next row writes the other slot), and each group reads it back. Mapped warp rows,
  // whose registers have room, take it at each group; without a map it is the row's base.
  static constexpr bool kSharedDrop = kMapped && !kWarpRow && !K::kDropPre;
  static constexpr int kValues = K::kDropPre ? VPT : 1;  // DanKind holds s as stored; NdKind converts x again
};

// A thread's columns of its rows, read by the helpers through a reference (as the kernel's own values): the row
// length N, its groups (ceil(N / 8)), the threads of a row T and the thread's index tx; its group k lies at
// columns 8 * (tx + k * T).
template <int VPT>
struct RowThread {
  int64_t N;
  int groups, T, tx;
  // Whether group k (column group g) lies in the row: the plan makes VPT = ceil(groups / T) with
  // groups >= (VPT - 1) * T, so only a thread's last group can be absent. Written out here, not through has_group:
  // that form of the test changes the registers of some instances.
  GPUOPT_DEV bool has(int k, int g) const { return k < VPT - 1 || g < groups; }
};

// A row's offsets: its first element's, row * N, and its first Philox group without a map (used when N % 8 == 0).
struct ForwardRowAt {
  int64_t base, group0;
};

// A thread's groups of row r of x, as loaded (raw), every load first.
template <class Plan, class Params>
GPUOPT_DEV void load_forward_row(const Params& p, const RowThread<Plan::VPT>& t, int64_t r,
                                 Group<typename Plan::S> (&raw)[Plan::VPT]) {
  const typename Plan::S* __restrict__ xr = p.x + r * t.N;
#pragma unroll
  for (int k = 0; k < Plan::VPT; ++k) {
    const int g = t.tx + k * t.T;
    if (t.has(k, g))
      load_raw_group(xr + g * kGroup, Plan::kVec ? kGroup : group_size(t.N, g * kGroup), Plan::kVec, raw[k]);
  }
}

// NdKind: group k's share of the sum of the row's x for the mean, into `sum` (h: whether the group is in the row;
// absent elements are 0). x is the caller's scratch group, declared in its group loop.
template <class Plan>
GPUOPT_DEV void nd_group_sum_x(const Group<typename Plan::S>& raw, bool h, typename Plan::A (&x)[kGroup],
                               typename Plan::A& sum) {
  using A = typename Plan::A;
  if (h) unpack_group(raw, x);
#pragma unroll
  for (int j = 0; j < kGroup; ++j) sum += h ? x[j] : A(0);  // absent elements are 0
}

// DanKind's sum s = dropout(x) (+ residual) of the row: stored, and kept in v as stored (rounded to U; absent
// elements 0), its sum (RMSNorm: of squares) added to `sum`. rr, keep and s are the caller's scratch.
template <class Plan, class Params, class Drop>
GPUOPT_DEV void dan_form_row(const Params& p, const RowConsts<typename Plan::A>& rc, const Drop& drop,
                             const RowThread<Plan::VPT>& t, const ForwardRowAt& at, bool rms,
                             const Group<typename Plan::S> (&raw)[Plan::VPT], Group<typename Plan::U> (&rr)[Plan::VPT],
                             typename Plan::A (&v)[Plan::kValues][kGroup], bool (&keep)[kGroup],
                             typename Plan::A (&s)[kGroup], typename Plan::A& sum) {
  using A = typename Plan::A;
  using U = typename Plan::U;
  constexpr bool kVec = Plan::kVec;
  const bool res = p.residual != nullptr;
  const int64_t drop0 = row_dropout_index<Plan::kMapped>(p, at.base);  // the row's first dropout index
  const int64_t dgroup0 = Plan::kMapped ? drop0 / kGroup : at.group0;  // its Philox group (used when N % 8 == 0)
  if (res) {
#pragma unroll
    for (int k = 0; k < Plan::VPT; ++k) {
      const int g = t.tx + k * t.T;
      if (t.has(k, g))
        load_raw_group(p.residual + at.base + g * kGroup, kVec ? kGroup : group_size(t.N, g * kGroup), kVec, rr[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < Plan::VPT; ++k) {
    const int g = t.tx + k * t.T;
#pragma unroll
    for (int j = 0; j < kGroup; ++j) v[k][j] = A(0);  // absent elements are 0
    if (t.has(k, g)) {
      const int c0 = g * kGroup;
      const int valid = kVec ? kGroup : group_size(t.N, c0);
      group_keep<kVec>(drop, rc, p.threshold, dgroup0, g, drop0 + c0, valid, keep);
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        const A d = dan_dropout<A>(to_acc(raw[k].v[j]), keep[j], p.scale);
        s[j] = res ? d + static_cast<A>(to_acc(rr[k].v[j])) : d;
      }
      store_group(p.sum + at.base + c0, valid, kVec, s);
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        v[k][j] = j < valid ? static_cast<A>(to_acc(from_acc<U>(s[j]))) : A(0);  // s as stored
        sum += rms ? v[k][j] * v[k][j] : v[k][j];
      }
    }
  }
}

// The centred value of element j of the thread's group k: NdKind converts x again (exactly, into x) and subtracts
// the mean again (the same operation, so the same bits as the centred pass); DanKind keeps it in v.
template <class Plan>
GPUOPT_DEV typename Plan::A centred(const typename Plan::A (&v)[Plan::kValues][kGroup], int k, int j, int valid,
                                    const typename Plan::A (&x)[kGroup], typename Plan::A mu) {
  if constexpr (Plan::K::kDropPre) {
    return v[k][j];
  } else {
    return j < valid ? x[j] - mu : typename Plan::A(0);
  }
}

// The row's sum of squares about mu into sq: NdKind from x converted again (x: the caller's scratch group);
// DanKind centres v in place (x - mean, kept for the output). NdKind's RMSNorm skips the mean's sum and takes
// this pass with mu = 0 (x - 0 is x: sq is the sum of x^2), so its code is LayerNorm's plus two uniform branches
// (a shared-memory offset chosen at run time, as DanKind's parity, costs the LayerNorm rows 17 registers on the
// scalar path).
template <class Plan>
GPUOPT_DEV void centred_row_sum_sq(const RowThread<Plan::VPT>& t, Group<typename Plan::S> (&raw)[Plan::VPT],
                                   typename Plan::A (&v)[Plan::kValues][kGroup], typename Plan::A mu,
                                   typename Plan::A (&x)[kGroup], typename Plan::A& sq) {
  using A = typename Plan::A;
#pragma unroll
  for (int k = 0; k < Plan::VPT; ++k) {
    const int g = t.tx + k * t.T;
    if (t.has(k, g)) {
      const int valid = Plan::kVec ? kGroup : group_size(t.N, g * kGroup);
      if constexpr (!Plan::K::kDropPre) {
        opaque(raw[k]);
        unpack_group(raw[k], x);
      }
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        if constexpr (Plan::K::kDropPre) v[k][j] = j < valid ? v[k][j] - mu : A(0);
        const A d = centred<Plan>(v, k, j, valid, x, mu);
        sq += d * d;
      }
    }
  }
}

// The output pass's scratch groups: the group's weight and bias (converted), its output, NdKind's x converted
// again and its keep bits. Declared by the caller where the kernel declared them before it was split (a helper's
// own arrays would be placed ahead of the row's arrays, and that order alone changes ptxas's register allocation).
template <class Plan>
struct ForwardOutputScratch {
  typename Plan::A wa[kGroup], ba[kGroup], o[kGroup];
  typename Plan::A x[kGroup];
  bool keep[kGroup];
};

// The row's output: y = (x - mean) * rstd * w + b; NdKind's out = relu(dropout(y)), the group's keep bits drawn
// here, DanKind's out = y. The held parameters are converted again each row, the others reloaded a group at a time.
template <class Plan, class Params, class Drop>
GPUOPT_DEV void forward_output_row(const Params& p, const RowConsts<typename Plan::A>& rc, const Drop& drop,
                                   const RowThread<Plan::VPT>& t, const ForwardRowAt& at, const int64_t* row_drop,
                                   int slot, typename Plan::A mu, typename Plan::A rs,
                                   typename Plan::R (&w)[Plan::kHeld][kGroup],
                                   typename Plan::R (&b)[Plan::kHeld][kGroup],
                                   Group<typename Plan::S> (&raw)[Plan::VPT],
                                   const typename Plan::A (&v)[Plan::kValues][kGroup], ForwardOutputScratch<Plan>& s) {
  using A = typename Plan::A;
  using K = typename Plan::K;
  constexpr bool kVec = Plan::kVec, kWarpRow = Plan::kWarpRow, kMapped = Plan::kMapped, kHold = Plan::kHold;
  typename Plan::S* __restrict__ outr = p.out + at.base;
#pragma unroll
  for (int k = 0; k < Plan::VPT; ++k) {
    const int g = t.tx + k * t.T;
    if (t.has(k, g)) {
      const int c0 = g * kGroup;
      const int valid = kVec ? kGroup : group_size(t.N, c0);
      if (kHold) {
        // bf16 block rows: the weight converted again each row (one shift an element), not hoisted out of the
        // row loop by the compiler into more registers than a 512-thread block's 128 (it spilled one)
        if constexpr (!kWarpRow && !K::kDropPre && std::is_same<typename Plan::R, bfloat16_t>::value)
          opaque(w[kHold ? k : 0]);
#pragma unroll
        for (int j = 0; j < kGroup; ++j) {
          s.wa[j] = static_cast<A>(to_acc(w[kHold ? k : 0][j]));
          s.ba[j] = static_cast<A>(to_acc(b[kHold ? k : 0][j]));
        }
      } else {
        load_param_group(p.weight, c0, valid, kVec, A(1), s.wa);
        load_param_group(p.bias, c0, valid, kVec, A(0), s.ba);
      }
      if constexpr (!K::kDropPre) {
        // the row's first dropout index, taken at each group: no register holds it through the output loop
        const int64_t drop0 = !kMapped || kWarpRow ? row_dropout_index<kMapped>(p, at.base)
                                                   : load_volatile(row_drop + (kWarpRow ? 0 : slot));
        group_keep<kVec>(drop, rc, p.threshold, kMapped ? drop0 / kGroup : at.group0, g, drop0 + c0, valid, s.keep);
        opaque(raw[k]);
        unpack_group(raw[k], s.x);
      }
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        const A y = affine(centred<Plan>(v, k, j, valid, s.x, mu) * rs, s.wa[j], s.ba[j]);
        if constexpr (K::kDropPre) {
          s.o[j] = y;
        } else {
          s.o[j] = nd_forward_element<A>(y, s.keep[j], p.scale, p.relu);
        }
      }
      store_group(outr + c0, valid, kVec, s.o);
    }
  }
}

// NdKind's pipeline start: the loads of the thread's first row and of the rows ahead of it but the last (each
// row issues that one's).
template <class Plan, class Params>
GPUOPT_DEV void start_rows_ahead(const Params& p, const RowThread<Plan::VPT>& t, int64_t row, int64_t stride,
                                 Group<typename Plan::S> (&raw)[Plan::VPT],
                                 Group<typename Plan::S> (&ahead)[Plan::kAheadRows][Plan::VPT]) {
  load_forward_row<Plan>(p, t, row, raw);
#pragma unroll
  for (int a = 0; a + 1 < Plan::kAhead; ++a)
    if (row + (a + 1) * stride < p.M) load_forward_row<Plan>(p, t, row + (a + 1) * stride, ahead[a]);
}

// The row pipeline's step: the first row ahead becomes the row, each later one moves up.
template <class Plan>
GPUOPT_DEV void shift_rows_ahead(Group<typename Plan::S> (&raw)[Plan::VPT],
                                 Group<typename Plan::S> (&ahead)[Plan::kAheadRows][Plan::VPT]) {
#pragma unroll
  for (int k = 0; k < Plan::VPT; ++k) {
    raw[k] = ahead[0][k];
#pragma unroll
    for (int a = 0; a + 1 < Plan::kAhead; ++a) ahead[a][k] = ahead[a + 1][k];
  }
}

// The rows forward: per row, its loads (NdKind: of the row kAhead rows on), the row sum, the centred pass, the
// row's mean and rstd, and the output.
template <class K, typename S, typename P, typename A, bool kVec, bool kWarpRow, int VPT, bool kMapped, class Params>
GPUOPT_DEV void norm_forward_rows(const Params& p) {
  using Plan = NormForwardRowsPlan<K, S, P, A, kVec, kWarpRow, VPT, kMapped>;
  constexpr int kAhead = Plan::kAhead;
  GPUOPT_SHARED_ARRAY(A, red, 2 * kWarpSize);
  const RowConsts<A> rc(p);
  const GroupDropout<Plan::kHoistKeys> drop(rc.seed, p.threshold);
  const int64_t N = rc.N;
  const int groups = static_cast<int>(rc.groups);  // rows path: N <= 16384, so column offsets fit an int
  const int T = kWarpRow ? kWarpSize : blockDim.x, tx = threadIdx.x;
  const bool rms = p.rms;  // a launch argument of both kinds
  typename Plan::R w[Plan::kHeld][kGroup], b[Plan::kHeld][kGroup];
  if (Plan::kHold) load_row_params<kVec>(p.weight, p.bias, N, groups, w, b);
  const RowThread<VPT> t{N, groups, T, tx};
  const int64_t stride = int64_t(gridDim.x) * blockDim.y;
  int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= p.M) return;
  Group<S> raw[VPT], ahead[Plan::kAheadRows][VPT];
  if constexpr (kAhead > 0) start_rows_ahead<Plan>(p, t, row, stride, raw, ahead);
  int parity = 0;                             // RMSNorm's one row sum a row alternates between the two halves of `red`
  GPUOPT_SHARED_ARRAY(int64_t, row_drop, 2);  // Plan::kSharedDrop
  int slot = 0;
  for (;;) {
    const ForwardRowAt at{row * N, row * N / kGroup};
    const int64_t next = row + stride;
    const bool more = next < p.M;
    if constexpr (Plan::kSharedDrop) {
      slot ^= 1;
      if (tx == 0) row_drop[slot] = row_dropout_index<kMapped>(p, at.base);
    }
    if constexpr (kAhead > 0) {
      if (row + kAhead * stride < p.M) load_forward_row<Plan>(p, t, row + kAhead * stride, ahead[kAhead - 1]);
    } else {
      load_forward_row<Plan>(p, t, row, raw);
    }
    A v[Plan::kValues][kGroup];  // DanKind: s as stored; NdKind converts `raw` where it is used
    A sum = A(0);
    if constexpr (!K::kDropPre) {
      if (!rms) {  // RMSNorm skips the mean's sum
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
          A x[kGroup];
          nd_group_sum_x<Plan>(raw[k], t.has(k, tx + k * T), x, sum);
        }
      }
    } else {
      Group<typename K::U> rr[VPT];
      bool keep[kGroup];
      A s[kGroup];
      dan_form_row<Plan>(p, rc, drop, t, at, rms, raw, rr, v, keep, s, sum);
    }
    A mu = A(0), var;
    if (!K::kDropPre || !rms) {
      if (!rms) mu = row_sum<kWarpRow>(sum, red) * rc.inv_n;
      A sq = A(0);
      A x[kGroup];
      centred_row_sum_sq<Plan>(t, raw, v, mu, x, sq);
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
    ForwardOutputScratch<Plan> scratch;
    forward_output_row<Plan>(p, rc, drop, t, at, row_drop, slot, mu, rs, w, b, raw, v, scratch);
    if (!more) break;
    if constexpr (kAhead > 0) shift_rows_ahead<Plan>(raw, ahead);
    row = next;
  }
}

// layer_norm_dropout_relu (and norm_dropout: p.rms, p.relu), rows path: out = relu(dropout(xhat * w + b)), mean,
// rstd (the formulas above).
template <typename S, typename P, typename A, bool kVec, bool kWarpRow, int VPT>
__global__ void __launch_bounds__(cuda::norm_rows_forward_max_threads(kWarpRow, sizeof(S)))
    nd_forward_rows_kernel(NdForwardParams<S, P, A> p) {
  norm_forward_rows<NdKind<S>, S, P, A, kVec, kWarpRow, VPT, false>(p);
}

// Every row kernel has a *_mapped_kernel twin (kMapped: the row's dropout lanes numbered through the seed's shard
// map, row_dropout_index), launched only where the seed holds a map and the RNG runs, so the 1-element seed's
// instances keep the code and registers they had without maps.
template <typename S, typename P, typename A, bool kVec, bool kWarpRow, int VPT>
__global__ void __launch_bounds__(cuda::norm_rows_forward_max_threads(kWarpRow, sizeof(S)))
    nd_forward_rows_mapped_kernel(NdForwardParams<S, P, A> p) {
  norm_forward_rows<NdKind<S>, S, P, A, kVec, kWarpRow, VPT, true>(p);
}

// dropout_add_norm, rows path: sum = dropout(x) (+ residual), out = xhat(sum) * w + b, mean and rstd of sum.
// dropout_add_norm runs its rows kernels on the 16-byte vector path only (the launcher sends the rest to the
// looped kernels), so there is no kVec argument; the bound is that of the wider of x and the sum.
template <typename S, typename U, typename P, typename A, bool kWarpRow, int VPT>
__global__ void __launch_bounds__(cuda::norm_rows_forward_max_threads(kWarpRow, cuda::dan_elem(sizeof(S), sizeof(U))))
    dan_forward_rows_kernel(DanForwardParams<S, U, P, A> p) {
  norm_forward_rows<DanKind<U>, S, P, A, true, kWarpRow, VPT, false>(p);
}

template <typename S, typename U, typename P, typename A, bool kWarpRow, int VPT>
__global__ void __launch_bounds__(cuda::norm_rows_forward_max_threads(kWarpRow, cuda::dan_elem(sizeof(S), sizeof(U))))
    dan_forward_rows_mapped_kernel(DanForwardParams<S, U, P, A> p) {
  norm_forward_rows<DanKind<U>, S, P, A, true, kWarpRow, VPT, true>(p);
}

}  // namespace dev
}  // namespace gpuopt
