// CUDA kernels of gpuopt::gated_act and its backward (DESIGN.md sections 1 and 3): out = dropout(act(gate) * up),
// element-wise. The work unit is a group of 8 consecutive elements of the OUTPUT's linear order (indices 8q ..
// 8q + 7), which is exactly the Philox group q of the dropout contract: one Philox call a group, whatever F (under
// a shard map, whose base, period and jump are multiples of 8, the whole Philox group dropout_index(8q) / 8).
// Where a group's inputs live is a walk over the rows of the output:
//   two tensors  gate, up, out (and grad_out, grad_gate, grad_up) all (M, F) contiguous: a flat problem of n = M F
//                elements; the launcher sets row = n, so element i sits at offset i of every buffer.
//   packed       gate (M, 2F) holds [gate | up]: output element i = r F + c reads gate[r 2F + c] and
//                up = gate + F at the same offset; the backward writes grad_gate and grad_up (= grad_gate + F) at
//                that offset too; out and grad_out are (M, F) at i. row = F, ld = 2F.
// A thread takes the groups t, t + T, t + 2T, ... (T threads in the grid, a persistent one-wave grid), U of them
// a grid stride, all their loads issued before the first one is used. Its walk (the column of its group's first
// element and that element's offset in the gate layout) advances by the grid stride's 8T elements with one add
// and one conditional wrap a group, from constants the launcher computes (no division in the loop).
// kVec: 16-byte vectors (the launcher's choice: every pointer 16-byte aligned and no group crossing a row, i.e.
// two tensors, or packed with F % 8 == 0); the flat problem's last group, when n % 8 != 0, is then taken element
// by element by one thread after the loop. Otherwise every group goes element by element, its walk wrapping at
// each row end (F < 8: a group spans several rows).
// kDrop: p > 0 (one Philox call a group, GatedDropout); p = 0 takes instances with no RNG code at all. kMapped
// (with kDrop; the *_mapped_kernel instances): the seed holds a shard map (gated_keep). Both call
// fused_math.h's gated_forward_element / gated_backward_element, the CPU backend's and the emulator's formulas.
#pragma once
#include <cstdint>

#include "cuda/kernel_utils.cuh"
#include "cuda/launch_config.h"
#include "fused_math.h"

