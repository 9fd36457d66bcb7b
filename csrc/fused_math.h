// Per-element math shared by the CPU and CUDA kernels, so the CPU tests exercise the code the GPU runs.
#pragma once
#include <cmath>
#include <cstdint>

#include "philox.h"

namespace gpuopt {

// Dropout parameters after p has been quantized on the host (DESIGN.md): keep <=> u >= threshold,
// kept values scaled by 65536 / (65536 - threshold). threshold == 65536 (p = 1) drops everything.
struct DropoutParams {
  uint32_t threshold;  // 0 .. 65536
  // 65536 / (65536 - threshold), 0 when threshold == 65536. double, so fp64 kernels get an fp64-accurate scale;
  // each kernel casts it once to its acc_t (for fp32 that is the fp32 rounding of the exact quotient).
  double scale;
  bool mapped = false;  // the seed tensor holds a shard map [seed, base, period, jump] (philox.h ShardMap)
  GPUOPT_HD bool active() const { return threshold != 0; }
};

inline uint32_t dropout_threshold(double p) {
  // round half up, identical in every backend (Python: math.floor(p * 65536 + 0.5))
  double t = p * 65536.0 + 0.5;
  if (t < 0.0) t = 0.0;
  if (t > 65536.0) t = 65536.0;
  return static_cast<uint32_t>(t);
}

inline DropoutParams make_dropout_params(double p) {
  DropoutParams d;
  d.threshold = dropout_threshold(p);
  d.scale = d.threshold >= 65536u ? 0.0 : 65536.0 / (65536.0 - d.threshold);
  return d;
}

GPUOPT_HD bool dropout_keep(uint32_t u, uint32_t threshold) { return u >= threshold; }

// Forward of one element of layer_norm_dropout_relu / norm_dropout: y = xhat * w + b (pre-dropout),
// out = act(dropout(y)), act ReLU when relu (layer_norm_dropout_relu), else the identity.
// A select, never a multiply by an infinite scale; relu(y * scale) == relu(y) * scale for scale > 0.
// Written as `y <= 0 ? 0 : ...` so a NaN that survives dropout stays NaN, as torch.relu keeps it.
template <typename acc_t>
GPUOPT_HD acc_t nd_forward_element(acc_t y, bool keep, acc_t scale, bool relu) {
  return keep ? ((relu && y <= acc_t(0)) ? acc_t(0) : y * scale) : acc_t(0);
}

// Gradient with respect to y (pre-dropout) of one element, given the upstream gradient g.
// The ReLU bit is recomputed from y, the keep bit from the seed: nothing of the forward is stored.
template <typename acc_t>
GPUOPT_HD acc_t nd_backward_element(acc_t g, acc_t y, bool keep, acc_t scale, bool relu) {
  return (keep && (!relu || y > acc_t(0))) ? g * scale : acc_t(0);
}

template <typename acc_t>
GPUOPT_HD acc_t bias_relu_forward_element(acc_t x, acc_t b) {
  const acc_t y = x + b;
  return y <= acc_t(0) ? acc_t(0) : y;  // NaN propagates, as in torch.relu
}

// ReLU mask taken from the output (out > 0): nothing but the output is saved for backward.
template <typename acc_t>
GPUOPT_HD acc_t bias_relu_backward_element(acc_t g, acc_t out) {
  return out > acc_t(0) ? g : acc_t(0);
}

// ---------------------------------------------------------------------------------------------------- bias_act
// Activation codes of bias_act (DESIGN.md): the op's `act` argument and the kernels' template parameter.
constexpr int kActRelu = 0;      // relu(z); the backward reads the mask from the output (out > 0), as bias_relu
constexpr int kActGelu = 1;      // z * Phi(z) = 0.5 z (1 + erf(z / sqrt 2))
constexpr int kActGeluTanh = 2;  // 0.5 z (1 + tanh(u)), u = sqrt(2/pi) (z + 0.044715 z^3), computed as z * sigmoid(2u)
constexpr int kActSilu = 3;      // z * sigmoid(z)
constexpr int kActCount = 4;

GPUOPT_HD bool valid_act(int64_t act) { return act >= 0 && act < kActCount; }

// The elementary functions of the activations. fp64: the IEEE-accurate library exp and erf everywhere (fp64
// results are fp64-accurate, gradcheck works). fp32: two primitives, 2^v and 1/v, from a policy P: ActMath
// (here) on the GPU takes the hardware's approximate ex2 and rcp (MUFU, one instruction each, within 2 ulp) and on
// the host (the CPU fp64 loops' fallbacks and the emulator) the C library's exp2f and an IEEE division; the CPU
// row loops pass their own branch-free policy (cpu/row_kernels.cpp) so they vectorize. The fp32 formulas on top
// of them are the same code everywhere, so the emulator runs the GPU's formulas.
// One approximate fp32 instruction of the GPU on v (`ptx`), or the host's `host` expression.
#if defined(__CUDA_ARCH__)
#define GPUOPT_APPROX_F32(ptx, v, host)   \
  float r;                                \
  asm(ptx " %0, %1;" : "=f"(r) : "f"(v)); \
  return r
#else
#define GPUOPT_APPROX_F32(ptx, v, host) return host
#endif
struct ActMath {
  static GPUOPT_HD float exp2(float v) { GPUOPT_APPROX_F32("ex2.approx.ftz.f32", v, std::exp2(v)); }
  static GPUOPT_HD float rcp(float v) { GPUOPT_APPROX_F32("rcp.approx.ftz.f32", v, 1.0f / v); }
};
#undef GPUOPT_APPROX_F32

constexpr double kLog2e = 1.4426950408889634073599246810019;

// sigmoid(v) = 1 / (1 + exp(-v)): 1 for large v, 0 (not NaN) for very negative v (exp overflows to inf).
template <class P>
GPUOPT_HD double act_sigmoid(double v) {
  return 1.0 / (1.0 + ::exp(-v));
}
template <class P>
GPUOPT_HD float act_sigmoid(float v) {
  return P::rcp(1.0f + P::exp2(v * float(-kLog2e)));
}

// The standard normal distribution at z: cdf = Phi(z) = erfc(-z / sqrt 2) / 2, pdf = exp(-z^2 / 2) / sqrt(2 pi).
template <class P>
GPUOPT_HD void act_normal(double z, double& cdf, double& pdf) {
  cdf = 0.5 + 0.5 * ::erf(z * 0.70710678118654752440084436210485);
  pdf = 0.39894228040143267793994605993438 * ::exp(-0.5 * z * z);
}
// fp32: with a = |z| / sqrt 2 and t = 1 / (1 + 0.3895 a), erfc(a) = t exp(-a^2) Q(t), Q a degree-5 least-squares
// fit (weighted to the absolute error of erfc on a in [0, 9]: |error| < 1.1e-8 in exact arithmetic, < 2.2e-7 for
// the cdf evaluated in fp32). exp(-a^2) is the
// pdf's exponential too, so gelu's backward takes one exponential and one reciprocal. w = a sqrt(log2 e), so
// exp(-a^2) = 2^(-w^2); the 1/2 of the cdf is folded into Q.
template <class P>
GPUOPT_HD void act_normal(float z, float& cdf, float& pdf) {
  const float w = (z < 0.0f ? -z : z) * 0.84932180028801904272150283410289f;  // sqrt(log2 e / 2)
  const float t = P::rcp(1.0f + w * 0.32428002104592329f);                    // 0.3895 / sqrt(log2 e)
  const float e = P::exp2(-(w * w));
  float q = -1.144559701e-01f;
  q = q * t + 4.480553714e-01f;
  q = q * t - 3.249990437e-01f;
  q = q * t + 3.299435548e-01f;
  q = q * t + 4.366446383e-02f;
  q = q * t + 1.177916199e-01f;
  const float half_erfc = q * t * e;
  cdf = z < 0.0f ? half_erfc : 1.0f - half_erfc;
  pdf = 0.39894228040143267793994605993438f * e;
}

// The argument 2u of the sigmoid in gelu_tanh: 0.5 (1 + tanh(u)) = sigmoid(2u), so gelu_tanh(z) = z sigmoid(2u).
template <typename acc_t>
GPUOPT_HD acc_t gelu_tanh_arg(acc_t z) {
  const acc_t k = acc_t(1.5957691216057307117597842397375);  // 2 sqrt(2 / pi)
  return k * (z + acc_t(0.044715) * z * z * z);
}

// out = act(z), z = x + bias in the accumulation dtype. kActRelu is bias_relu_forward_element's select, so
// bias_act with act 0 gives bias_relu's bits. NaN propagates for every activation (each result is z times a
// factor, or z plus a term).
template <int kAct, typename acc_t, class P = ActMath>
GPUOPT_HD acc_t act_forward(acc_t z) {
  if constexpr (kAct == kActRelu) {
    return z <= acc_t(0) ? acc_t(0) : z;
  } else if constexpr (kAct == kActGelu) {
    acc_t cdf, pdf;
    act_normal<P>(z, cdf, pdf);
    return z * cdf;
  } else if constexpr (kAct == kActGeluTanh) {
    return z * act_sigmoid<P>(gelu_tanh_arg(z));
  } else {
    return z * act_sigmoid<P>(z);
  }
}

// act'(z) for the activations that recompute z = x + bias in the backward (not relu: its mask is out > 0).
template <int kAct, typename acc_t, class P = ActMath>
GPUOPT_HD acc_t act_derivative(acc_t z) {
  static_assert(kAct != kActRelu, "relu's backward reads the output's mask (bias_relu_backward_element)");
  if constexpr (kAct == kActGelu) {
    acc_t cdf, pdf;  // Phi(z) + z phi(z)
    act_normal<P>(z, cdf, pdf);
    return cdf + z * pdf;
  } else if constexpr (kAct == kActGeluTanh) {
    // s = sigmoid(2u): s + z s (1 - s) d(2u)/dz, d(2u)/dz = 2 sqrt(2/pi) (1 + 3 * 0.044715 z^2)
    const acc_t s = act_sigmoid<P>(gelu_tanh_arg(z));
    const acc_t du = acc_t(1.5957691216057307117597842397375) * (acc_t(1) + acc_t(0.134145) * z * z);
    return s + z * s * (acc_t(1) - s) * du;
  } else {
    const acc_t s = act_sigmoid<P>(z);
    return s * (acc_t(1) + z * (acc_t(1) - s));
  }
}

// grad_x of one element: relu from the saved output (out > 0), the others from z = x + bias.
template <int kAct, typename acc_t>
GPUOPT_HD acc_t act_backward_element(acc_t g, acc_t saved, acc_t b) {
  if constexpr (kAct == kActRelu) {
    return saved > acc_t(0) ? g : acc_t(0);
  } else {
    return g * act_derivative<kAct>(saved + b);
  }
}

// ---------------------------------------------------------------------------------------------------- gated_act
// gated_act (DESIGN.md section 1): h = act(gate) * up, out = keep ? h * scale : 0, in the accumulation dtype.
// Backward, from the saved inputs: gh = keep ? grad_out * scale : 0, grad_up = gh * act(gate),
// grad_gate = (gh * up) * act'(gate). relu's act' is gate > 0 (0 at 0 and for NaN, as bias_relu's out > 0).
template <int kAct, typename acc_t, class P = ActMath>
GPUOPT_HD acc_t gated_forward_element(acc_t gate, acc_t up, bool keep, acc_t scale) {
  return keep ? (act_forward<kAct, acc_t, P>(gate) * up) * scale : acc_t(0);
}

// grad_gate and grad_up of one element, given the upstream gradient g.
template <int kAct, typename acc_t, class P = ActMath>
GPUOPT_HD void gated_backward_element(acc_t g, acc_t gate, acc_t up, bool keep, acc_t scale, acc_t& grad_gate,
                                      acc_t& grad_up) {
  const acc_t gh = keep ? g * scale : acc_t(0);
  grad_up = gh * act_forward<kAct, acc_t, P>(gate);
  if constexpr (kAct == kActRelu) {
    grad_gate = gate > acc_t(0) ? gh * up : acc_t(0);
  } else {
    grad_gate = (gh * up) * act_derivative<kAct, acc_t, P>(gate);
  }
}

}  // namespace gpuopt
