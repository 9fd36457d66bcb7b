// C++ CPU kernels of dropout_add_norm and its backward (DESIGN.md section 1): s = dropout(x) + residual, stored as
// `sum` in dtype S, then LayerNorm or RMSNorm of s as stored, in the accumulation dtype (fp32, fp64 for fp64 x).
// The dropout uniforms come from cpu/dropout_mask.h (the same Philox bits as layer_norm_dropout_relu at the same
// linear index). Backward: dS = norm backward of grad_out + grad_sum, grad_residual = dS, grad_x = dS * keep *
// scale; dgamma / dbeta are summed over the fixed row blocks of cpu/row_blocks.h, so no result depends on the
// thread count.

#include <algorithm>
#include <array>
#include <cmath>
#include <tuple>
#include <type_traits>
#include <vector>

#include "checks.h"
#include "cpu/dropout_mask.h"
#include "cpu/huge_pages.h"
#include "cpu/row_blocks.h"
#include "cpu/row_io.h"
#include "cpu/row_kernels.h"
#include "dtypes.h"
#include "torch_stable.h"

namespace gpuopt {
namespace {

// ------------------------------------------------------------------------------------------ fp32 fast path
// fp32 / bf16 / fp16 x: rows are handled in fp32 by the vectorized row kernels of cpu/row_kernels.h. fp32 rows are
// read and written in place; 16-bit rows go through per-thread fp32 buffers (converted once each way; cpu/row_io.h).

template <typename scalar_t, typename param_t, typename sum_t>
void dan_forward_fp32(const AddNormSpec& a, const DropoutSeed& seed, Tensor& out, Tensor& sum, Tensor& mean,
                      Tensor& rstd) {
  constexpr bool kDirectX = std::is_same_v<scalar_t, float>;
  constexpr bool kDirectS = std::is_same_v<sum_t, float>;
  const int64_t M = a.M, N = a.N;
  const scalar_t* x = data_as<const scalar_t>(a.x);
  const sum_t* res = a.residual.defined() ? data_as<const sum_t>(a.residual) : nullptr;
  scalar_t* y = data_as<scalar_t>(out);
  sum_t* s_out = data_as<sum_t>(sum);
  float* mean_out = a.rms ? nullptr : data_as<float>(mean);
  float* rstd_out = data_as<float>(rstd);
  const std::vector<float> w = param_row<float, param_t>(a.weight, N, 1.0f);
  const std::vector<float> b = param_row<float, param_t>(a.bias, N, 0.0f);
  const DropoutParams drop = a.dropout;
  const float scale = static_cast<float>(drop.scale);
  const bool dropping = drop.active();
  const float eps = static_cast<float>(a.eps);
  const float inv_n = 1.0f / static_cast<float>(N);
  const int64_t R = tile_rows(N);
  const int64_t tile = std::max<int64_t>(R, 16384 / N / R * R);  // rows per scheduling tile (~64 KB of fp32)

  parallel_tiles((M + tile - 1) / tile, [&](const auto& take) {
    std::vector<float> xbuf(kDirectX ? 0 : N), ybuf(kDirectX ? 0 : N), rbuf(kDirectS ? 0 : N), sbuf(N);
    RowUniforms uniforms(seed, dropping, N);
    for (int64_t t; (t = take()) * tile < M;) {
      uniforms.rows(t * tile, std::min(M, (t + 1) * tile), [&](int64_t r, const uint16_t* u) {
        const float* xr = load_row(x + r * N, xbuf.data(), N);
        const float* rr = res ? load_row(res + r * N, rbuf.data(), N) : nullptr;
        // s in fp32; an fp32 sum is written in place, a 16-bit one rounded once and read back as stored
        float* sr = kDirectS ? result_row(s_out + r * N, sbuf.data()) : sbuf.data();
        cpu::dan_sum_row(xr, rr, u, drop.threshold, scale, sr, N);
        if constexpr (!kDirectS) {
          cpu::from_float(sr, s_out + r * N, N);
          cpu::to_float(s_out + r * N, sr, N);
        }
        float mu = 0.0f, rs;
        if (a.rms) {
          rs = 1.0f / std::sqrt(cpu::row_dot(sr, sr, N) * inv_n + eps);
        } else {
          mu = cpu::row_sum(sr, N) * inv_n;
          rs = 1.0f / std::sqrt(cpu::row_sq_dev_sum(sr, N, mu) * inv_n + eps);
          mean_out[r] = mu;
        }
        rstd_out[r] = rs;
        float* yr = result_row(y + r * N, ybuf.data());
        cpu::norm_forward_row(sr, w.data(), b.data(), mu, rs, yr, N);
        store_row(y + r * N, yr, N);
      });
    }
  });
}

template <typename scalar_t, typename param_t, typename sum_t>
void dan_backward_fp32(const AddNormSpec& a, const DropoutSeed& seed, Tensor& grad_x, Tensor& grad_res, Tensor& grad_w,
                       Tensor& grad_b) {
  constexpr bool kDirectX = std::is_same_v<scalar_t, float>;
  constexpr bool kDirectS = std::is_same_v<sum_t, float>;
  const int64_t M = a.M, N = a.N;
  const scalar_t* g = data_as<const scalar_t>(a.grad_out);
  const sum_t* gsum = a.grad_sum.defined() ? data_as<const sum_t>(a.grad_sum) : nullptr;
  const sum_t* s = data_as<const sum_t>(a.sum);
  const float* mean = a.rms ? nullptr : data_as<const float>(a.mean);
  const float* rstd = data_as<const float>(a.rstd);
  scalar_t* dx = data_as<scalar_t>(grad_x);
  sum_t* dres = a.has_residual ? data_as<sum_t>(grad_res) : nullptr;
  const std::vector<float> w = param_row<float, param_t>(a.weight, N, 1.0f);
  const std::vector<float> zeros(gsum ? 0 : N, 0.0f);
  const DropoutParams drop = a.dropout;
  const float scale = static_cast<float>(drop.scale);
  const bool dropping = drop.active();
  const float inv_n = 1.0f / static_cast<float>(N);

  BlockPartials partials(M, N);
  auto scratch = [&] {  // sum, grad_out, grad_sum, grad_x and grad_residual rows in fp32 (none in place), xhat, dxhat
    const int64_t ns = kDirectS ? 0 : N, nx = kDirectX ? 0 : N;
    return std::array<std::vector<float>, 7>{std::vector<float>(ns),
                                             std::vector<float>(nx),
                                             std::vector<float>(ns),
                                             std::vector<float>(nx),
                                             std::vector<float>(kDirectS && dres ? 0 : N),
                                             std::vector<float>(N),
                                             std::vector<float>(N)};
  };
  partials.run(seed, dropping, scratch, [&](auto& bufs, int64_t r, const uint16_t* u, float* pw, float* pb) {
    auto& [sbuf, gbuf, gsbuf, dxbuf, drbuf, xhat, dxhat] = bufs;
    const float* sr = load_row(s + r * N, sbuf.data(), N);
    const float* gr = load_row(g + r * N, gbuf.data(), N);
    const float mu = a.rms ? 0.0f : mean[r];
    const float rs = rstd[r];
    cpu::norm_backward_row_pass1(sr, gr, w.data(), mu, rs, xhat.data(), dxhat.data(), pw, pb, N);
    const float c1 = cpu::row_dot(dxhat.data(), xhat.data(), N) * inv_n;
    const float c2 = a.rms ? 0.0f : cpu::row_sum(dxhat.data(), N) * inv_n;
    const float* gsr = gsum ? load_row(gsum + r * N, gsbuf.data(), N) : zeros.data();
    float* drr = dres ? result_row(dres + r * N, drbuf.data()) : drbuf.data();
    float* dxr = result_row(dx + r * N, dxbuf.data());
    cpu::dan_backward_row_pass2(xhat.data(), dxhat.data(), gsr, u, drop.threshold, scale, rs, c1, c2, drr, dxr, N);
    if (dres) store_row(dres + r * N, drr, N);
    store_row(dx + r * N, dxr, N);
  });
  partials.sum<param_t>(a.weight, a.bias, grad_w, grad_b);
}

// ------------------------------------------------------------------------------------------ generic (fp64) path
template <typename scalar_t, typename param_t, typename sum_t, typename acc_t>
void dan_forward_generic(const AddNormSpec& a, const DropoutSeed& seed, Tensor& out, Tensor& sum, Tensor& mean,
                         Tensor& rstd) {
  const int64_t M = a.M, N = a.N;
  const scalar_t* x = data_as<const scalar_t>(a.x);
  const sum_t* res = a.residual.defined() ? data_as<const sum_t>(a.residual) : nullptr;
  scalar_t* y = data_as<scalar_t>(out);
  sum_t* s_out = data_as<sum_t>(sum);
  acc_t* mean_out = a.rms ? nullptr : data_as<acc_t>(mean);
  acc_t* rstd_out = data_as<acc_t>(rstd);
  const std::vector<acc_t> w = param_row<acc_t, param_t>(a.weight, N, acc_t(1));
  const std::vector<acc_t> b = param_row<acc_t, param_t>(a.bias, N, acc_t(0));
  const DropoutParams drop = a.dropout;
  const acc_t scale = static_cast<acc_t>(drop.scale);
  const acc_t eps = static_cast<acc_t>(a.eps);
  const acc_t inv_n = acc_t(1) / static_cast<acc_t>(N);
  const int64_t grain = std::max<int64_t>(1, 32768 / N);

  torch::stable::parallel_for(0, M, grain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> row(N);
    std::vector<uint8_t> keep(N, 1);
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t* xr = x + r * N;
      sum_t* sr = s_out + r * N;
      if (drop.active()) dropout_keep_run(seed, r * N, N, drop.threshold, keep.data());
      for (int64_t j = 0; j < N; ++j) {
        const acc_t xv = static_cast<acc_t>(xr[j]);
        const acc_t d = drop.active() ? (keep[j] ? xv * scale : acc_t(0)) : xv;
        // no residual: s = d itself (d + 0 would turn -0 into +0; sum must equal x bit for bit at p = 0)
        const acc_t s = res ? d + static_cast<acc_t>(res[r * N + j]) : d;
        sr[j] = static_cast<sum_t>(s);
        row[j] = static_cast<acc_t>(sr[j]);  // the norm reads s as stored
      }
      acc_t mu = 0, rs;
      if (a.rms) {
        const acc_t ms = sum4<acc_t>(N, [&](int64_t j) { return row[j] * row[j]; }) * inv_n;
        rs = acc_t(1) / std::sqrt(ms + eps);
      } else {
        mu = sum4<acc_t>(N, [&](int64_t j) { return row[j]; }) * inv_n;
        const acc_t var = sum4<acc_t>(N,
                                      [&](int64_t j) {
                                        const acc_t dv = row[j] - mu;
                                        return dv * dv;
                                      }) *
                          inv_n;
        rs = acc_t(1) / std::sqrt(var + eps);
        mean_out[r] = mu;
      }
      rstd_out[r] = rs;
      scalar_t* yr = y + r * N;
      for (int64_t j = 0; j < N; ++j) yr[j] = static_cast<scalar_t>((row[j] - mu) * rs * w[j] + b[j]);
    }
  });
}