namespace gpuopt {
namespace cuda {

constexpr int kGatedThreads = 256;  // threads a block of both kernels (their __launch_bounds__)

// Groups a thread takes per grid stride (all loads first) on the vector path: 16-bit and fp32, 2 (forward: 64 or
// 128 bytes of gate and up in flight a thread; backward: 96 or 192 with grad_out); fp64 1 (its groups are 64 bytes
// a tensor). The element-by-element path takes 1 (its walk wraps per element: two groups of it spill).
constexpr int gated_unroll(int elem, bool vec) { return elem == 8 || !vec ? 1 : 2; }

}  // namespace cuda

namespace dev {

// The output-order walk of a thread: its current group's first element i = 8q lies in column c of a row of
// `row` elements, at offset g = (i / row) * ld + c of the gate-layout buffers.
struct GatedWalk {
  int64_t c;
  int64_t g;
};

// The walk's geometry, computed by the launcher: step = 8T elements = step_rows * row + step_col, step_col < row.
struct GatedGeometry {
  int64_t n;         // output elements, M F (> 0)
  int64_t row;       // output elements a row as the walk sees it: F (packed) or n (two tensors)
  int64_t ld;        // row stride of the gate-layout buffers: 2F (packed) or n (two tensors)
  int64_t step_col;  // (8T) % row
  int64_t step_off;  // (8T) / row * ld + step_col: the offset change of one grid stride, before a wrap
  int64_t wrap;      // ld - row: added when the column passes the row's end
};

// The walk at output element i: a thread's first group (i = 8t < 2^32, plan_gated checks it), or the flat
// problem's tail (i < row). One 32-bit division at most (a 64-bit one would be a call, with a stack frame).
GPUOPT_HOST_DEV GatedWalk gated_walk_at(int64_t i, const GatedGeometry& geo) {
  if (i < geo.row) return GatedWalk{i, i};
  const int64_t r = static_cast<uint32_t>(i) / static_cast<uint32_t>(geo.row);  // row < i < 2^32
  const int64_t c = i - r * geo.row;
  return GatedWalk{c, r * geo.ld + c};
}

// The walk one grid stride (8T elements) on.
GPUOPT_HOST_DEV void gated_walk_step(GatedWalk& w, const GatedGeometry& geo) {
  w.c += geo.step_col;
  w.g += geo.step_off;
  if (w.c >= geo.row) {
    w.c -= geo.row;
    w.g += geo.wrap;
  }
}

// f(j, g) for the elements j = 0 .. 7 of the group at walk w, g the element's offset in the gate layout: element
// by element, the walk wraps at each row end.
template <class F>
GPUOPT_DEV void gated_each_element(GatedWalk w, const GatedGeometry& geo, const F& f) {
  int64_t c = w.c, g = w.g;
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    f(j, g);
    ++g;
    if (++c == geo.row) {
      c = 0;
      g += geo.wrap;
    }
  }
}

// The group of 8 elements at walk w, `valid` of them (the rest read as 0), from a gate-layout buffer.
template <bool kVec, typename S>
GPUOPT_DEV void gated_load(const S* __restrict__ base, GatedWalk w, int valid, const GatedGeometry& geo,
                           Group<S>& out) {
  if (kVec) {
    load_raw_group(base + w.g, kGroup, true, out);
  } else {
    gated_each_element(w, geo, [&](int j, int64_t g) { out.v[j] = j < valid ? base[g] : from_acc<S>(acc_t_of<S>(0)); });
  }
}

// The group's `valid` first elements of v at walk w, into a gate-layout buffer.
template <bool kVec, typename S, typename A>
GPUOPT_DEV void gated_store(S* __restrict__ base, GatedWalk w, int valid, const GatedGeometry& geo,
                            const A (&v)[kGroup]) {
  if (kVec) {
    store_group(base + w.g, kGroup, true, v);
  } else {
    gated_each_element(w, geo, [&](int j, int64_t g) {
      if (j < valid) base[g] = from_acc<S>(v[j]);
    });
  }
}

template <typename S>
struct GatedForwardParams {
  const S* gate;        // (M, F), or (M, 2F) packed [gate | up]
  const S* up;          // (M, F); packed: gate + F, row stride 2F
  const int64_t* seed;  // (1) the seed, or (4) a shard map [seed, base, period, jump]
  S* out;               // (M, F)
  GatedGeometry geo;
  acc_t_of<S> scale;
  uint32_t threshold;
};

template <typename S>
struct GatedBackwardParams {
  const S* grad_out;    // (M, F)
  const S* gate;        // (M, F), or (M, 2F) packed [gate | up]
  const S* up;          // (M, F); packed: gate + F, row stride 2F
  const int64_t* seed;  // (1) or (4), as the forward's
  S* grad_gate;         // the layout of gate: (M, F), or (M, 2F) packed [grad_gate | grad_up]
  S* grad_up;           // (M, F); packed: grad_gate + F
  GatedGeometry geo;
  acc_t_of<S> scale;
  uint32_t threshold;
};

// The dropout of the kernels compiled with kDrop (the launcher's choice for 0 < threshold <= 65536; p = 0 takes
// the kernels without RNG code, whose keep bits are all set and whose scale is 1). One Philox call a group, always
// (no run-time test of the threshold: p = 1 draws and drops everything), and one compare a lane: lane 2i keeps
// when (w_i & 0xffff) >= t, lane 2i + 1 when (w_i >> 16) >= t, i.e. w_i > t * 65536 - 1, which is 2^32 - 1 (never
// true) at p = 1. The bits of csrc/philox.h (dropout_uniform16) and DESIGN.md section 2.
struct GatedDropout {
  uint32_t k0, k1;   // the key: the seed's low and high words
  uint32_t t_lo;     // threshold t
  uint32_t t_hi_m1;  // t * 65536 - 1 (t >= 1)

  GPUOPT_DEV GatedDropout(const int64_t* __restrict__ seed, uint32_t threshold)
      : t_lo(threshold), t_hi_m1(static_cast<uint32_t>((uint64_t(threshold) << 16) - 1u)) {
    const uint64_t s = static_cast<uint64_t>(read_seed(seed, threshold));  // not read at p = 1 (all dropped)
    k0 = static_cast<uint32_t>(s);
    k1 = static_cast<uint32_t>(s >> 32);
  }

