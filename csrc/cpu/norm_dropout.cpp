// C++ CPU kernels of layer_norm_dropout_relu and norm_dropout (LayerNorm or RMSNorm, then dropout, then ReLU or
// nothing: the same loops with two flags) and their backwards, fp32 accumulation (fp64 for fp64 x).
// fp32/bf16/fp16 inputs run the vectorized fp32 row kernels of cpu/row_kernels.h: forward = one pass for the
// statistics (plus one over the row while it is in L1) and one for the output; backward = one pass for xhat, dy
// and the dgamma/dbeta partials, one for dx. The dropout uniforms come from cpu/dropout_mask.h (8 or 16 Philox
// calls side by side with AVX2 / AVX-512), computed once per tile of rows. Rows are handed to torch's intra-op
// threads in tiles, dynamically (row_blocks.h parallel_tiles); the backward's tiles are the fixed row blocks of
// the deterministic dgamma/dbeta reduction, so no result depends on the thread count. fp64 keeps the generic
// template loops (the gradcheck path). Per-element formulas: fused_math.h, shared with the CUDA kernels.

#include <algorithm>
#include <array>
#include <cmath>
#include <tuple>
#include <type_traits>
#include <vector>

#include "checks.h"
#include "cpu/dropout_mask.h"
#include "cpu/op_entry.h"
#include "cpu/row_blocks.h"
#include "cpu/row_io.h"
#include "cpu/row_kernels.h"
#include "dtypes.h"
#include "torch_stable.h"

