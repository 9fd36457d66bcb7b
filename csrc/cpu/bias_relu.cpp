// C++ CPU kernels of bias_relu and its backward (dbias fused into the same pass, deterministic; returned in the
// accumulation dtype, so AMP's fp32 bias gets the unrounded sum: autograd casts it to the bias's dtype).

#include <algorithm>
#include <tuple>
#include <type_traits>
#include <vector>

#include "checks.h"
#include "cpu/row_blocks.h"
#include "cpu/row_kernels.h"
#include "dispatch.h"
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

template <typename scalar_t, typename bias_t>
void bias_relu_kernel(const BiasReluArgs& a, Tensor& out) {
  using acc_t = acc_type_t<scalar_t>;
  constexpr bool kFp32 = std::is_same_v<acc_t, float>;
  constexpr bool kDirect = std::is_same_v<scalar_t, float>;
  const int64_t M = a.M, N = a.N;
  const scalar_t* x = data_as<scalar_t>(a.x);
  scalar_t* y = data_as<scalar_t>(out);
  std::vector<acc_t> b(N);
  const bias_t* bp = data_as<bias_t>(a.bias);
  for (int64_t j = 0; j < N; ++j) b[j] = static_cast<acc_t>(bp[j]);
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
          if constexpr (kDirect) {
            cpu::bias_relu_row(xf, b.data(), yr, N);
          } else {
            cpu::bias_relu_row(xf, b.data(), ybuf.data(), N);
            cpu::from_float(ybuf.data(), yr, N);
          }
        } else {
          for (int64_t j = 0; j < N; ++j) {
            yr[j] = static_cast<scalar_t>(bias_relu_forward_element<acc_t>(static_cast<acc_t>(xr[j]), b[j]));
          }
        }
      }
    }
  });
}

template <typename scalar_t>
void bias_relu_backward_kernel(const BiasReluBackwardArgs& a, Tensor& grad_x, Tensor& grad_b) {
  using acc_t = acc_type_t<scalar_t>;
  constexpr bool kFp32 = std::is_same_v<acc_t, float>;
  constexpr bool kDirect = std::is_same_v<scalar_t, float>;
  const int64_t M = a.M, N = a.N;
  const scalar_t* g = data_as<scalar_t>(a.grad_out);
  const scalar_t* o = data_as<scalar_t>(a.out);
  scalar_t* dx = data_as<scalar_t>(grad_x);
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
          if constexpr (kDirect) {
            cpu::bias_relu_backward_row(gf, of, dxr, pb, N);
          } else {
            cpu::bias_relu_backward_row(gf, of, dbuf.data(), pb, N);
            cpu::from_float(dbuf.data(), dxr, N);
          }
        } else {
          for (int64_t j = 0; j < N; ++j) {
            const acc_t d = bias_relu_backward_element<acc_t>(static_cast<acc_t>(gr[j]), static_cast<acc_t>(orow[j]));
            dxr[j] = static_cast<scalar_t>(d);
            pb[j] += d;
          }
        }
      }
    }
  });
  sum_partials(partial, blocks, N, data_as<acc_t>(grad_b));
}

Tensor bias_relu_cpu(const Tensor& x, const Tensor& bias) {
  BiasReluArgs a = check_bias_relu(x, bias);
  Tensor out = empty_on(a.x, x.sizes(), x.scalar_type());
  if (a.M == 0) return out;
  dispatch_floating(a.x.scalar_type(), "bias_relu_cpu", [&](auto st) {
    using scalar_t = typename decltype(st)::type;
    if (a.bias.scalar_type() == kFloat) {
      bias_relu_kernel<scalar_t, float>(a, out);
    } else {
      bias_relu_kernel<scalar_t, scalar_t>(a, out);
    }
  });
  return out;
}

std::tuple<Tensor, Tensor> bias_relu_backward_cpu(const Tensor& grad_out, const Tensor& out) {
  BiasReluBackwardArgs a = check_bias_relu_backward(grad_out, out);
  Tensor grad_x = empty_on(a.out, out.sizes(), out.scalar_type());
  Tensor grad_b = zeros_on(a.out, {a.N}, a.acc_dtype);
  if (a.M == 0) return {grad_x, grad_b};
  dispatch_floating(a.out.scalar_type(), "bias_relu_backward_cpu",
                    [&](auto st) { bias_relu_backward_kernel<typename decltype(st)::type>(a, grad_x, grad_b); });
  return {grad_x, grad_b};
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(gpuopt, CPU, m) {
  m.impl("bias_relu", TORCH_BOX(&bias_relu_cpu));
  m.impl("bias_relu_backward", TORCH_BOX(&bias_relu_backward_cpu));
}

}  // namespace gpuopt