template <typename scalar_t, typename param_t, typename sum_t, typename acc_t>
void dan_backward_generic(const AddNormSpec& a, const DropoutSeed& seed, Tensor& grad_x, Tensor& grad_res,
                          Tensor& grad_w, Tensor& grad_b) {
  const int64_t M = a.M, N = a.N;
  const scalar_t* g = data_as<const scalar_t>(a.grad_out);
  const sum_t* gsum = a.grad_sum.defined() ? data_as<const sum_t>(a.grad_sum) : nullptr;
  const sum_t* s = data_as<const sum_t>(a.sum);
  const acc_t* mean = a.rms ? nullptr : data_as<const acc_t>(a.mean);
  const acc_t* rstd = data_as<const acc_t>(a.rstd);
  scalar_t* dx = data_as<scalar_t>(grad_x);
  sum_t* dres = a.has_residual ? data_as<sum_t>(grad_res) : nullptr;
  const std::vector<acc_t> w = param_row<acc_t, param_t>(a.weight, N, acc_t(1));
  const DropoutParams drop = a.dropout;
  const acc_t scale = static_cast<acc_t>(drop.scale);
  const acc_t inv_n = acc_t(1) / static_cast<acc_t>(N);
  const bool want_dw = a.weight.defined(), want_db = a.bias.defined();

  const RowBlocks rb(M);
  const int64_t blocks = rb.blocks;
  std::vector<acc_t> partial_w(want_dw ? blocks * N : 0, acc_t(0));
  std::vector<acc_t> partial_b(want_db ? blocks * N : 0, acc_t(0));

  parallel_tiles(blocks, [&](const auto& take) {
    std::vector<acc_t> xhat(N), dxhat(N);
    std::vector<uint8_t> keep(N, 1);
    for (int64_t blk; (blk = take()) < blocks;) {
      acc_t* pw = want_dw ? partial_w.data() + blk * N : nullptr;
      acc_t* pb = want_db ? partial_b.data() + blk * N : nullptr;
      for (int64_t r = rb.begin(blk); r < rb.end(blk, M); ++r) {
        const acc_t mu = a.rms ? acc_t(0) : mean[r];
        const acc_t rs = rstd[r];
        for (int64_t j = 0; j < N; ++j) {
          const acc_t xh = (static_cast<acc_t>(s[r * N + j]) - mu) * rs;
          const acc_t gv = static_cast<acc_t>(g[r * N + j]);
          xhat[j] = xh;
          dxhat[j] = gv * w[j];
          if (pw) pw[j] += gv * xh;
          if (pb) pb[j] += gv;
        }
        const acc_t c1 = sum4<acc_t>(N, [&](int64_t j) { return dxhat[j] * xhat[j]; }) * inv_n;
        const acc_t c2 = a.rms ? acc_t(0) : sum4<acc_t>(N, [&](int64_t j) { return dxhat[j]; }) * inv_n;
        if (drop.active()) dropout_keep_run(seed, r * N, N, drop.threshold, keep.data());
        for (int64_t j = 0; j < N; ++j) {
          acc_t ds = rs * (dxhat[j] - xhat[j] * c1 - c2);
          if (gsum) ds += static_cast<acc_t>(gsum[r * N + j]);
          if (dres) dres[r * N + j] = static_cast<sum_t>(ds);
          const acc_t gx = drop.active() ? (keep[j] ? ds * scale : acc_t(0)) : ds;
          dx[r * N + j] = static_cast<scalar_t>(gx);
        }
      }
    }
  });

  if (want_dw) sum_partials(partial_w, blocks, N, data_as<param_t>(grad_w));
  if (want_db) sum_partials(partial_b, blocks, N, data_as<param_t>(grad_b));
}