namespace gpuopt {
namespace {

template <typename acc_t>
acc_t row_sum(const acc_t* v, int64_t n) {
  return sum4<acc_t>(n, [v](int64_t j) { return v[j]; });
}

template <typename acc_t>
acc_t row_dot(const acc_t* u, const acc_t* v, int64_t n) {
  return sum4<acc_t>(n, [u, v](int64_t j) { return u[j] * v[j]; });
}

// Two-pass statistics of a row already in acc_t: exact variance, not E[x^2] - E[x]^2.
template <typename acc_t>
void row_stats(const acc_t* v, int64_t n, double eps, acc_t& mean, acc_t& rstd) {
  mean = row_sum(v, n) / static_cast<acc_t>(n);
  const acc_t m = mean;
  const acc_t var = sum4<acc_t>(n,
                                [v, m](int64_t j) {
                                  const acc_t d = v[j] - m;
                                  return d * d;
                                }) /
                    static_cast<acc_t>(n);
  rstd = acc_t(1) / std::sqrt(var + static_cast<acc_t>(eps));
}

// ------------------------------------------------------------------------------------------ fp32 fast path
// Rows are read as fp32 (cpu/row_io.h: fp32 rows in place, bf16/fp16 rows through a per-thread buffer).

template <typename scalar_t, typename param_t>
void nd_forward_fp32(TypeTag<scalar_t>, TypeTag<param_t>, const DropoutSeed& seed, const NormSpec& a, Tensor& out,
                     Tensor& mean, Tensor& rstd) {
  const int64_t M = a.M, N = a.N;
  const scalar_t* x = data_as<scalar_t>(a.x);
  scalar_t* y_out = data_as<scalar_t>(out);
  float* mean_out = data_as<float>(mean);
  float* rstd_out = data_as<float>(rstd);
  const std::vector<float> w = param_row<float, param_t>(a.weight, N, 1.0f);
  const std::vector<float> b = param_row<float, param_t>(a.bias, N, 0.0f);
  const RowDropout<float> drop(a.dropout);
  const float inv_n = 1.0f / static_cast<float>(N);

  auto scratch = [&] {  // x and out rows in fp32 (none for fp32 data)
    return std::array<std::vector<float>, 2>{staging_row<scalar_t>(N), staging_row<scalar_t>(N)};
  };
  run_row_tiles(M, N, seed, drop.active, scratch, [&](auto& bufs, int64_t r, const uint16_t* u) {
    auto& [xbuf, ybuf] = bufs;
    const float* xr = load_row(x + r * N, xbuf.data(), N);
    const float mu = a.rms ? 0.0f : cpu::row_sum(xr, N) * inv_n;  // RMSNorm: the mean square about 0
    const float var = cpu::row_sq_dev_sum(xr, N, mu) * inv_n;
    const float rs = 1.0f / std::sqrt(var + static_cast<float>(a.eps));
    if (!a.rms) mean_out[r] = mu;
    rstd_out[r] = rs;
    float* yr = result_row(y_out + r * N, ybuf.data());
    cpu::nd_forward_row(xr, w.data(), b.data(), u, drop.threshold, drop.scale, mu, rs, yr, N, a.relu);
    store_row(y_out + r * N, yr, N);
  });
}

template <typename scalar_t, typename param_t>
void nd_backward_fp32(TypeTag<scalar_t>, TypeTag<param_t>, const DropoutSeed& seed, const NormSpec& a, Tensor& grad_x,
                      Tensor& grad_w, Tensor& grad_b) {
  const int64_t M = a.M, N = a.N;
  const scalar_t* x = data_as<scalar_t>(a.x);
  const scalar_t* g = data_as<scalar_t>(a.grad_out);
  const float* mean = data_as<float>(a.mean);
  const float* rstd = data_as<float>(a.rstd);
  scalar_t* dx = data_as<scalar_t>(grad_x);
  const std::vector<float> w = param_row<float, param_t>(a.weight, N, 1.0f);
  const std::vector<float> b = param_row<float, param_t>(a.bias, N, 0.0f);
  const RowDropout<float> drop(a.dropout);
  const float inv_n = 1.0f / static_cast<float>(N);

  BlockPartials<float> partials(M, N);
  auto scratch = [&] {  // x, grad_out and grad_x rows in fp32 (none for fp32 data), xhat, dxhat
    return std::array<std::vector<float>, 5>{staging_row<scalar_t>(N), staging_row<scalar_t>(N),
                                             staging_row<scalar_t>(N), std::vector<float>(N), std::vector<float>(N)};
  };
  partials.run(seed, drop.active, scratch, [&](auto& bufs, int64_t r, const uint16_t* u, float* pw, float* pb) {
    auto& [xbuf, gbuf, dxbuf, xhat, dxhat] = bufs;
    const float* xr = load_row(x + r * N, xbuf.data(), N);
    const float* gr = load_row(g + r * N, gbuf.data(), N);
    const float rs = rstd[r];
    cpu::nd_backward_row_pass1(xr, gr, w.data(), b.data(), u, drop.threshold, drop.scale, a.rms ? 0.0f : mean[r], rs,
                               xhat.data(), dxhat.data(), pw, pb, N, a.relu);
    const float c1 = cpu::row_dot(dxhat.data(), xhat.data(), N) * inv_n;
    const float c2 = a.rms ? 0.0f : cpu::row_sum(dxhat.data(), N) * inv_n;
    float* dxr = result_row(dx + r * N, dxbuf.data());
    cpu::nd_backward_row_pass2(xhat.data(), dxhat.data(), rs, c1, c2, dxr, N);
    store_row(dx + r * N, dxr, N);
  });
  partials.template sum<param_t>(a.weight, a.bias, grad_w, grad_b);
}

// ------------------------------------------------------------------------------------------ generic (fp64) path
// The same rows and tiles as the fp32 path, on plain loops in acc_t (fused_math.h's element functions).

template <typename scalar_t, typename param_t>
void nd_forward_generic(TypeTag<scalar_t>, TypeTag<param_t>, const DropoutSeed& seed, const NormSpec& a, Tensor& out,
                        Tensor& mean, Tensor& rstd) {
  using acc_t = acc_type_t<scalar_t>;
  const int64_t M = a.M, N = a.N;
  const scalar_t* x = data_as<scalar_t>(a.x);
  scalar_t* y_out = data_as<scalar_t>(out);
  acc_t* mean_out = data_as<acc_t>(mean);
  acc_t* rstd_out = data_as<acc_t>(rstd);
  const std::vector<acc_t> w = param_row<acc_t, param_t>(a.weight, N, acc_t(1));
  const std::vector<acc_t> b = param_row<acc_t, param_t>(a.bias, N, acc_t(0));
  const RowDropout<acc_t> drop(a.dropout);

  auto scratch = [&] { return std::vector<acc_t>(N); };  // the row in acc_t
  run_row_tiles(M, N, seed, drop.active, scratch, [&](auto& row, int64_t r, const uint16_t* u) {
    const scalar_t* xr = x + r * N;
    for (int64_t j = 0; j < N; ++j) row[j] = static_cast<acc_t>(xr[j]);
    acc_t mu, rs;
    if (a.rms) {  // RMSNorm: rstd from the mean square, no mean
      mu = acc_t(0);
      rs = acc_t(1) / std::sqrt(row_dot(row.data(), row.data(), N) / static_cast<acc_t>(N) + static_cast<acc_t>(a.eps));
    } else {
      row_stats(row.data(), N, a.eps, mu, rs);
      mean_out[r] = mu;
    }
    rstd_out[r] = rs;
    scalar_t* yr = y_out + r * N;
    for (int64_t j = 0; j < N; ++j) {
      const acc_t y = (row[j] - mu) * rs * w[j] + b[j];
      yr[j] = static_cast<scalar_t>(nd_forward_element<acc_t>(y, drop.keep(u, j), drop.scale, a.relu));
    }
  });
}

template <typename scalar_t, typename param_t>
void nd_backward_generic(TypeTag<scalar_t>, TypeTag<param_t>, const DropoutSeed& seed, const NormSpec& a,
                         Tensor& grad_x, Tensor& grad_w, Tensor& grad_b) {
  using acc_t = acc_type_t<scalar_t>;
  const int64_t N = a.N;
  const scalar_t* x = data_as<scalar_t>(a.x);
  const scalar_t* g = data_as<scalar_t>(a.grad_out);
  const acc_t* mean = data_as<acc_t>(a.mean);
  const acc_t* rstd = data_as<acc_t>(a.rstd);
  scalar_t* dx = data_as<scalar_t>(grad_x);
  const std::vector<acc_t> w = param_row<acc_t, param_t>(a.weight, N, acc_t(1));
  const std::vector<acc_t> b = param_row<acc_t, param_t>(a.bias, N, acc_t(0));
  const RowDropout<acc_t> drop(a.dropout);
  const acc_t inv_n = acc_t(1) / static_cast<acc_t>(N);

  generic_backward_rows<acc_t, param_t>(
      a, seed, grad_w, grad_b, [&](acc_t* xhat, acc_t* dxhat, int64_t r, const uint16_t* u, acc_t* pw, acc_t* pb) {
        const scalar_t* xr = x + r * N;
        const scalar_t* gr = g + r * N;
        const acc_t mu = a.rms ? acc_t(0) : mean[r], rs = rstd[r];
        for (int64_t j = 0; j < N; ++j) {
          const acc_t xh = (static_cast<acc_t>(xr[j]) - mu) * rs;
          const acc_t y = xh * w[j] + b[j];
          const acc_t dy =
              nd_backward_element<acc_t>(static_cast<acc_t>(gr[j]), y, drop.keep(u, j), drop.scale, a.relu);
          xhat[j] = xh;
          dxhat[j] = dy * w[j];
          pw[j] += dy * xh;
          pb[j] += dy;
        }
        const acc_t c1 = row_dot(dxhat, xhat, N) * inv_n;
        const acc_t c2 = a.rms ? acc_t(0) : row_sum(dxhat, N) * inv_n;
        scalar_t* dxr = dx + r * N;
        for (int64_t j = 0; j < N; ++j) dxr[j] = static_cast<scalar_t>(rs * (dxhat[j] - xhat[j] * c1 - c2));
      });
}

// layer_norm_dropout_relu and norm_dropout (the norm and activation flags are in the spec): (out, mean, rstd).
std::tuple<Tensor, Tensor, Tensor> norm_forward_cpu(const NormSpec& a) {
  Tensor out = empty_on(a.x, a.x.sizes(), a.x_dtype);
  Tensor mean = empty_on(a.x, {a.rms ? 0 : a.M}, a.acc_dtype);
  Tensor rstd = empty_on(a.x, {a.M}, a.acc_dtype);
  run_rows_cpu(
      a, [&](const auto&... t) { nd_forward_generic(t..., a, out, mean, rstd); },
      [&](const auto&... t) { nd_forward_fp32(t..., a, out, mean, rstd); });
  return {out, mean, rstd};
}

// Their backwards: (grad_x, grad_weight, grad_bias), an absent parameter's gradient (0,)-shaped.
std::tuple<Tensor, Tensor, Tensor> norm_backward_cpu(const NormSpec& a) {
  Tensor grad_x = empty_on(a.x, a.x.sizes(), a.x_dtype);
  Tensor grad_w = param_grad_on(a.x, a.weight.defined(), a.N, a.param_dtype);
  Tensor grad_b = param_grad_on(a.x, a.bias.defined(), a.N, a.param_dtype);
  run_rows_cpu(
      a, [&](const auto&... t) { nd_backward_generic(t..., a, grad_x, grad_w, grad_b); },
      [&](const auto&... t) { nd_backward_fp32(t..., a, grad_x, grad_w, grad_b); });
  return {grad_x, grad_w, grad_b};
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(gpuopt, CPU, m) {
  using Norm = CpuOp<&norm_forward_cpu, &norm_backward_cpu>;  // the flags of norm_dropout are in the spec
  Norm::impl<&check_ldr_forward, &check_ldr_backward>(m, "layer_norm_dropout_relu", "layer_norm_dropout_relu_backward");
  Norm::impl<&check_norm_dropout, &check_norm_dropout_backward>(m, "norm_dropout", "norm_dropout_backward");
}

}  // namespace gpuopt
