// C++ CPU kernels of gated_act and its backward (DESIGN.md section 1): out = dropout(act(gate) * up), from two
// tensors or one [gate | up] tensor. The output is cut into tiles of consecutive elements (its linear index, the
// dropout index); a tile draws its dropout uniforms in one call and is processed in spans that are contiguous in
// every operand: the whole tile for two tensors, the pieces of rows for the packed layout. fp32 / bf16 / fp16 spans
// go through the vectorized row loops of cpu/row_kernels.h (16-bit ones converted once each way); fp64 through
// fused_math.h's element functions. No sums: every element is written once, so nothing depends on the threads.

#include <algorithm>
#include <tuple>
#include <type_traits>
#include <vector>

#include "checks.h"
#include "cpu/dropout_mask.h"
#include "cpu/huge_pages.h"
#include "cpu/op_entry.h"
#include "cpu/row_blocks.h"
#include "cpu/row_io.h"
#include "cpu/row_kernels.h"
#include "dtypes.h"
#include "torch_stable.h"

namespace gpuopt {
namespace {

constexpr int64_t kTile = 8192;  // output elements a tile: ~32 KB of fp32 per operand, so a tile stays in L2

// The spans of output elements [e0, e1): calls body(e, len, in_off) where e is the first output index of a run
// that is contiguous in every operand, len its length and in_off the offset of its gate elements in the input
// (packed: row r = e / F starts at r * 2F in gate, up F further on; two tensors: in_off = e).
template <typename Body>
void for_each_span(int64_t e0, int64_t e1, int64_t F, bool packed, const Body& body) {
  if (!packed) {
    body(e0, e1 - e0, e0);
    return;
  }
  for (int64_t e = e0; e < e1;) {
    const int64_t r = e / F, c = e - r * F;
    const int64_t len = std::min(e1 - e, F - c);
    body(e, len, r * 2 * F + c);
    e += len;
  }
}

// Every span of the output, tile by tile on torch's threads: body(buffers, e, len, o, u) with the span as
// for_each_span gives it and u its dropout uniforms (nullptr at p = 0). Each thread makes its fp32 buffers once
// (`count` rows of kTile for 16-bit / fp32 data, none for fp64), before its first tile.
template <typename scalar_t, typename Body>
void gated_tiles(const GatedSpec& a, const DropoutSeed& seed, int count, const Body& body) {
  constexpr bool kFp32 = std::is_same_v<acc_type_t<scalar_t>, float>;
  const int64_t total = a.M * a.F;
  const bool dropping = a.dropout.active();
  parallel_tiles((total + kTile - 1) / kTile, [&](const auto& take) {
    std::vector<std::vector<float>> bufs(count, std::vector<float>(kFp32 ? kTile : 0));
    std::vector<uint16_t> rnd(dropping ? dropout_uniforms_capacity(kTile) : 0);
    for (int64_t t; (t = take()) * kTile < total;) {
      const int64_t e0 = t * kTile, e1 = std::min(total, e0 + kTile);
      const uint16_t* u = dropping ? dropout_uniforms_run(seed, e0, e1 - e0, rnd.data()) : nullptr;
      for_each_span(e0, e1, a.F, a.packed(),
                    [&](int64_t e, int64_t len, int64_t o) { body(bufs, e, len, o, u ? u + (e - e0) : nullptr); });
    }
  });
}

template <typename scalar_t>
void gated_forward_kernel(const GatedSpec& a, const DropoutSeed& seed, Tensor& out_t) {
  using acc_t = acc_type_t<scalar_t>;
  const scalar_t* gate = data_as<const scalar_t>(a.gate);
  const scalar_t* up = a.packed() ? gate + a.F : data_as<const scalar_t>(a.up);  // up of gate offset o: up[o]
  scalar_t* out = data_as<scalar_t>(out_t);
  const DropoutParams drop = a.dropout;
  gated_tiles<scalar_t>(a, seed, 3, [&](auto& bufs, int64_t e, int64_t len, int64_t o, const uint16_t* us) {
    if constexpr (std::is_same_v<acc_t, float>) {
      const float* gf = load_row(gate + o, bufs[0].data(), len);
      const float* vf = load_row(up + o, bufs[1].data(), len);
      float* of = result_row(out + e, bufs[2].data());
      cpu::gated_forward_row(a.act, gf, vf, us, drop.threshold, static_cast<float>(drop.scale), of, len);
      store_row(out + e, of, len);
    } else {
      dispatch_act(a.act, [&](auto ac) {
        for (int64_t j = 0; j < len; ++j) {
          const bool keep = us == nullptr || dropout_keep(us[j], drop.threshold);
          out[e + j] =
              gated_forward_element<decltype(ac)::value, acc_t>(gate[o + j], up[o + j], keep, acc_t(drop.scale));
        }
      });
    }
  });
}

template <typename scalar_t>
void gated_backward_kernel(const GatedSpec& a, const DropoutSeed& seed, Tensor& grad_gate_t, Tensor& grad_up_t) {
  using acc_t = acc_type_t<scalar_t>;
  const scalar_t* go = data_as<const scalar_t>(a.grad_out);
  const scalar_t* gate = data_as<const scalar_t>(a.gate);
  const scalar_t* up = a.packed() ? gate + a.F : data_as<const scalar_t>(a.up);
  scalar_t* dg = data_as<scalar_t>(grad_gate_t);
  scalar_t* du = a.packed() ? dg + a.F : data_as<scalar_t>(grad_up_t);
  const DropoutParams drop = a.dropout;
  gated_tiles<scalar_t>(a, seed, 5, [&](auto& bufs, int64_t e, int64_t len, int64_t o, const uint16_t* us) {
    if constexpr (std::is_same_v<acc_t, float>) {
      const float* of = load_row(go + e, bufs[0].data(), len);
      const float* gf = load_row(gate + o, bufs[1].data(), len);
      const float* vf = load_row(up + o, bufs[2].data(), len);
      float* dgf = result_row(dg + o, bufs[3].data());
      float* duf = result_row(du + o, bufs[4].data());
      cpu::gated_backward_row(a.act, of, gf, vf, us, drop.threshold, static_cast<float>(drop.scale), dgf, duf, len);
      store_row(dg + o, dgf, len);
      store_row(du + o, duf, len);
    } else {
      dispatch_act(a.act, [&](auto ac) {
        for (int64_t j = 0; j < len; ++j) {
          const bool keep = us == nullptr || dropout_keep(us[j], drop.threshold);
          acc_t dgate, dup;
          gated_backward_element<decltype(ac)::value, acc_t>(go[e + j], gate[o + j], up[o + j], keep, acc_t(drop.scale),
                                                             dgate, dup);
          dg[o + j] = dgate;
          du[o + j] = dup;
        }
      });
    }
  });
}

Tensor gated_forward_cpu(const GatedSpec& a) {
  std::vector<int64_t> shape(a.gate.sizes().begin(), a.gate.sizes().end());
  shape.back() = a.F;
  Tensor out = empty_on(a.gate, shape, a.dtype);
  if (a.M == 0) return out;
  cpu::advise_huge_pages(out);
  const DropoutSeed s = read_dropout_seed(a.dropout, a.seed);
  dispatch_dtype<HostStorage>(a.dtype, [&](auto st) { gated_forward_kernel<typename decltype(st)::type>(a, s, out); });
  return out;
}

std::tuple<Tensor, Tensor> gated_backward_cpu(const GatedSpec& a) {
  Tensor grad_gate = empty_on(a.gate, a.gate.sizes(), a.dtype);
  Tensor grad_up = a.packed() ? empty_on(a.gate, {0}, a.dtype) : empty_on(a.gate, a.gate.sizes(), a.dtype);
  if (a.M == 0) return {grad_gate, grad_up};
  cpu::advise_huge_pages(grad_gate);
  if (!a.packed()) cpu::advise_huge_pages(grad_up);
  const DropoutSeed s = read_dropout_seed(a.dropout, a.seed);
  dispatch_dtype<HostStorage>(
      a.dtype, [&](auto st) { gated_backward_kernel<typename decltype(st)::type>(a, s, grad_gate, grad_up); });
  return {grad_gate, grad_up};
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(gpuopt, CPU, m) {
  CpuOp<&gated_forward_cpu, &gated_backward_cpu>::impl<&check_gated_act, &check_gated_act_backward>(
      m, "gated_act", "gated_act_backward");
}

}  // namespace gpuopt