// Unless M = 0: reads the seed and calls body(TypeTag<scalar_t>, TypeTag<param_t>, TypeTag<sum_t>, seed) for the
// spec's dtypes.
template <typename Body>
void run_add_norm_cpu(const AddNormSpec& a, const Body& body) {
  if (a.M == 0) return;
  const DropoutSeed seed = read_dropout_seed(a.dropout, a.seed);
  dispatch_dtypes<HostStorage>(a.x_dtype, a.sum_dtype, a.param_dtype,
                               [&](auto st, auto smt, auto pt) { body(st, pt, smt, seed); });
}

#define GPUOPT_TYPES                            \
  using scalar_t = typename decltype(st)::type; \
  using param_t = typename decltype(pt)::type;  \
  using sum_t = typename decltype(smt)::type;

// (out, sum, mean, rstd); mean is (0,) for RMSNorm. fp32 / bf16 / fp16 x take the fp32 row kernels, fp64 the
// generic loops.
std::tuple<Tensor, Tensor, Tensor, Tensor> add_norm_forward_cpu(const AddNormSpec& a) {
  Tensor out = empty_on(a.x, a.x.sizes(), a.x_dtype);
  Tensor sum = empty_on(a.x, a.x.sizes(), a.sum_dtype);
  Tensor mean = empty_on(a.x, {a.rms ? 0 : a.M}, a.acc_dtype);
  Tensor rstd = empty_on(a.x, {a.M}, a.acc_dtype);
  if (a.M > 0) {
    cpu::advise_huge_pages(out);
    cpu::advise_huge_pages(sum);
  }
  run_add_norm_cpu(a, [&](auto st, auto pt, auto smt, const DropoutSeed& s) {
    GPUOPT_TYPES
    if constexpr (std::is_same_v<scalar_t, double>) {
      dan_forward_generic<scalar_t, param_t, sum_t, double>(a, s, out, sum, mean, rstd);
    } else {
      dan_forward_fp32<scalar_t, param_t, sum_t>(a, s, out, sum, mean, rstd);
    }
  });
  return {out, sum, mean, rstd};
}

