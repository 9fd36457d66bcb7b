// Input validation shared by every C++ backend (CPU and CUDA launchers). The Python fake kernels and the
// Triton ops mirror these messages word for word (gpuopt_ops/_validation.py).
#pragma once
#include <optional>

#include "fused_math.h"
#include "torch_stable.h"

namespace gpuopt {

// Validated, contiguous operands of layer_norm_dropout_relu and its backward.
struct LdrArgs {
  Tensor x;       // contiguous
  Tensor weight;  // contiguous or undefined
  Tensor bias;    // contiguous or undefined
  int64_t M = 0;  // rows
  int64_t N = 0;  // normalized size (last dimension)
  DropoutParams dropout{};
  ScalarType acc_dtype = kFloat;    // dtype of mean / rstd
  ScalarType param_dtype = kFloat;  // dtype of grad_weight / grad_bias
  bool rms = false;                 // norm_dropout: RMSNorm (mean is (0,)); layer_norm_dropout_relu: false
  bool relu = true;                 // norm_dropout: ReLU after the dropout; layer_norm_dropout_relu: true
};

LdrArgs check_ldr_forward(const Tensor& x, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                          const Tensor& seed, double p, double eps);

// Returns the forward's args plus contiguous grad_out, mean, rstd.
struct LdrBackwardArgs {
  LdrArgs fwd;
  Tensor grad_out, mean, rstd;
};

LdrBackwardArgs check_ldr_backward(const Tensor& grad_out, const Tensor& x, const std::optional<Tensor>& weight,
                                   const std::optional<Tensor>& bias, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& seed, double p);

// norm_dropout: layer_norm_dropout_relu's checks under its own name, plus the norm and activation flags.
LdrArgs check_norm_dropout(const Tensor& x, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                           const Tensor& seed, double p, double eps, bool rms, bool relu);
// mean is (M,) for LayerNorm, (0,) when rms.
LdrBackwardArgs check_norm_dropout_backward(const Tensor& grad_out, const Tensor& x,
                                            const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                                            const Tensor& mean, const Tensor& rstd, const Tensor& seed, double p,
                                            bool rms, bool relu);

struct BiasReluArgs {
  Tensor x, bias;  // contiguous
  int64_t M = 0, N = 0;
};

BiasReluArgs check_bias_relu(const Tensor& x, const Tensor& bias);

struct BiasReluBackwardArgs {
  Tensor grad_out, out;  // contiguous
  int64_t M = 0, N = 0;
  ScalarType acc_dtype = kFloat;  // dtype of grad_bias: the unrounded sum (AMP's fp32 bias needs it)
};

BiasReluBackwardArgs check_bias_relu_backward(const Tensor& grad_out, const Tensor& out);

// Validated, contiguous operands of dropout_add_norm (DESIGN.md section 1).
struct DanArgs {
  Tensor x;         // contiguous
  Tensor residual;  // contiguous, dtype sum_dtype; undefined when absent
  Tensor weight;    // contiguous or undefined
  Tensor bias;      // contiguous or undefined
  int64_t M = 0;    // rows
  int64_t N = 0;    // normalized size (last dimension)
  DropoutParams dropout{};
  double eps = 0.0;
  bool rms = false;
  ScalarType x_dtype = kFloat;      // dtype of x and out
  ScalarType acc_dtype = kFloat;    // dtype of mean / rstd and of the arithmetic
  ScalarType param_dtype = kFloat;  // dtype of weight / bias (x's when both are absent)
  ScalarType sum_dtype = kFloat;    // S: fp32 when residual_in_fp32 and x is fp16/bf16, else x's dtype
};

DanArgs check_dropout_add_norm(const Tensor& x, const std::optional<Tensor>& residual,
                               const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                               const Tensor& seed, double p, double eps, bool rms, bool residual_in_fp32);

// Validated, contiguous operands of dropout_add_norm_backward. x's dtype is grad_out's, S is sum's.
struct DanBackwardArgs {
  Tensor grad_out;  // contiguous
  Tensor grad_sum;  // contiguous, dtype sum_dtype; undefined when absent
  Tensor sum;       // contiguous
  Tensor weight;    // contiguous or undefined
  Tensor bias;      // contiguous or undefined
  Tensor mean;      // contiguous: (M,), or (0,) when rms
  Tensor rstd;      // contiguous: (M,)
  int64_t M = 0;
  int64_t N = 0;
  DropoutParams dropout{};
  bool rms = false;
  bool has_residual = false;
  ScalarType x_dtype = kFloat;      // dtype of grad_out and grad_x
  ScalarType acc_dtype = kFloat;    // dtype of mean / rstd and of the arithmetic
  ScalarType param_dtype = kFloat;  // dtype of grad_weight / grad_bias
  ScalarType sum_dtype = kFloat;    // S: dtype of sum, grad_sum and grad_residual
};

DanBackwardArgs check_dropout_add_norm_backward(const Tensor& grad_out, const std::optional<Tensor>& grad_sum,
                                                const Tensor& sum, const std::optional<Tensor>& weight,
                                                const std::optional<Tensor>& bias, const Tensor& mean,
                                                const Tensor& rstd, const Tensor& seed, double p, bool rms,
                                                bool has_residual);

// bias_act: bias_relu's checks plus the activation code (0 relu, 1 gelu, 2 gelu_tanh, 3 silu).
struct BiasActArgs {
  Tensor x, bias;  // contiguous
  int64_t M = 0, N = 0;
  int act = 0;
};

BiasActArgs check_bias_act(const Tensor& x, const Tensor& bias, int64_t act);

struct BiasActBackwardArgs {
  Tensor grad_out, saved, bias;  // contiguous; saved: the output for relu, x otherwise
  int64_t M = 0, N = 0;
  int act = 0;
  ScalarType acc_dtype = kFloat;  // dtype of grad_bias: the unrounded sum
};

BiasActBackwardArgs check_bias_act_backward(const Tensor& grad_out, const Tensor& saved, const Tensor& bias,
                                            int64_t act);

// gated_act: gate and up of the same shape (..., F), or up absent and gate (..., 2F) holding [gate | up].
struct GatedActArgs {
  Tensor gate, up;  // contiguous; up undefined for the [gate | up] layout
  Tensor grad_out;  // contiguous (backward only)
  int64_t M = 0;    // rows
  int64_t F = 0;    // the output's last dimension
  int act = 0;
  DropoutParams dropout{};
  bool packed() const { return !up.defined(); }
};

GatedActArgs check_gated_act(const Tensor& gate, const std::optional<Tensor>& up, const Tensor& seed, double p,
                             int64_t act);
GatedActArgs check_gated_act_backward(const Tensor& grad_out, const Tensor& gate, const std::optional<Tensor>& up,
                                      const Tensor& seed, double p, int64_t act);

// Accumulation dtype of inputs of dtype t: fp64 for fp64, fp32 otherwise.
inline ScalarType acc_dtype_of(ScalarType t) { return t == kDouble ? kDouble : kFloat; }

// Rows M of an (M, N) view of a tensor whose last dimension is N (N > 0).
inline int64_t rows_of(const Tensor& t, int64_t N) { return N == 0 ? 0 : t.numel() / N; }

}  // namespace gpuopt
