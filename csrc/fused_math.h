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

// Forward of one element: y = xhat * w + b (pre-dropout), out = relu(dropout(y)).
template <typename acc_t>
GPUOPT_HD acc_t ldr_forward_element(acc_t y, bool keep, acc_t scale) {
  // select, never multiply by an infinite scale; relu(y * scale) == relu(y) * scale for scale > 0.
  // Written as `y <= 0 ? 0 : ...` so a NaN that survives dropout stays NaN, as torch.relu keeps it.
  return keep ? (y <= acc_t(0) ? acc_t(0) : y * scale) : acc_t(0);
}

// Gradient with respect to y (pre-dropout) of one element, given the upstream gradient g.
// The ReLU bit is recomputed from y, the keep bit from the seed: nothing of the forward is stored.
template <typename acc_t>
GPUOPT_HD acc_t ldr_backward_element(acc_t g, acc_t y, bool keep, acc_t scale) {
  return (keep && y > acc_t(0)) ? g * scale : acc_t(0);
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

// The elementary functions of the activations. fp64: the IEEE-accurate library functions everywhere. fp32 on a
// GPU: the hardware exponential (ex2.approx, through __expf), an approximate reciprocal (rcp.approx, through
// __fdividef: 0 past 2^126, which is the sigmoid's limit anyway) and nvcc's erff (a branch-free polynomial);
// each is within 2 ulp on the range that matters, far inside the tests' tolerance. fp32 on the host (the CPU
// backend and the emulator): the C library's expf / erff and an IEEE division.
GPUOPT_HD double act_exp(double v) { return ::exp(v); }
GPUOPT_HD double act_erf(double v) { return ::erf(v); }
GPUOPT_HD double act_rcp(double v) { return 1.0 / v; }
GPUOPT_HD float act_exp(float v) {
#if defined(__CUDA_ARCH__)
  return __expf(v);
#else
  return std::exp(v);
#endif
}
GPUOPT_HD float act_erf(float v) {
#if defined(__CUDA_ARCH__)
  return erff(v);
#else
  return std::erf(v);
#endif
}
GPUOPT_HD float act_rcp(float v) {
#if defined(__CUDA_ARCH__)
  return __fdividef(1.0f, v);
#else
  return 1.0f / v;
#endif
}

// sigmoid(v) = 1 / (1 + exp(-v)): 1 for large v, 0 (not NaN) for very negative v (exp overflows to inf).
template <typename acc_t>
GPUOPT_HD acc_t act_sigmoid(acc_t v) {
  return act_rcp(acc_t(1) + act_exp(-v));
}

// The argument 2u of the sigmoid in gelu_tanh: 0.5 (1 + tanh(u)) = sigmoid(2u), so gelu_tanh(z) = z sigmoid(2u).
template <typename acc_t>
GPUOPT_HD acc_t gelu_tanh_arg(acc_t z) {
  const acc_t k = acc_t(1.5957691216057307117597842397375);  // 2 sqrt(2 / pi)
  return k * (z + acc_t(0.044715) * z * z * z);
}

// out = act(z), z = x + bias in the accumulation dtype. kActRelu is bias_relu_forward_element's select, so
// bias_act with act 0 gives bias_relu's bits. NaN propagates for every activation.
template <int kAct, typename acc_t>
GPUOPT_HD acc_t act_forward(acc_t z) {
  if constexpr (kAct == kActRelu) {
    return z <= acc_t(0) ? acc_t(0) : z;
  } else if constexpr (kAct == kActGelu) {
    const acc_t phi = acc_t(0.5) + acc_t(0.5) * act_erf(z * acc_t(0.70710678118654752440084436210485));
    return z * phi;
  } else if constexpr (kAct == kActGeluTanh) {
    return z * act_sigmoid(gelu_tanh_arg(z));
  } else {
    return z * act_sigmoid(z);
  }
}

// act'(z) for the activations that recompute z = x + bias in the backward (not relu: its mask is out > 0).
template <int kAct, typename acc_t>
GPUOPT_HD acc_t act_derivative(acc_t z) {
  static_assert(kAct != kActRelu, "relu's backward reads the output's mask (bias_relu_backward_element)");
  if constexpr (kAct == kActGelu) {
    // Phi(z) + z phi(z), phi(z) = exp(-z^2 / 2) / sqrt(2 pi)
    const acc_t cdf = acc_t(0.5) + acc_t(0.5) * act_erf(z * acc_t(0.70710678118654752440084436210485));
    const acc_t pdf = acc_t(0.39894228040143267793994605993438) * act_exp(acc_t(-0.5) * z * z);
    return cdf + z * pdf;
  } else if constexpr (kAct == kActGeluTanh) {
    // s = sigmoid(2u): s + z s (1 - s) d(2u)/dz, d(2u)/dz = 2 sqrt(2/pi) (1 + 3 * 0.044715 z^2)
    const acc_t s = act_sigmoid(gelu_tanh_arg(z));
    const acc_t du = acc_t(1.5957691216057307117597842397375) * (acc_t(1) + acc_t(0.134145) * z * z);
    return s + z * s * (acc_t(1) - s) * du;
  } else {
    const acc_t s = act_sigmoid(z);
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

}  // namespace gpuopt
