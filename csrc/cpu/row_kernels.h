// fp32 row kernels of the CPU backend: the inner loops of the norm, bias-activation and gated ops, forward and
// backward, on rows already in fp32. With GCC >= 11 each is compiled three times (x86-64-v4 = AVX-512, x86-64-v3 =
// AVX2 + FMA + F16C, and the baseline ISA; older GCC and Clang: AVX2 and the baseline) with target_clones; the
// loader picks one per machine, so the .so still runs on any x86-64. The 16-lane clone roughly halves the
// activations' arithmetic (GELU's row loop measured 0.99 -> 0.56 ns an element on one core here).
//
// Why not at::vec: an extension is compiled without ATen's CPU_CAPABILITY_* macros, so at::vec::Vectorized
// falls back to its generic std::array implementation (scalar loops). Plain loops over restrict pointers plus
// per-lane accumulators vectorize in both clones instead.
//
// Reductions use 16 per-lane partial sums combined in a fixed tree: the bits depend on n only, never on the
// thread count or the vector width.
#pragma once
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <cstdint>

namespace gpuopt {
namespace cpu {

float row_sum(const float* v, int64_t n);
// sum_j (v[j] - mean)^2
float row_sq_dev_sum(const float* v, int64_t n, float mean);
// sum_j a[j] * b[j]
float row_dot(const float* a, const float* b, int64_t n);

// out[j] = keep_j ? act((x[j] - mean) * rstd * w[j] + b[j]) * scale : 0, where keep_j = (u[j] >= t) and act is
// ReLU when relu, else the identity; u == nullptr means no dropout (every element kept, scale ignored).
// RMSNorm passes mean = 0.
void nd_forward_row(const float* x, const float* w, const float* b, const uint16_t* u, uint32_t t, float scale,
                    float mean, float rstd, float* out, int64_t n, bool relu = true);

// Backward, first pass over a row: xhat = (x - mean) * rstd, dy = keep && (!relu || y > 0) ? g * scale : 0
// (y = xhat*w + b), dxhat = dy * w; accumulates pw += dy * xhat and pb += dy (the row's contribution to dgamma /
// dbeta).
void nd_backward_row_pass1(const float* x, const float* g, const float* w, const float* b, const uint16_t* u,
                           uint32_t t, float scale, float mean, float rstd, float* xhat, float* dxhat, float* pw,
                           float* pb, int64_t n, bool relu = true);
// dx = rstd * (dxhat - xhat * c1 - c2)
void nd_backward_row_pass2(const float* xhat, const float* dxhat, float rstd, float c1, float c2, float* dx, int64_t n);

// dropout_add_norm, forward: s[j] = d[j] (+ r[j]) with d[j] = u == nullptr ? x[j] : (u[j] >= t ? x[j] * scale : 0);
// r == nullptr means no residual (s = d itself, so a -0 stays -0).
void dan_sum_row(const float* x, const float* r, const uint16_t* u, uint32_t t, float scale, float* s, int64_t n);
// out[j] = (s[j] - mean) * rstd * w[j] + b[j]  (RMSNorm: mean = 0)
void norm_forward_row(const float* s, const float* w, const float* b, float mean, float rstd, float* out, int64_t n);
// dropout_add_norm, backward first pass: xhat = (s - mean) * rstd, dxhat = g * w; pw += g * xhat, pb += g.
void norm_backward_row_pass1(const float* s, const float* g, const float* w, float mean, float rstd, float* xhat,
                             float* dxhat, float* pw, float* pb, int64_t n);
// Second pass: d = rstd * (dxhat - xhat * c1 - c2) + gsum (RMSNorm: c2 = 0); dres = d;
// dx = u == nullptr ? d : (u >= t ? d * scale : 0). gsum, dres: rows of n (zeros / scratch when absent).
void dan_backward_row_pass2(const float* xhat, const float* dxhat, const float* gsum, const uint16_t* u, uint32_t t,
                            float scale, float rstd, float c1, float c2, float* dres, float* dx, int64_t n);

// y = relu(x + b)  (NaN propagates)
void bias_relu_row(const float* x, const float* b, float* y, int64_t n);
// dx = out > 0 ? g : 0; pb += dx
void bias_relu_backward_row(const float* g, const float* out, float* dx, float* pb, int64_t n);

// bias_act (act 1 gelu, 2 gelu_tanh, 3 silu; relu is bias_relu_row): y = act(x + b)
void bias_act_row(int act, const float* x, const float* b, float* y, int64_t n);
// dx = g * act'(x + b); pb += dx
void bias_act_backward_row(int act, const float* g, const float* x, const float* b, float* dx, float* pb, int64_t n);

// gated_act (acts 0-3), fused_math.h's gated_forward_element / gated_backward_element on fp32 runs:
// out = keep ? (act(g) * v) * scale : 0, keep_j = (u[j] >= t); u == nullptr means no dropout (out = act(g) * v).
void gated_forward_row(int act, const float* g, const float* v, const uint16_t* u, uint32_t t, float scale, float* out,
                       int64_t n);
// gh = keep ? go * scale : 0; dv = gh * act(g); dg = (gh * v) * act'(g) (relu: g > 0 ? gh * v : 0).
void gated_backward_row(int act, const float* go, const float* g, const float* v, const uint16_t* u, uint32_t t,
                        float scale, float* dg, float* dv, int64_t n);

// Conversions of a row to / from fp32 (round to nearest even, as c10's own conversions).
void to_float(const torch::headeronly::BFloat16* src, float* dst, int64_t n);
void to_float(const torch::headeronly::Half* src, float* dst, int64_t n);
void from_float(const float* src, torch::headeronly::BFloat16* dst, int64_t n);
void from_float(const float* src, torch::headeronly::Half* dst, int64_t n);

}  // namespace cpu
}  // namespace gpuopt
