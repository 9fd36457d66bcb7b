// The ATen side of the CUDA ops, once for the GPU (csrc/cuda/*.cu, CudaBackend) and for the CPU emulation of the
// CUDA execution model (tests/cuda_emu/emulated_ops.cpp): checks (shared with the CPU backend), outputs, empty
// inputs, then the ATen-free launch sequence of launch.cuh. A Backend is constructed from x (the CUDA one
// holds the device guard) and provides
//   const void* in(const char* name, const at::Tensor& t);   // a contiguous input on the device; undefined: nullptr
//   void* out(const char* name, const at::Tensor& t);        // where the kernels write output t
//   Launcher& launcher();                                     // launch.cuh's Launcher
//   void finish();                                            // after the launches (the emulator copies back)
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <optional>
#include <tuple>

#include "checks.h"
#include "cuda/launch.cuh"

namespace gpuopt {

inline cuda::DType dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return cuda::DType::kFloat16;
    case at::kBFloat16: return cuda::DType::kBFloat16;
    case at::kFloat: return cuda::DType::kFloat32;
    case at::kDouble: return cuda::DType::kFloat64;
    default: TORCH_CHECK(false, "gpuopt: internal error: unsupported dtype ", t);
  }
}

template <class Backend>
std::tuple<at::Tensor, at::Tensor, at::Tensor> ldr_forward_op(const at::Tensor& x,
                                                               const std::optional<at::Tensor>& weight,
                                                               const std::optional<at::Tensor>& bias,
                                                               const at::Tensor& seed, double p, double eps) {
  LdrArgs a = check_ldr_forward(x, weight, bias, seed, p, eps);
  Backend be(a.x);
  at::Tensor out = at::empty(x.sizes(), a.x.options());
  at::Tensor mean = at::empty({a.M}, a.x.options().dtype(a.acc_dtype));
  at::Tensor rstd = at::empty({a.M}, a.x.options().dtype(a.acc_dtype));
  if (a.M == 0) return {out, mean, rstd};
  const at::Tensor seed_c = seed.contiguous();
  cuda::LdrForwardBuffers b{be.in("x", a.x), be.in("weight", a.weight), be.in("bias", a.bias),
                            static_cast<const int64_t*>(be.in("seed", seed_c)), be.out("out", out),
                            be.out("mean", mean), be.out("rstd", rstd), a.M, a.N, dtype_of(a.x.scalar_type()),
                            dtype_of(a.param_dtype), eps, a.dropout};
  cuda::run_ldr_forward(b, be.launcher());
  be.finish();
  return {out, mean, rstd};
}

template <class Backend>
std::tuple<at::Tensor, at::Tensor, at::Tensor> ldr_backward_op(
    const at::Tensor& grad_out, const at::Tensor& x, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const at::Tensor& mean, const at::Tensor& rstd, const at::Tensor& seed,
    double p) {
  LdrBackwardArgs bw = check_ldr_backward(grad_out, x, weight, bias, mean, rstd, seed, p);
  const LdrArgs& a = bw.fwd;
  Backend be(a.x);
  const auto popts = a.x.options().dtype(a.param_dtype);
  at::Tensor grad_x = at::empty(x.sizes(), a.x.options());
  if (a.M == 0) {  // sums over no rows
    return {grad_x, a.weight.defined() ? at::zeros({a.N}, popts) : at::empty({0}, popts),
            a.bias.defined() ? at::zeros({a.N}, popts) : at::empty({0}, popts)};
  }
  // every column is written by the stage-2 sum: no zero fill
  at::Tensor grad_w = at::empty({a.weight.defined() ? a.N : 0}, popts);
  at::Tensor grad_b = at::empty({a.bias.defined() ? a.N : 0}, popts);
  const at::Tensor seed_c = seed.contiguous();
  cuda::LdrBackwardBuffers b{be.in("grad_out", bw.grad_out), be.in("x", a.x), be.in("weight", a.weight),
                             be.in("bias", a.bias), be.in("mean", bw.mean), be.in("rstd", bw.rstd),
                             static_cast<const int64_t*>(be.in("seed", seed_c)),
                             be.out("grad_x", grad_x),
                             a.weight.defined() ? be.out("grad_weight", grad_w) : nullptr,
                             a.bias.defined() ? be.out("grad_bias", grad_b) : nullptr, a.M, a.N,
                             dtype_of(a.x.scalar_type()), dtype_of(a.param_dtype), a.dropout};
  cuda::run_ldr_backward(b, be.launcher());
  be.finish();
  return {grad_x, grad_w, grad_b};
}

template <class Backend>
at::Tensor bias_relu_op(const at::Tensor& x, const at::Tensor& bias) {
  BiasReluArgs a = check_bias_relu(x, bias);
  Backend be(a.x);
  at::Tensor out = at::empty(x.sizes(), a.x.options());
  if (a.M == 0) return out;
  cuda::BiasReluBuffers b{be.in("x", a.x), be.in("bias", a.bias), be.out("out", out), a.M, a.N,
                          dtype_of(a.x.scalar_type()), dtype_of(a.bias.scalar_type())};
  cuda::run_bias_relu(b, be.launcher());
  be.finish();
  return out;
}

template <class Backend>
std::tuple<at::Tensor, at::Tensor> bias_relu_backward_op(const at::Tensor& grad_out, const at::Tensor& out) {
  BiasReluBackwardArgs a = check_bias_relu_backward(grad_out, out);
  Backend be(a.out);
  at::Tensor grad_x = at::empty(out.sizes(), a.out.options());
  const auto acc_opts = a.out.options().dtype(a.acc_dtype);  // unrounded sum: AMP's fp32 bias gets it exactly
  if (a.M == 0) return {grad_x, at::zeros({a.N}, acc_opts)};
  at::Tensor grad_b = at::empty({a.N}, acc_opts);
  cuda::BiasReluBackwardBuffers b{be.in("grad_out", a.grad_out), be.in("out", a.out), be.out("grad_x", grad_x),
                                  be.out("grad_bias", grad_b), a.M, a.N, dtype_of(a.out.scalar_type())};
  cuda::run_bias_relu_backward(b, be.launcher());
  be.finish();
  return {grad_x, grad_b};
}

}  // namespace gpuopt
