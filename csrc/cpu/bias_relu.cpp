// C++ CPU kernels of bias_relu and its backward (dbias fused into the same pass, deterministic).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "checks.h"
#include "cpu/row_blocks.h"
#include "dispatch.h"

namespace gpuopt {
namespace {

template <typename scalar_t, typename bias_t>
void bias_relu_kernel(const BiasReluArgs& a, at::Tensor& out) {
  using acc_t = acc_type_t<scalar_t>;
  const int64_t M = a.M, N = a.N;
  const scalar_t* x = a.x.data_ptr<scalar_t>();
  scalar_t* y = out.data_ptr<scalar_t>();
  std::vector<acc_t> b(N);
  const bias_t* bp = a.bias.data_ptr<bias_t>();
  for (int64_t j = 0; j < N; ++j) b[j] = static_cast<acc_t>(bp[j]);
  at::parallel_for(0, M, std::max<int64_t>(1, 32768 / N), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t* xr = x + r * N;
      scalar_t* yr = y + r * N;
      for (int64_t j = 0; j < N; ++j) {
        yr[j] = static_cast<scalar_t>(bias_relu_forward_element<acc_t>(static_cast<acc_t>(xr[j]), b[j]));
      }
    }
  });
}

template <typename scalar_t>
void bias_relu_backward_kernel(const BiasReluBackwardArgs& a, at::Tensor& grad_x, at::Tensor& grad_b) {
  using acc_t = acc_type_t<scalar_t>;
  const int64_t M = a.M, N = a.N;
  const scalar_t* g = a.grad_out.data_ptr<scalar_t>();
  const scalar_t* o = a.out.data_ptr<scalar_t>();
  scalar_t* dx = grad_x.data_ptr<scalar_t>();
  const RowBlocks rb(M);
  const int64_t blocks = rb.blocks;
  std::vector<acc_t> partial(blocks * N, acc_t(0));
  at::parallel_for(0, blocks, 1, [&](int64_t blk_begin, int64_t blk_end) {
    for (int64_t blk = blk_begin; blk < blk_end; ++blk) {
      acc_t* pb = partial.data() + blk * N;
      for (int64_t r = rb.begin(blk); r < rb.end(blk, M); ++r) {
        const scalar_t* gr = g + r * N;
        const scalar_t* orow = o + r * N;
        scalar_t* dxr = dx + r * N;
        for (int64_t j = 0; j < N; ++j) {
          const acc_t d = bias_relu_backward_element<acc_t>(static_cast<acc_t>(gr[j]), static_cast<acc_t>(orow[j]));
          dxr[j] = static_cast<scalar_t>(d);
          pb[j] += d;
        }
      }
    }
  });
  sum_partials(partial, blocks, N, grad_b.data_ptr<scalar_t>());
}

at::Tensor bias_relu_cpu(const at::Tensor& x, const at::Tensor& bias) {
  BiasReluArgs a = check_bias_relu(x, bias);
  at::Tensor out = at::empty(x.sizes(), a.x.options());
  if (a.M == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "bias_relu_cpu", [&] {
    if (a.bias.scalar_type() == at::kFloat) {
      bias_relu_kernel<scalar_t, float>(a, out);
    } else {
      bias_relu_kernel<scalar_t, scalar_t>(a, out);
    }
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> bias_relu_backward_cpu(const at::Tensor& grad_out, const at::Tensor& out) {
  BiasReluBackwardArgs a = check_bias_relu_backward(grad_out, out);
  at::Tensor grad_x = at::empty(out.sizes(), a.out.options());
  at::Tensor grad_b = at::zeros({a.N}, a.out.options());
  if (a.M == 0) return {grad_x, grad_b};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.out.scalar_type(), "bias_relu_backward_cpu",
                                  [&] { bias_relu_backward_kernel<scalar_t>(a, grad_x, grad_b); });
  return {grad_x, grad_b};
}

}  // namespace

TORCH_LIBRARY_IMPL(gpuopt, CPU, m) {
  m.impl("bias_relu", &bias_relu_cpu);
  m.impl("bias_relu_backward", &bias_relu_backward_cpu);
}

}  // namespace gpuopt