// (grad_x, grad_residual, grad_weight, grad_bias), the absent ones (0,)-shaped.
std::tuple<Tensor, Tensor, Tensor, Tensor> add_norm_backward_cpu(const AddNormSpec& a) {
  const Tensor& like = a.grad_out;
  Tensor grad_x = empty_on(like, like.sizes(), a.x_dtype);
  Tensor grad_res = a.has_residual ? empty_on(like, like.sizes(), a.sum_dtype) : empty_on(like, {0}, a.sum_dtype);
  Tensor grad_w = param_grad_on(like, a.weight.defined(), a.N, a.param_dtype);
  Tensor grad_b = param_grad_on(like, a.bias.defined(), a.N, a.param_dtype);
  if (a.M > 0) {
    cpu::advise_huge_pages(grad_x);
    cpu::advise_huge_pages(grad_res);
  }
  run_add_norm_cpu(a, [&](auto st, auto pt, auto smt, const DropoutSeed& s) {
    GPUOPT_TYPES
    if constexpr (std::is_same_v<scalar_t, double>) {
      dan_backward_generic<scalar_t, param_t, sum_t, double>(a, s, grad_x, grad_res, grad_w, grad_b);
    } else {
      dan_backward_fp32<scalar_t, param_t, sum_t>(a, s, grad_x, grad_res, grad_w, grad_b);
    }
  });
  return {grad_x, grad_res, grad_w, grad_b};
}

