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
#include "cpu/op_entry.h"
#include "cpu/row_blocks.h"
#include "cpu/row_io.h"
#include "cpu/row_kernels.h"
#include "dtypes.h"
#include "torch_stable.h"

namespace gpuopt {
namespace {

// dropout_add_norm's forward for one dtype combination: the operands as typed pointers and the parameters in acc_t
// (fp32 for fp32 / bf16 / fp16 x), read by both paths: fp32_rows on the fp32 row kernels, generic_rows on plain loops.
template <typename scalar_t, typename sum_t, typename param_t>
struct DanForward {
  using acc_t = acc_type_t<scalar_t>;
  const AddNormSpec& a;
  const int64_t M, N;
  const scalar_t* x;
  const sum_t* res;  // nullptr without a residual
  scalar_t* y;
  sum_t* s_out;
  acc_t* mean_out;  // nullptr for RMSNorm
  acc_t* rstd_out;
  const std::vector<acc_t> w, b;
  const RowDropout<acc_t> drop;
  const acc_t eps, inv_n;

  DanForward(TypeTag<scalar_t>, TypeTag<sum_t>, TypeTag<param_t>, const AddNormSpec& spec, Tensor& out, Tensor& sum,
             Tensor& mean, Tensor& rstd)
      : a(spec),
        M(spec.M),
        N(spec.N),
        x(data_as<const scalar_t>(spec.x)),
        res(spec.residual.defined() ? data_as<const sum_t>(spec.residual) : nullptr),
        y(data_as<scalar_t>(out)),
        s_out(data_as<sum_t>(sum)),
        mean_out(spec.rms ? nullptr : data_as<acc_t>(mean)),
        rstd_out(data_as<acc_t>(rstd)),
        w(param_row<acc_t, param_t>(spec.weight, N, acc_t(1))),
        b(param_row<acc_t, param_t>(spec.bias, N, acc_t(0))),
        drop(spec.dropout),
        eps(static_cast<acc_t>(spec.eps)),
        inv_n(acc_t(1) / static_cast<acc_t>(N)) {}

  void fp32_rows(const DropoutSeed& seed) const;
  void generic_rows(const DropoutSeed& seed) const;
};

// Its backward, likewise; the rows end with the dgamma / dbeta sums into grad_w / grad_b.
template <typename scalar_t, typename sum_t, typename param_t>
struct DanBackward {
  using acc_t = acc_type_t<scalar_t>;
  const AddNormSpec& a;
  const int64_t N;
  const scalar_t* g;
  const sum_t* gsum;  // nullptr without grad_sum
  const sum_t* s;
  const acc_t* mean;  // nullptr for RMSNorm
  const acc_t* rstd;
  scalar_t* dx;
  sum_t* dres;  // nullptr when grad_residual is not wanted
  const std::vector<acc_t> w;
  const RowDropout<acc_t> drop;
  const acc_t inv_n;

  DanBackward(TypeTag<scalar_t>, TypeTag<sum_t>, TypeTag<param_t>, const AddNormSpec& spec, Tensor& grad_x,
              Tensor& grad_res)
      : a(spec),
        N(spec.N),
        g(data_as<const scalar_t>(spec.grad_out)),
        gsum(spec.grad_sum.defined() ? data_as<const sum_t>(spec.grad_sum) : nullptr),
        s(data_as<const sum_t>(spec.sum)),
        mean(spec.rms ? nullptr : data_as<const acc_t>(spec.mean)),
        rstd(data_as<const acc_t>(spec.rstd)),
        dx(data_as<scalar_t>(grad_x)),
        dres(spec.has_residual ? data_as<sum_t>(grad_res) : nullptr),
        w(param_row<acc_t, param_t>(spec.weight, N, acc_t(1))),
        drop(spec.dropout),
        inv_n(acc_t(1) / static_cast<acc_t>(N)) {}

