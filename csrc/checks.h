// Input validation shared by every C++ backend (CPU and CUDA launchers). The Python fake kernels and the
// Triton ops mirror these messages word for word (gpuopt_ops/_validation.py).
#pragma once
#include <optional>

#include "fused_math.h"
#include "torch_stable.h"

namespace gpuopt {

// Each check_* validates an op's call (the messages are the contract) and returns its spec: the contiguous operands,
// the shape (M rows of N), the dtypes, eps and the dropout, everything the backends then read. The CUDA launchers
// build the kernels' parameters straight from it (cuda/torch_ops.h), the CPU kernels read it.

// The norm rows ops: layer_norm_dropout_relu and norm_dropout, forward and backward.
struct NormSpec {
  Tensor x;                     // contiguous
  Tensor weight, bias;          // contiguous or undefined
  Tensor seed;                  // int64: the seed, or a shard map [seed, base, period, jump] (philox.h ShardMap)
  Tensor grad_out, mean, rstd;  // backward only, contiguous; mean is (0,) when rms
  int64_t M = 0;                // rows
  int64_t N = 0;                // normalized size (last dimension)
  DType x_dtype = DType::kFloat32;
  DType param_dtype = DType::kFloat32;  // weight / bias and their gradients (x's when both are absent)
  DType acc_dtype = DType::kFloat32;    // mean / rstd and the arithmetic
  double eps = 0.0;                     // forward only
  DropoutParams dropout{};
  bool rms = false;  // norm_dropout: RMSNorm (mean is (0,)); layer_norm_dropout_relu: false
  bool relu = true;  // norm_dropout: ReLU after the dropout; layer_norm_dropout_relu: true
};

NormSpec check_ldr_forward(const Tensor& x, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                           const Tensor& seed, double p, double eps);

NormSpec check_ldr_backward(const Tensor& grad_out, const Tensor& x, const std::optional<Tensor>& weight,
                            const std::optional<Tensor>& bias, const Tensor& mean, const Tensor& rstd,
                            const Tensor& seed, double p);

// norm_dropout: layer_norm_dropout_relu's checks under its own name, plus the norm and activation flags.
NormSpec check_norm_dropout(const Tensor& x, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                            const Tensor& seed, double p, double eps, bool rms, bool relu);
// mean is (M,) for LayerNorm, (0,) when rms.
NormSpec check_norm_dropout_backward(const Tensor& grad_out, const Tensor& x, const std::optional<Tensor>& weight,
                                     const std::optional<Tensor>& bias, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& seed, double p, bool rms, bool relu);

// The bias-act ops: bias_relu (act 0) and bias_act, forward and backward.
struct BiasActSpec {
  Tensor x;              // forward, contiguous
  Tensor grad_out;       // backward, contiguous
  Tensor saved;          // backward, contiguous: the output for relu, x otherwise
  Tensor bias;           // contiguous; undefined for bias_relu_backward (it reads no bias)
  int64_t M = 0, N = 0;  // rows, columns
  int act = kActRelu;    // fused_math.h's act code
  DType x_dtype = DType::kFloat32;
  DType bias_dtype = DType::kFloat32;  // x's or fp32 (x's when the bias is absent)
  DType acc_dtype = DType::kFloat32;   // grad_bias: the unrounded sum (AMP's fp32 bias needs it)
};

BiasActSpec check_bias_relu(const Tensor& x, const Tensor& bias);

BiasActSpec check_bias_relu_backward(const Tensor& grad_out, const Tensor& out);

// dropout_add_norm (DESIGN.md section 1) and its backward. x's dtype is grad_out's in the backward, S is sum's.
struct AddNormSpec {
  Tensor x, residual;                   // forward, contiguous; residual (dtype S) undefined when absent
  Tensor grad_out, grad_sum, sum;       // backward, contiguous; grad_sum (dtype S) undefined when absent
  Tensor weight, bias;                  // contiguous or undefined
  Tensor mean, rstd;                    // backward, contiguous: (M,) (mean (0,) when rms) and (M,)
  Tensor seed;                          // as NormSpec's
  int64_t M = 0;                        // rows
  int64_t N = 0;                        // normalized size (last dimension)
  DType x_dtype = DType::kFloat32;      // x and out; grad_out and grad_x
  DType acc_dtype = DType::kFloat32;    // mean / rstd and the arithmetic
  DType param_dtype = DType::kFloat32;  // weight / bias (x's when both are absent)
  DType sum_dtype = DType::kFloat32;    // S: fp32 when residual_in_fp32 and x is fp16/bf16, else x's dtype
  double eps = 0.0;                     // forward only
  DropoutParams dropout{};
  bool rms = false;
  bool has_residual = false;  // backward: grad_residual is wanted
};

AddNormSpec check_dropout_add_norm(const Tensor& x, const std::optional<Tensor>& residual,
                                   const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                                   const Tensor& seed, double p, double eps, bool rms, bool residual_in_fp32);

AddNormSpec check_dropout_add_norm_backward(const Tensor& grad_out, const std::optional<Tensor>& grad_sum,
                                            const Tensor& sum, const std::optional<Tensor>& weight,
                                            const std::optional<Tensor>& bias, const Tensor& mean, const Tensor& rstd,
                                            const Tensor& seed, double p, bool rms, bool has_residual);

BiasActSpec check_bias_act(const Tensor& x, const Tensor& bias, int64_t act);

BiasActSpec check_bias_act_backward(const Tensor& grad_out, const Tensor& saved, const Tensor& bias, int64_t act);

// gated_act: gate and up of the same shape (..., F), or up absent and gate (..., 2F) holding [gate | up].
struct GatedSpec {
  Tensor gate, up;  // contiguous; up undefined for the [gate | up] layout
  Tensor grad_out;  // contiguous (backward only)
  Tensor seed;      // as NormSpec's
  int64_t M = 0;    // rows
  int64_t F = 0;    // the output's last dimension
  int act = 0;
  DType dtype = DType::kFloat32;
  DropoutParams dropout{};
  bool packed() const { return !up.defined(); }
};

GatedSpec check_gated_act(const Tensor& gate, const std::optional<Tensor>& up, const Tensor& seed, double p,
                          int64_t act);
GatedSpec check_gated_act_backward(const Tensor& grad_out, const Tensor& gate, const std::optional<Tensor>& up,
                                   const Tensor& seed, double p, int64_t act);

// Rows M of an (M, N) view of a tensor whose last dimension is N (N > 0).
inline int64_t rows_of(const Tensor& t, int64_t N) { return N == 0 ? 0 : t.numel() / N; }

}  // namespace gpuopt
