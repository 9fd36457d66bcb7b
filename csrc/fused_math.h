// Per-element math shared by the CPU and CUDA kernels, so the CPU tests exercise the code the GPU runs.
#pragma once
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

}  // namespace gpuopt