  GPUOPT_DEV void keep(int64_t group, bool (&out)[kGroup]) const {
    const uint64_t g = static_cast<uint64_t>(group);
    const Philox4x32 r = philox4x32_10(static_cast<uint32_t>(g), static_cast<uint32_t>(g >> 32), 0u, 0u, k0, k1);
#pragma unroll
    for (int i = 0; i < kGroup / 2; ++i) {
      out[2 * i] = (r.w[i] & 0xffffu) >= t_lo;
      out[2 * i + 1] = r.w[i] > t_hi_m1;
    }
  }
};

// The keep bits of the output's group q (elements 8q .. 8q + 7; kDrop), or all set (p = 0: no RNG code in the
// kernel at all). Its Philox group is q, or with kMapped (the instances the launcher takes where the seed holds a
// shard map and the RNG runs; base, period and jump are multiples of 8, so the group stays whole)
// dropout_index(8q) / 8: the map's code and registers only in those instances.
template <bool kDrop, bool kMapped, class Params>
GPUOPT_DEV void gated_keep(const Params& p, const GatedDropout& drop, int64_t q, bool (&keep)[kGroup]) {
  if (kDrop) {
    drop.keep(kMapped ? dropout_index(p.seed, true, q * kGroup) / kGroup : q, keep);
  } else {
#pragma unroll
    for (int j = 0; j < kGroup; ++j) keep[j] = true;
  }
}

// One group of the forward: keep bits of the output's group q, gated_forward_element per element, the output at 8q.
template <int kAct, bool kVec, bool kDrop, bool kMapped, typename S>
GPUOPT_DEV void gated_forward_group(const GatedForwardParams<S>& p, const GatedDropout& drop, int64_t q, int valid,
                                    const Group<S>& gv, const Group<S>& uv) {
  using A = acc_t_of<S>;
  A ga[kGroup], ua[kGroup], o[kGroup];
  unpack_group(gv, ga);
  unpack_group(uv, ua);
  bool keep[kGroup];
  gated_keep<kDrop, kMapped>(p, drop, q, keep);
  const A scale = kDrop ? p.scale : A(1);  // p = 0: the scale is 1 exactly
#pragma unroll
  for (int j = 0; j < kGroup; ++j) o[j] = gated_forward_element<kAct, A>(ga[j], ua[j], keep[j], scale);
  store_group(p.out + q * kGroup, valid, kVec, o);
}

// The elements of group q to read and write: 8 on the vector path (whole groups only), else those before n.
template <bool kVec>
GPUOPT_DEV int gated_valid(int64_t q, const GatedGeometry& geo) {
  return kVec ? kGroup : static_cast<int>(min64(kGroup, geo.n - q * kGroup));
}

// The walk both kernels share (the header's comment): thread t takes groups t, t + T, ... (T threads in the grid),
// U a grid stride: load(u, q, valid, w) reads group q (`valid` elements, at walk w) into the caller's slot u for
// each of the U groups before work(u, q, valid, w) uses a slot. Then, with kVec and n % 8 != 0, the grid's last
// thread takes the flat problem's last, partial group element by element: tail(q, valid, w).
template <int U, bool kVec, class Load, class Work, class Tail>
GPUOPT_DEV void gated_for_each_group(const GatedGeometry& geo, const Load& load, const Work& work, const Tail& tail) {
  const int64_t T = int64_t(gridDim.x) * blockDim.x;
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups = kVec ? geo.n / kGroup : ceil_div(geo.n, kGroup);  // kVec: whole groups; the tail after
  GatedWalk w = gated_walk_at(t * kGroup, geo);
  for (int64_t q = t; q < groups; q += U * T) {
    GatedWalk wu[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t qu = q + u * T;
      wu[u] = w;
      if (qu < groups) load(u, qu, gated_valid<kVec>(qu, geo), w);
      gated_walk_step(w, geo);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t qu = q + u * T;
      if (qu < groups) work(u, qu, gated_valid<kVec>(qu, geo), wu[u]);
    }
  }
  if (kVec && geo.n % kGroup != 0 && t == T - 1) {
    tail(groups, static_cast<int>(geo.n - groups * kGroup), gated_walk_at(groups * kGroup, geo));
  }
}

template <typename S, int kAct, bool kVec, bool kDrop, bool kMapped>
GPUOPT_DEV void gated_act_forward(const GatedForwardParams<S>& p) {
  constexpr int U = cuda::gated_unroll(sizeof(S), kVec);
  const GatedDropout drop(p.seed, p.threshold);  // kDrop false: unused, no code
  Group<S> gv[U], uv[U];
  gated_for_each_group<U, kVec>(
      p.geo,
      [&](int u, int64_t, int valid, GatedWalk w) {
        gated_load<kVec>(p.gate, w, valid, p.geo, gv[u]);
        gated_load<kVec>(p.up, w, valid, p.geo, uv[u]);
      },
      [&](int u, int64_t q, int valid, GatedWalk) {
        gated_forward_group<kAct, kVec, kDrop, kMapped>(p, drop, q, valid, gv[u], uv[u]);
      },
      [&](int64_t q, int valid, GatedWalk w) {
        Group<S> g, v;
        gated_load<false>(p.gate, w, valid, p.geo, g);
        gated_load<false>(p.up, w, valid, p.geo, v);
        gated_forward_group<kAct, false, kDrop, kMapped>(p, drop, q, valid, g, v);
      });
}

// One group of the backward: gated_backward_element per element; grad_gate and grad_up at the walk's offsets.
template <int kAct, bool kVec, bool kDrop, bool kMapped, typename S>
GPUOPT_DEV void gated_backward_group(const GatedBackwardParams<S>& p, const GatedDropout& drop, int64_t q, GatedWalk w,
                                     int valid, const Group<S>& dv, const Group<S>& gv, const Group<S>& uv) {
  using A = acc_t_of<S>;
  A da[kGroup], ga[kGroup], ua[kGroup], dg[kGroup], du[kGroup];
  unpack_group(dv, da);
  unpack_group(gv, ga);
  unpack_group(uv, ua);
  bool keep[kGroup];
  gated_keep<kDrop, kMapped>(p, drop, q, keep);
  const A scale = kDrop ? p.scale : A(1);
#pragma unroll
  for (int j = 0; j < kGroup; ++j) gated_backward_element<kAct, A>(da[j], ga[j], ua[j], keep[j], scale, dg[j], du[j]);
  gated_store<kVec>(p.grad_gate, w, valid, p.geo, dg);
  gated_store<kVec>(p.grad_up, w, valid, p.geo, du);
}

template <typename S, int kAct, bool kVec, bool kDrop, bool kMapped>
GPUOPT_DEV void gated_act_backward(const GatedBackwardParams<S>& p) {
  constexpr int U = cuda::gated_unroll(sizeof(S), kVec);
  const GatedDropout drop(p.seed, p.threshold);
  Group<S> dv[U], gv[U], uv[U];
  gated_for_each_group<U, kVec>(
      p.geo,
      [&](int u, int64_t q, int valid, GatedWalk w) {
        load_raw_group(p.grad_out + q * kGroup, valid, kVec, dv[u]);
        gated_load<kVec>(p.gate, w, valid, p.geo, gv[u]);
        gated_load<kVec>(p.up, w, valid, p.geo, uv[u]);
      },
      [&](int u, int64_t q, int valid, GatedWalk w) {
        gated_backward_group<kAct, kVec, kDrop, kMapped>(p, drop, q, w, valid, dv[u], gv[u], uv[u]);
      },
      [&](int64_t q, int valid, GatedWalk w) {
        Group<S> d, g, v;
        load_raw_group(p.grad_out + q * kGroup, valid, false, d);
        gated_load<false>(p.gate, w, valid, p.geo, g);
        gated_load<false>(p.up, w, valid, p.geo, v);
        gated_backward_group<kAct, false, kDrop, kMapped>(p, drop, q, w, valid, d, g, v);
      });
}

// out = dropout(act(gate) * up); backward: grad_gate = dropout'(grad_out) * up * act'(gate),
// grad_up = dropout'(grad_out) * act(gate) (gated_backward_element), dropout' applying the same keep bits and scale.
template <typename S, int kAct, bool kVec, bool kDrop>
__global__ void __launch_bounds__(cuda::kGatedThreads) gated_act_forward_kernel(GatedForwardParams<S> p) {
  gated_act_forward<S, kAct, kVec, kDrop, false>(p);
}

template <typename S, int kAct, bool kVec, bool kDrop>
__global__ void __launch_bounds__(cuda::kGatedThreads) gated_act_backward_kernel(GatedBackwardParams<S> p) {
  gated_act_backward<S, kAct, kVec, kDrop, false>(p);
}

// The instances of a seed holding a shard map (with dropout whose RNG reads it): the same bodies, their groups'
// Philox groups numbered by the map (gated_keep), in kernels of their own, so the 1-element seed's instances keep
// their code and registers.
template <typename S, int kAct, bool kVec>
__global__ void __launch_bounds__(cuda::kGatedThreads) gated_act_forward_mapped_kernel(GatedForwardParams<S> p) {
  gated_act_forward<S, kAct, kVec, true, true>(p);
}

template <typename S, int kAct, bool kVec>
__global__ void __launch_bounds__(cuda::kGatedThreads) gated_act_backward_mapped_kernel(GatedBackwardParams<S> p) {
  gated_act_backward<S, kAct, kVec, true, true>(p);
}

}  // namespace dev
}  // namespace gpuopt
