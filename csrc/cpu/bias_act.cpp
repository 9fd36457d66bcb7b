// C++ CPU kernels of bias_relu / bias_act and their backwards (dbias fused into the same pass, deterministic;
// returned in the accumulation dtype, so AMP's fp32 bias gets the unrounded sum: autograd casts it to the bias's
// dtype). One template on the activation (fused_math.h's act codes): bias_relu is bias_act with act 0.

#include <algorithm>
#include <tuple>
#include <type_traits>
#include <vector>

#include "checks.h"
#include "cpu/huge_pages.h"
#include "cpu/op_entry.h"
#include "cpu/row_blocks.h"
#include "cpu/row_io.h"
#include "cpu/row_kernels.h"
#include "dtypes.h"
#include "torch_stable.h"

namespace gpuopt {
namespace {

// fp32 rows in place; bf16/fp16 rows through per-thread fp32 buffers (cpu/row_kernels.h); fp64 generic loops.
template <typename T>
const float* as_float_row(const T* src, float* buf, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    cpu::to_float(src, buf, n);
    return buf;
  }
}

template <int kAct, typename scalar_t, typename bias_t>
void bias_act_kernel(const BiasActSpec& a, Tensor& out) {
  using acc_t = acc_type_t<scalar_t>;
  constexpr bool kFp32 = std::is_same_v<acc_t, float>;
  constexpr bool kDirect = std::is_same_v<scalar_t, float>;
  const int64_t M = a.M, N = a.N;
  const scalar_t* x = data_as<scalar_t>(a.x);
  scalar_t* y = data_as<scalar_t>(out);
  const std::vector<acc_t> b = param_row<acc_t, bias_t>(a.bias, N, acc_t(0));
  const int64_t tile = std::max<int64_t>(1, 16384 / N);  // rows per scheduling tile
  parallel_tiles((M + tile - 1) / tile, [&](const auto& take) {
    std::vector<float> xbuf(kFp32 && !kDirect ? N : 0), ybuf(kFp32 && !kDirect ? N : 0);
    for (int64_t t; (t = take()) * tile < M;) {
      const int64_t end = std::min(M, (t + 1) * tile);
      for (int64_t r = t * tile; r < end; ++r) {
        const scalar_t* xr = x + r * N;
        scalar_t* yr = y + r * N;
        if constexpr (kFp32) {
          const float* xf = as_float_row(xr, xbuf.data(), N);
          float* yf = kDirect ? reinterpret_cast<float*>(yr) : ybuf.data();
          if constexpr (kAct == kActRelu) {
            cpu::bias_relu_row(xf, b.data(), yf, N);
          } else {
            cpu::bias_act_row(kAct, xf, b.data(), yf, N);
          }
          if constexpr (!kDirect) cpu::from_float(ybuf.data(), yr, N);
        } else {
          for (int64_t j = 0; j < N; ++j) {
            yr[j] = static_cast<scalar_t>(act_forward<kAct, acc_t>(static_cast<acc_t>(xr[j]) + b[j]));
          }
        }
      }
    }
  });
}

// saved: the output for relu (mask out > 0; bias unused), x for the others (z = x + bias recomputed).
template <int kAct, typename scalar_t, typename bias_t>
void bias_act_backward_kernel(const BiasActSpec& a, Tensor& grad_x, Tensor& grad_b) {
  using acc_t = acc_type_t<scalar_t>;
  constexpr bool kFp32 = std::is_same_v<acc_t, float>;
  constexpr bool kDirect = std::is_same_v<scalar_t, float>;
  const int64_t M = a.M, N = a.N;
  const scalar_t* g = data_as<scalar_t>(a.grad_out);
  const scalar_t* o = data_as<scalar_t>(a.saved);
  scalar_t* dx = data_as<scalar_t>(grad_x);
  std::vector<acc_t> b;  // relu reads no bias (its mask is the output's)
  if constexpr (kAct != kActRelu) b = param_row<acc_t, bias_t>(a.bias, N, acc_t(0));
  // deterministic dbias: fixed row blocks (a function of M only), partials summed in block order
  const RowBlocks rb(M);
  const int64_t blocks = rb.blocks;
  std::vector<acc_t> partial(blocks * N, acc_t(0));
  parallel_tiles(blocks, [&](const auto& take) {
    const int64_t nb = kFp32 && !kDirect ? N : 0;
    std::vector<float> gbuf(nb), obuf(nb), dbuf(nb);
    for (int64_t blk; (blk = take()) < blocks;) {
      acc_t* pb = partial.data() + blk * N;
      for (int64_t r = rb.begin(blk); r < rb.end(blk, M); ++r) {
        const scalar_t* gr = g + r * N;
        const scalar_t* orow = o + r * N;
        scalar_t* dxr = dx + r * N;
        if constexpr (kFp32) {
          const float* gf = as_float_row(gr, gbuf.data(), N);
          const float* of = as_float_row(orow, obuf.data(), N);
          float* df = kDirect ? reinterpret_cast<float*>(dxr) : dbuf.data();
          if constexpr (kAct == kActRelu) {
            cpu::bias_relu_backward_row(gf, of, df, pb, N);
          } else {
            cpu::bias_act_backward_row(kAct, gf, of, b.data(), df, pb, N);
          }
          if constexpr (!kDirect) cpu::from_float(dbuf.data(), dxr, N);
        } else {
          for (int64_t j = 0; j < N; ++j) {
            const acc_t d = act_backward_element<kAct, acc_t>(static_cast<acc_t>(gr[j]), static_cast<acc_t>(orow[j]),
                                                              kAct == kActRelu ? acc_t(0) : b[j]);
            dxr[j] = static_cast<scalar_t>(d);
            pb[j] += d;
          }
        }
      }
    }
  });
  sum_partials(partial, blocks, N, data_as<acc_t>(grad_b));
}

Tensor bias_act_forward_cpu(const BiasActSpec& a) {
  Tensor out = empty_on(a.x, a.x.sizes(), a.x_dtype);
  if (a.M == 0) return out;
  cpu::advise_huge_pages(out);
  dispatch_act(a.act, [&](auto ac) {
    dispatch_dtypes<HostStorage>(a.x_dtype, a.bias_dtype, [&](auto st, auto bt) {
      bias_act_kernel<decltype(ac)::value, typename decltype(st)::type, typename decltype(bt)::type>(a, out);
    });
  });
  return out;
}

std::tuple<Tensor, Tensor> bias_act_backward_cpu(const BiasActSpec& a) {
  Tensor grad_x = empty_on(a.saved, a.saved.sizes(), a.x_dtype);
  Tensor grad_b = zeros_on(a.saved, {a.N}, a.acc_dtype);
  if (a.M == 0) return {grad_x, grad_b};
  cpu::advise_huge_pages(grad_x);
  dispatch_act(a.act, [&](auto ac) {
    constexpr int kAct = decltype(ac)::value;
    // relu reads no bias: one instantiation (bias_t = scalar_t), whatever the bias's dtype
    const DType bias_dtype = kAct == kActRelu ? a.x_dtype : a.bias_dtype;
    dispatch_dtypes<HostStorage>(a.x_dtype, bias_dtype, [&](auto st, auto bt) {
      bias_act_backward_kernel<kAct, typename decltype(st)::type, typename decltype(bt)::type>(a, grad_x, grad_b);
    });
  });
  return {grad_x, grad_b};
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(gpuopt, CPU, m) {
  using BiasAct = CpuOp<&bias_act_forward_cpu, &bias_act_backward_cpu>;  // bias_relu is bias_act with act 0
  BiasAct::impl<&check_bias_relu, &check_bias_relu_backward>(m, "bias_relu", "bias_relu_backward");
  BiasAct::impl<&check_bias_act, &check_bias_act_backward>(m, "bias_act", "bias_act_backward");
}

}  // namespace gpuopt
