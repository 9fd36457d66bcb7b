// The schemas of the gpuopt ops, once: csrc/ops.cpp defines them in STABLE_TORCH_LIBRARY(gpuopt), and the CPU
// emulation of the CUDA backend (tools/cuda_emu) registers the same ones under its own namespace.
#pragma once

namespace gpuopt {

constexpr const char* kLdrForwardSchema =
    "layer_norm_dropout_relu(Tensor x, Tensor? weight, Tensor? bias, Tensor seed, float p, float eps)"
    " -> (Tensor out, Tensor mean, Tensor rstd)";
constexpr const char* kLdrBackwardSchema =
    "layer_norm_dropout_relu_backward(Tensor grad_out, Tensor x, Tensor? weight, Tensor? bias, Tensor mean,"
    " Tensor rstd, Tensor seed, float p) -> (Tensor grad_x, Tensor grad_weight, Tensor grad_bias)";
constexpr const char* kBiasReluSchema = "bias_relu(Tensor x, Tensor bias) -> Tensor";
constexpr const char* kBiasReluBackwardSchema =
    "bias_relu_backward(Tensor grad_out, Tensor out) -> (Tensor grad_x, Tensor grad_bias)";
constexpr const char* kBiasActSchema = "bias_act(Tensor x, Tensor bias, int act) -> Tensor";
constexpr const char* kBiasActBackwardSchema =
    "bias_act_backward(Tensor grad_out, Tensor saved, Tensor bias, int act) -> (Tensor grad_x, Tensor grad_bias)";
constexpr const char* kDanForwardSchema =
    "dropout_add_norm(Tensor x, Tensor? residual, Tensor? weight, Tensor? bias, Tensor seed, float p, float eps,"
    " bool rms, bool residual_in_fp32) -> (Tensor out, Tensor sum, Tensor mean, Tensor rstd)";
constexpr const char* kDanBackwardSchema =
    "dropout_add_norm_backward(Tensor grad_out, Tensor? grad_sum, Tensor sum, Tensor? weight, Tensor? bias,"
    " Tensor mean, Tensor rstd, Tensor seed, float p, bool rms, bool has_residual)"
    " -> (Tensor grad_x, Tensor grad_residual, Tensor grad_weight, Tensor grad_bias)";
// gated_act: out = dropout(act(gate) * up). up None: gate's last dimension holds [gate | up] (2F), out's is F;
// the backward then writes [grad_gate | grad_up] into grad_gate and returns grad_up as (0,).
constexpr const char* kGatedActSchema = "gated_act(Tensor gate, Tensor? up, Tensor seed, float p, int act) -> Tensor";
constexpr const char* kGatedActBackwardSchema =
    "gated_act_backward(Tensor grad_out, Tensor gate, Tensor? up, Tensor seed, float p, int act)"
    " -> (Tensor grad_gate, Tensor grad_up)";
constexpr const char* kNormDropoutSchema =
    "norm_dropout(Tensor x, Tensor? weight, Tensor? bias, Tensor seed, float p, float eps, bool rms, bool relu)"
    " -> (Tensor out, Tensor mean, Tensor rstd)";
constexpr const char* kNormDropoutBackwardSchema =
    "norm_dropout_backward(Tensor grad_out, Tensor x, Tensor? weight, Tensor? bias, Tensor mean, Tensor rstd,"
    " Tensor seed, float p, bool rms, bool relu) -> (Tensor grad_x, Tensor grad_weight, Tensor grad_bias)";

// Library: anything with def(const char* schema), e.g. the stable ABI's StableLibrary.
template <class Library>
void define_schemas(Library& m) {
  m.def(kLdrForwardSchema);
  m.def(kLdrBackwardSchema);
  m.def(kBiasReluSchema);
  m.def(kBiasReluBackwardSchema);
  m.def(kDanForwardSchema);
  m.def(kDanBackwardSchema);
  m.def(kBiasActSchema);
  m.def(kBiasActBackwardSchema);
  m.def(kNormDropoutSchema);
  m.def(kNormDropoutBackwardSchema);
  m.def(kGatedActSchema);
  m.def(kGatedActBackwardSchema);
}

}  // namespace gpuopt