#undef GPUOPT_TYPES

std::tuple<Tensor, Tensor, Tensor, Tensor> dan_forward_cpu(const Tensor& x, const std::optional<Tensor>& residual,
                                                           const std::optional<Tensor>& weight,
                                                           const std::optional<Tensor>& bias, const Tensor& seed,
                                                           double p, double eps, bool rms, bool residual_in_fp32) {
  return add_norm_forward_cpu(check_dropout_add_norm(x, residual, weight, bias, seed, p, eps, rms, residual_in_fp32));
}

std::tuple<Tensor, Tensor, Tensor, Tensor> dan_backward_cpu(const Tensor& grad_out,
                                                            const std::optional<Tensor>& grad_sum, const Tensor& sum,
                                                            const std::optional<Tensor>& weight,
                                                            const std::optional<Tensor>& bias, const Tensor& mean,
                                                            const Tensor& rstd, const Tensor& seed, double p, bool rms,
                                                            bool has_residual) {
  return add_norm_backward_cpu(
      check_dropout_add_norm_backward(grad_out, grad_sum, sum, weight, bias, mean, rstd, seed, p, rms, has_residual));
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(gpuopt, CPU, m) {
  m.impl("dropout_add_norm", TORCH_BOX(&dan_forward_cpu));
  m.impl("dropout_add_norm_backward", TORCH_BOX(&dan_backward_cpu));
}

}  // namespace gpuopt
