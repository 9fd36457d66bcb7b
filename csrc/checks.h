// Input validation shared by every C++ backend (CPU and CUDA launchers). The Python fake kernels and the
// Triton ops mirror these messages word for word (gpuopt_ops/_validation.py).
#pragma once
#include <ATen/core/Tensor.h>
#include <optional>
#include "fused_math.h"

namespace gpuopt {

// Validated, contiguous operands of layer_norm_dropout_relu and its backward.
struct LdrArgs {
  at::Tensor x;       // contiguous
  at::Tensor weight;  // contiguous or undefined
  at::Tensor bias;    // contiguous or undefined
  int64_t M = 0;      // rows
  int64_t N = 0;      // normalized size (last dimension)
  DropoutParams dropout{};
  at::ScalarType acc_dtype = at::kFloat;    // dtype of mean / rstd
  at::ScalarType param_dtype = at::kFloat;  // dtype of grad_weight / grad_bias
};

LdrArgs check_ldr_forward(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                          const std::optional<at::Tensor>& bias, const at::Tensor& seed, double p,
                          double eps);

// Returns the forward's args plus contiguous grad_out, mean, rstd.
struct LdrBackwardArgs {
  LdrArgs fwd;
  at::Tensor grad_out, mean, rstd;
};

LdrBackwardArgs check_ldr_backward(const at::Tensor& grad_out, const at::Tensor& x,
                                   const std::optional<at::Tensor>& weight,
                                   const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                                   const at::Tensor& rstd, const at::Tensor& seed, double p);

struct BiasReluArgs {
  at::Tensor x, bias;  // contiguous
  int64_t M = 0, N = 0;
};

BiasReluArgs check_bias_relu(const at::Tensor& x, const at::Tensor& bias);

struct BiasReluBackwardArgs {
  at::Tensor grad_out, out;  // contiguous
  int64_t M = 0, N = 0;
  at::ScalarType acc_dtype = at::kFloat;  // dtype of grad_bias: the unrounded sum (AMP's fp32 bias needs it)
};

BiasReluBackwardArgs check_bias_relu_backward(const at::Tensor& grad_out, const at::Tensor& out);

// Accumulation dtype of inputs of dtype t: fp64 for fp64, fp32 otherwise.
inline at::ScalarType acc_dtype_of(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// Rows M of an (M, N) view of a tensor whose last dimension is N (N > 0).
inline int64_t rows_of(const at::Tensor& t, int64_t N) { return N == 0 ? 0 : t.numel() / N; }

}  // namespace gpuopt
