// The torch side of the CUDA ops (LibTorch stable ABI), once for the GPU (csrc/cuda/*.cu, CudaBackend) and for the CPU emulation of the
// CUDA execution model (tools/cuda_emu/emulated_ops.cpp): checks (shared with the CPU backend), outputs, empty
// inputs, then the ATen-free launch sequence of launch.cuh. A Backend is constructed from x (the CUDA one
// holds the device guard) and provides
//   const void* in(const char* name, const Tensor& t);   // a contiguous input on the device; undefined: nullptr
//   void* out(const char* name, const Tensor& t);        // where the kernels write output t
//   Launcher& launcher();                                     // launch.cuh's Launcher
//   void finish();                                            // after the launches (the emulator copies back)
#pragma once
#include <optional>
#include <tuple>

#include "checks.h"
#include "cuda/launch.cuh"
#include "torch_stable.h"

namespace gpuopt {

inline cuda::DType dtype_of(ScalarType t) {
  switch (t) {
    case kHalf:
      return cuda::DType::kFloat16;
    case kBFloat16:
      return cuda::DType::kBFloat16;
    case kFloat:
      return cuda::DType::kFloat32;
    case kDouble:
      return cuda::DType::kFloat64;
    default:
      fail(str_cat("gpuopt: internal error: unsupported dtype ", torch::headeronly::toString(t)));
  }
}

// layer_norm_dropout_relu and norm_dropout (a.rms, a.relu; mean is (0,) for RMSNorm): (out, mean, rstd).
template <class Backend>
std::tuple<Tensor, Tensor, Tensor> norm_forward(const LdrArgs& a, const Tensor& x, const Tensor& seed, double eps) {
  Backend be(a.x);
  Tensor out = empty_on(a.x, x.sizes(), x.scalar_type());
  Tensor mean = empty_on(a.x, {a.rms ? 0 : a.M}, a.acc_dtype);
  Tensor rstd = empty_on(a.x, {a.M}, a.acc_dtype);
  if (a.M == 0) return {out, mean, rstd};
  const Tensor seed_c = as_contiguous(seed);
  cuda::LdrForwardBuffers b{be.in("x", a.x),
                            be.in("weight", a.weight),
                            be.in("bias", a.bias),
                            static_cast<const int64_t*>(be.in("seed", seed_c)),
                            be.out("out", out),
                            a.rms ? nullptr : be.out("mean", mean),
                            be.out("rstd", rstd),
                            a.M,
                            a.N,
                            dtype_of(a.x.scalar_type()),
                            dtype_of(a.param_dtype),
                            eps,
                            a.rms,
                            a.relu,
                            a.dropout};
  cuda::run_ldr_forward(b, be.launcher());
  be.finish();
  return {out, mean, rstd};
}

// The backwards of both: (grad_x, grad_weight, grad_bias), an absent parameter's gradient (0,)-shaped.
template <class Backend>
std::tuple<Tensor, Tensor, Tensor> norm_backward(const LdrBackwardArgs& bw, const Tensor& x, const Tensor& seed) {
  const LdrArgs& a = bw.fwd;
  Backend be(a.x);
  const ScalarType pt = a.param_dtype;
  Tensor grad_x = empty_on(a.x, x.sizes(), x.scalar_type());
  if (a.M == 0) {  // sums over no rows
    return {grad_x, a.weight.defined() ? zeros_on(a.x, {a.N}, pt) : empty_on(a.x, {0}, pt),
            a.bias.defined() ? zeros_on(a.x, {a.N}, pt) : empty_on(a.x, {0}, pt)};
  }
  // every column is written by the stage-2 sum: no zero fill
  Tensor grad_w = empty_on(a.x, {a.weight.defined() ? a.N : 0}, pt);
  Tensor grad_b = empty_on(a.x, {a.bias.defined() ? a.N : 0}, pt);
  const Tensor seed_c = as_contiguous(seed);
  cuda::LdrBackwardBuffers b{be.in("grad_out", bw.grad_out),
                             be.in("x", a.x),
                             be.in("weight", a.weight),
                             be.in("bias", a.bias),
                             a.rms ? nullptr : be.in("mean", bw.mean),
                             be.in("rstd", bw.rstd),
                             static_cast<const int64_t*>(be.in("seed", seed_c)),
                             be.out("grad_x", grad_x),
                             a.weight.defined() ? be.out("grad_weight", grad_w) : nullptr,
                             a.bias.defined() ? be.out("grad_bias", grad_b) : nullptr,
                             a.M,
                             a.N,
                             dtype_of(a.x.scalar_type()),
                             dtype_of(a.param_dtype),
                             a.rms,
                             a.relu,
                             a.dropout};
  cuda::run_ldr_backward(b, be.launcher());
  be.finish();
  return {grad_x, grad_w, grad_b};
}

template <class Backend>
std::tuple<Tensor, Tensor, Tensor> ldr_forward_op(const Tensor& x, const std::optional<Tensor>& weight,
                                                  const std::optional<Tensor>& bias, const Tensor& seed, double p,
                                                  double eps) {
  return norm_forward<Backend>(check_ldr_forward(x, weight, bias, seed, p, eps), x, seed, eps);
}

template <class Backend>
std::tuple<Tensor, Tensor, Tensor> ldr_backward_op(const Tensor& grad_out, const Tensor& x,
                                                   const std::optional<Tensor>& weight,
                                                   const std::optional<Tensor>& bias, const Tensor& mean,
                                                   const Tensor& rstd, const Tensor& seed, double p) {
  return norm_backward<Backend>(check_ldr_backward(grad_out, x, weight, bias, mean, rstd, seed, p), x, seed);
}

// norm_dropout: layer_norm_dropout_relu with RMSNorm and the ReLU as flags (the same kernels).
template <class Backend>
std::tuple<Tensor, Tensor, Tensor> nd_forward_op(const Tensor& x, const std::optional<Tensor>& weight,
                                                 const std::optional<Tensor>& bias, const Tensor& seed, double p,
                                                 double eps, bool rms, bool relu) {
  return norm_forward<Backend>(check_norm_dropout(x, weight, bias, seed, p, eps, rms, relu), x, seed, eps);
}

template <class Backend>
std::tuple<Tensor, Tensor, Tensor> nd_backward_op(const Tensor& grad_out, const Tensor& x,
                                                  const std::optional<Tensor>& weight,
                                                  const std::optional<Tensor>& bias, const Tensor& mean,
                                                  const Tensor& rstd, const Tensor& seed, double p, bool rms,
                                                  bool relu) {
  return norm_backward<Backend>(check_norm_dropout_backward(grad_out, x, weight, bias, mean, rstd, seed, p, rms, relu),
                                x, seed);
}

template <class Backend>
Tensor bias_relu_op(const Tensor& x, const Tensor& bias) {
  BiasReluArgs a = check_bias_relu(x, bias);
  Backend be(a.x);
  Tensor out = empty_on(a.x, x.sizes(), x.scalar_type());
  if (a.M == 0) return out;
  cuda::BiasReluBuffers b{be.in("x", a.x),
                          be.in("bias", a.bias),
                          be.out("out", out),
                          a.M,
                          a.N,
                          dtype_of(a.x.scalar_type()),
                          dtype_of(a.bias.scalar_type()),
                          kActRelu};
  cuda::run_bias_relu(b, be.launcher());
  be.finish();
  return out;
}

template <class Backend>
std::tuple<Tensor, Tensor> bias_relu_backward_op(const Tensor& grad_out, const Tensor& out) {
  BiasReluBackwardArgs a = check_bias_relu_backward(grad_out, out);
  Backend be(a.out);
  Tensor grad_x = empty_on(a.out, out.sizes(), out.scalar_type());
  // grad_bias in the accumulation dtype: the unrounded sum, so AMP's fp32 bias gets it exactly
  if (a.M == 0) return {grad_x, zeros_on(a.out, {a.N}, a.acc_dtype)};
  Tensor grad_b = empty_on(a.out, {a.N}, a.acc_dtype);
  cuda::BiasReluBackwardBuffers b{be.in("grad_out", a.grad_out),
                                  be.in("out", a.out),
                                  nullptr,
                                  be.out("grad_x", grad_x),
                                  be.out("grad_bias", grad_b),
                                  a.M,
                                  a.N,
                                  dtype_of(a.out.scalar_type()),
                                  dtype_of(a.out.scalar_type()),
                                  kActRelu};
  cuda::run_bias_relu_backward(b, be.launcher());
  be.finish();
  return {grad_x, grad_b};
}

template <class Backend>
Tensor bias_act_op(const Tensor& x, const Tensor& bias, int64_t act) {
  BiasActArgs a = check_bias_act(x, bias, act);
  Backend be(a.x);
  Tensor out = empty_on(a.x, x.sizes(), x.scalar_type());
  if (a.M == 0) return out;
  cuda::BiasReluBuffers b{be.in("x", a.x),
                          be.in("bias", a.bias),
                          be.out("out", out),
                          a.M,
                          a.N,
                          dtype_of(a.x.scalar_type()),
                          dtype_of(a.bias.scalar_type()),
                          a.act};
  cuda::run_bias_relu(b, be.launcher());
  be.finish();
  return out;
}

template <class Backend>
std::tuple<Tensor, Tensor> bias_act_backward_op(const Tensor& grad_out, const Tensor& saved, const Tensor& bias,
                                                int64_t act) {
  BiasActBackwardArgs a = check_bias_act_backward(grad_out, saved, bias, act);
  Backend be(a.saved);
  Tensor grad_x = empty_on(a.saved, saved.sizes(), saved.scalar_type());
  if (a.M == 0) return {grad_x, zeros_on(a.saved, {a.N}, a.acc_dtype)};
  Tensor grad_b = empty_on(a.saved, {a.N}, a.acc_dtype);
  cuda::BiasReluBackwardBuffers b{be.in("grad_out", a.grad_out),
                                  be.in("saved", a.saved),
                                  a.act == kActRelu ? nullptr : be.in("bias", a.bias),
                                  be.out("grad_x", grad_x),
                                  be.out("grad_bias", grad_b),
                                  a.M,
                                  a.N,
                                  dtype_of(a.saved.scalar_type()),
                                  dtype_of(a.bias.scalar_type()),
                                  a.act};
  cuda::run_bias_relu_backward(b, be.launcher());
  be.finish();
  return {grad_x, grad_b};
}

// dropout_add_norm: (out, sum, mean, rstd); mean is (0,) for RMSNorm.
template <class Backend>
std::tuple<Tensor, Tensor, Tensor, Tensor> dan_forward_op(const Tensor& x, const std::optional<Tensor>& residual,
                                                          const std::optional<Tensor>& weight,
                                                          const std::optional<Tensor>& bias, const Tensor& seed,
                                                          double p, double eps, bool rms, bool residual_in_fp32) {
  DanArgs a = check_dropout_add_norm(x, residual, weight, bias, seed, p, eps, rms, residual_in_fp32);
  Backend be(a.x);
  Tensor out = empty_on(a.x, x.sizes(), x.scalar_type());
  Tensor sum = empty_on(a.x, x.sizes(), a.sum_dtype);
  Tensor mean = empty_on(a.x, {rms ? 0 : a.M}, a.acc_dtype);
  Tensor rstd = empty_on(a.x, {a.M}, a.acc_dtype);
  if (a.M == 0) return {out, sum, mean, rstd};
  const Tensor seed_c = as_contiguous(seed);
  cuda::DanForwardBuffers b{be.in("x", a.x),
                            be.in("residual", a.residual),
                            be.in("weight", a.weight),
                            be.in("bias", a.bias),
                            static_cast<const int64_t*>(be.in("seed", seed_c)),
                            be.out("out", out),
                            be.out("sum", sum),
                            rms ? nullptr : be.out("mean", mean),
                            be.out("rstd", rstd),
                            a.M,
                            a.N,
                            dtype_of(a.x.scalar_type()),
                            dtype_of(a.sum_dtype),
                            dtype_of(a.param_dtype),
                            eps,
                            rms,
                            a.dropout};
  cuda::run_dan_forward(b, be.launcher());
  be.finish();
  return {out, sum, mean, rstd};
}

// dropout_add_norm_backward: (grad_x, grad_residual, grad_weight, grad_bias), the absent ones (0,)-shaped.
template <class Backend>
std::tuple<Tensor, Tensor, Tensor, Tensor> dan_backward_op(const Tensor& grad_out,
                                                           const std::optional<Tensor>& grad_sum, const Tensor& sum,
                                                           const std::optional<Tensor>& weight,
                                                           const std::optional<Tensor>& bias, const Tensor& mean,
                                                           const Tensor& rstd, const Tensor& seed, double p, bool rms,
                                                           bool has_residual) {
  DanBackwardArgs a =
      check_dropout_add_norm_backward(grad_out, grad_sum, sum, weight, bias, mean, rstd, seed, p, rms, has_residual);
  Backend be(a.sum);
  const ScalarType pt = a.param_dtype;
  Tensor grad_x = empty_on(a.sum, sum.sizes(), a.grad_out.scalar_type());
  Tensor grad_res =
      has_residual ? empty_on(a.sum, sum.sizes(), a.sum.scalar_type()) : empty_on(a.sum, {0}, a.sum.scalar_type());
  if (a.M == 0) {  // sums over no rows
    return {grad_x, grad_res, a.weight.defined() ? zeros_on(a.sum, {a.N}, pt) : empty_on(a.sum, {0}, pt),
            a.bias.defined() ? zeros_on(a.sum, {a.N}, pt) : empty_on(a.sum, {0}, pt)};
  }
  // every column is written by the stage-2 sum: no zero fill
  Tensor grad_w = empty_on(a.sum, {a.weight.defined() ? a.N : 0}, pt);
  Tensor grad_b = empty_on(a.sum, {a.bias.defined() ? a.N : 0}, pt);
  const Tensor seed_c = as_contiguous(seed);
  cuda::DanBackwardBuffers b{be.in("grad_out", a.grad_out),
                             be.in("grad_sum", a.grad_sum),
                             be.in("sum", a.sum),
                             be.in("weight", a.weight),
                             be.in("bias", a.bias),
                             rms ? nullptr : be.in("mean", a.mean),
                             be.in("rstd", a.rstd),
                             static_cast<const int64_t*>(be.in("seed", seed_c)),
                             be.out("grad_x", grad_x),
                             has_residual ? be.out("grad_residual", grad_res) : nullptr,
                             a.weight.defined() ? be.out("grad_weight", grad_w) : nullptr,
                             a.bias.defined() ? be.out("grad_bias", grad_b) : nullptr,
                             a.M,
                             a.N,
                             dtype_of(a.x_dtype),
                             dtype_of(a.sum_dtype),
                             dtype_of(pt),
                             rms,
                             a.dropout};
  cuda::run_dan_backward(b, be.launcher());
  be.finish();
  return {grad_x, grad_res, grad_w, grad_b};
}

}  // namespace gpuopt