  void fp32_rows(const DropoutSeed& seed, Tensor& grad_w, Tensor& grad_b) const;
  void generic_rows(const DropoutSeed& seed, Tensor& grad_w, Tensor& grad_b) const;
};

// ------------------------------------------------------------------------------------------ fp32 fast path
// fp32 / bf16 / fp16 x: rows are handled in fp32 by the vectorized row kernels of cpu/row_kernels.h. fp32 rows are
// read and written in place; 16-bit rows go through per-thread fp32 buffers (converted once each way; cpu/row_io.h).

template <typename scalar_t, typename sum_t, typename param_t>
void DanForward<scalar_t, sum_t, param_t>::fp32_rows(const DropoutSeed& seed) const {
  constexpr bool kDirectS = std::is_same_v<sum_t, float>;
  auto scratch = [&] {  // x, out and residual rows in fp32 (none in place), s
    return std::array<std::vector<float>, 4>{staging_row<scalar_t>(N), staging_row<scalar_t>(N), staging_row<sum_t>(N),
                                             std::vector<float>(N)};
  };
  run_row_tiles(M, N, seed, drop.active, scratch, [&](auto& bufs, int64_t r, const uint16_t* u) {
    auto& [xbuf, ybuf, rbuf, sbuf] = bufs;
    const float* xr = load_row(x + r * N, xbuf.data(), N);
    const float* rr = res ? load_row(res + r * N, rbuf.data(), N) : nullptr;
    // s in fp32; an fp32 sum is written in place, a 16-bit one rounded once and read back as stored
    float* sr = kDirectS ? result_row(s_out + r * N, sbuf.data()) : sbuf.data();
    cpu::dan_sum_row(xr, rr, u, drop.threshold, drop.scale, sr, N);
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

template <typename scalar_t, typename sum_t, typename param_t>
void DanBackward<scalar_t, sum_t, param_t>::fp32_rows(const DropoutSeed& seed, Tensor& grad_w, Tensor& grad_b) const {
  const std::vector<float> zeros(gsum ? 0 : N, 0.0f);
  BlockPartials<float> partials(a.M, N);
  auto scratch = [&] {  // sum, grad_out, grad_sum, grad_x and grad_residual rows in fp32 (none in place), xhat, dxhat
    return std::array<std::vector<float>, 7>{staging_row<sum_t>(N),
                                             staging_row<scalar_t>(N),
                                             staging_row<sum_t>(N),
                                             staging_row<scalar_t>(N),
                                             dres ? staging_row<sum_t>(N) : std::vector<float>(N),
                                             std::vector<float>(N),
                                             std::vector<float>(N)};
  };
  partials.run(seed, drop.active, scratch, [&](auto& bufs, int64_t r, const uint16_t* u, float* pw, float* pb) {
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
    cpu::dan_backward_row_pass2(xhat.data(), dxhat.data(), gsr, u, drop.threshold, drop.scale, rs, c1, c2, drr, dxr, N);
    if (dres) store_row(dres + r * N, drr, N);
    store_row(dx + r * N, dxr, N);
  });
  partials.sum<param_t>(a.weight, a.bias, grad_w, grad_b);
}

// ------------------------------------------------------------------------------------------ generic (fp64) path
// The same rows and tiles as the fp32 path, on plain loops in acc_t.

template <typename scalar_t, typename sum_t, typename param_t>
void DanForward<scalar_t, sum_t, param_t>::generic_rows(const DropoutSeed& seed) const {
  auto scratch = [&] { return std::vector<acc_t>(N); };  // s as stored, in acc_t
  run_row_tiles(M, N, seed, drop.active, scratch, [&](auto& row, int64_t r, const uint16_t* u) {
    const scalar_t* xr = x + r * N;
    sum_t* sr = s_out + r * N;
    for (int64_t j = 0; j < N; ++j) {
      const acc_t xv = static_cast<acc_t>(xr[j]);
      const acc_t d = u ? (drop.keep(u, j) ? xv * drop.scale : acc_t(0)) : xv;
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
  });
}

template <typename scalar_t, typename sum_t, typename param_t>
void DanBackward<scalar_t, sum_t, param_t>::generic_rows(const DropoutSeed& seed, Tensor& grad_w,
                                                         Tensor& grad_b) const {
  generic_backward_rows<acc_t, param_t>(
      a, seed, grad_w, grad_b, [&](acc_t* xhat, acc_t* dxhat, int64_t r, const uint16_t* u, acc_t* pw, acc_t* pb) {
        const acc_t mu = a.rms ? acc_t(0) : mean[r];
        const acc_t rs = rstd[r];
        for (int64_t j = 0; j < N; ++j) {
          const acc_t xh = (static_cast<acc_t>(s[r * N + j]) - mu) * rs;
          const acc_t gv = static_cast<acc_t>(g[r * N + j]);
          xhat[j] = xh;
          dxhat[j] = gv * w[j];
          pw[j] += gv * xh;
          pb[j] += gv;
        }
        const acc_t c1 = sum4<acc_t>(N, [&](int64_t j) { return dxhat[j] * xhat[j]; }) * inv_n;
        const acc_t c2 = a.rms ? acc_t(0) : sum4<acc_t>(N, [&](int64_t j) { return dxhat[j]; }) * inv_n;
        for (int64_t j = 0; j < N; ++j) {
          acc_t ds = rs * (dxhat[j] - xhat[j] * c1 - c2);
          if (gsum) ds += static_cast<acc_t>(gsum[r * N + j]);
          if (dres) dres[r * N + j] = static_cast<sum_t>(ds);
          const acc_t gx = u ? (drop.keep(u, j) ? ds * drop.scale : acc_t(0)) : ds;
          dx[r * N + j] = static_cast<scalar_t>(gx);
        }
      });
}

// (out, sum, mean, rstd); mean is (0,) for RMSNorm. fp32 / bf16 / fp16 x take the fp32 row kernels, fp64 the
// generic loops.
std::tuple<Tensor, Tensor, Tensor, Tensor> add_norm_forward_cpu(const AddNormSpec& a) {
  Tensor out = empty_on(a.x, a.x.sizes(), a.x_dtype);
  Tensor sum = empty_on(a.x, a.x.sizes(), a.sum_dtype);
  Tensor mean = empty_on(a.x, {a.rms ? 0 : a.M}, a.acc_dtype);
  Tensor rstd = empty_on(a.x, {a.M}, a.acc_dtype);
  cpu::advise_huge_pages(out);  // (nothing for M = 0: empty tensors are never advised)
  cpu::advise_huge_pages(sum);
  run_rows_cpu(
      a,
      [&](auto xt, auto st, auto pt, const DropoutSeed& seed) {
        DanForward(xt, st, pt, a, out, sum, mean, rstd).generic_rows(seed);
      },
      [&](auto xt, auto st, auto pt, const DropoutSeed& seed) {
        DanForward(xt, st, pt, a, out, sum, mean, rstd).fp32_rows(seed);
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
  cpu::advise_huge_pages(grad_x);
  cpu::advise_huge_pages(grad_res);
  run_rows_cpu(
      a,
      [&](auto xt, auto st, auto pt, const DropoutSeed& seed) {
        DanBackward(xt, st, pt, a, grad_x, grad_res).generic_rows(seed, grad_w, grad_b);
      },
      [&](auto xt, auto st, auto pt, const DropoutSeed& seed) {
        DanBackward(xt, st, pt, a, grad_x, grad_res).fp32_rows(seed, grad_w, grad_b);
      });
  return {grad_x, grad_res, grad_w, grad_b};
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(gpuopt, CPU, m) {
  CpuOp<&add_norm_forward_cpu, &add_norm_backward_cpu>::impl<&check_dropout_add_norm, &check_dropout_add_norm_backward>(
      m, "dropout_add_norm", "dropout_add_norm_backward");
}

}  // namespace gpuopt
