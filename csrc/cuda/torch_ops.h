// The torch-side entry of the CUDA ops (LibTorch stable ABI), once for the GPU (csrc/cuda/*.cu, CudaBackend) and for
// the CPU emulation of the CUDA execution model (tools/cuda_emu/emulated_ops.cpp): the op's check (checks.h, shared
// with the CPU backend) gives its spec, the outputs are allocated (M = 0: no launch), and the kernel's parameters are
// built straight from the spec and the device pointers, then launched by launch.cuh. A Backend is constructed from
// the op's first tensor (the CUDA one holds the device guard) and provides
//   const void* in(const char* name, const Tensor& t);   // a contiguous input on the device; undefined: nullptr
//   void* out(const char* name, const Tensor& t);        // where the kernels write output t
//   Launcher& launcher();                                     // launch.cuh's Launcher
//   void finish();                                            // after the launches (the emulator copies back)
#pragma once
#include <optional>
#include <tuple>

#include "checks.h"
#include "cuda/launch.cuh"
#include "dtypes.h"
#include "torch_stable.h"

namespace gpuopt {

// Unqualified: nvcc's host pass misparses a namespace-qualified call whose argument is a braced list of a template's
// dependent members.
using cuda::vector_access;

// A Backend's device pointer of tensor t, typed.
template <typename T, class Backend>
const T* device_in(Backend& be, const char* name, const Tensor& t) {
  return static_cast<const T*>(be.in(name, t));
}
template <typename T, class Backend>
T* device_out(Backend& be, const char* name, const Tensor& t) {
  return static_cast<T*>(be.out(name, t));
}

// Calls f(TypeTag<S>, TypeTag<P>) for a norm spec's x and parameter dtypes (the kernels' storage types).
template <class Spec, typename F>
void dispatch_norm_dtypes(const Spec& s, F&& f) {
  dispatch_dtypes<cuda::DeviceStorage>(s.x_dtype, s.param_dtype, f);
}

// ------------------------------------------------------------------------------------------ kernel parameters
// What every norm rows kernel's parameters take from the spec (NormSpec or AddNormSpec): the shape, 1 / N, the
// dropout and the norm.
template <typename A, class Pm, class Spec>
void set_rows_fields(Pm& p, const Spec& s) {
  p.M = s.M;
  p.N = s.N;
  p.inv_n = cuda::inv_n_of<A>(s.N);
  p.scale = static_cast<A>(s.dropout.scale);
  p.threshold = s.dropout.threshold;
  p.rms = s.rms;
}

// The forward's parameters of both norm ops (dropout_add_norm's extend them): x (or its stand-in), the
// parameters, the seed, out, mean (nullptr for RMSNorm) and rstd.
template <typename S, typename P, typename A, class Spec, class Backend>
void set_forward_fields(dev::NdForwardParams<S, P, A>& p, const Spec& s, Backend& be, const Tensor& out,
                        const Tensor& mean, const Tensor& rstd) {
  p.x = device_in<S>(be, "x", s.x);
  p.weight = device_in<P>(be, "weight", s.weight);
  p.bias = device_in<P>(be, "bias", s.bias);
  p.seed = device_in<int64_t>(be, "seed", s.seed);
  p.out = device_out<S>(be, "out", out);
  p.mean = s.rms ? nullptr : device_out<A>(be, "mean", mean);
  p.rstd = device_out<A>(be, "rstd", rstd);
  set_rows_fields<A>(p, s);
  p.eps = static_cast<A>(s.eps);
  p.p_vec = vector_access(s.N, {p.weight, p.bias});
}

// layer_norm_dropout_relu / norm_dropout forward.
template <typename S, typename P, typename A, class Backend>
dev::NdForwardParams<S, P, A> forward_params(const NormSpec& s, Backend& be, const Tensor& out, const Tensor& mean,
                                             const Tensor& rstd) {
  dev::NdForwardParams<S, P, A> p;
  set_forward_fields(p, s, be, out, mean, rstd);
  p.relu = s.relu;
  p.x_vec = vector_access(s.N, {p.x, p.out});
  return p;
}

// dropout_add_norm forward: the norm's fields plus the residual and the stored sum (dtype U).
template <typename S, typename U, typename P, typename A, class Backend>
dev::DanForwardParams<S, U, P, A> forward_params(const AddNormSpec& s, Backend& be, const Tensor& out,
                                                 const Tensor& sum, const Tensor& mean, const Tensor& rstd) {
  dev::DanForwardParams<S, U, P, A> p;
  set_forward_fields<S, P, A>(p, s, be, out, mean, rstd);
  p.residual = device_in<U>(be, "residual", s.residual);
  p.sum = device_out<U>(be, "sum", sum);
  p.relu = false;  // not read by dropout_add_norm's kernels
  p.x_vec = vector_access(s.N, {p.x, p.out, p.residual, p.sum});
  return p;
}

// layer_norm_dropout_relu / norm_dropout backward (partial sums and row statistics: the launcher's scratch).
template <typename S, typename P, typename A, class Backend>
dev::NdBackwardParams<S, P, A> backward_params(const NormSpec& s, Backend& be, const Tensor& grad_x) {
  dev::NdBackwardParams<S, P, A> p;
  p.grad_out = device_in<S>(be, "grad_out", s.grad_out);
  p.x = device_in<S>(be, "x", s.x);
  p.weight = device_in<P>(be, "weight", s.weight);
  p.bias = device_in<P>(be, "bias", s.bias);
  // RMSNorm has no mean; nd_backward_tiled_kernel reads it anyway (and drops it): point it at rstd
  const A* mean = s.rms ? nullptr : device_in<A>(be, "mean", s.mean);
  p.rstd = device_in<A>(be, "rstd", s.rstd);
  p.mean = s.rms ? p.rstd : mean;
  p.seed = device_in<int64_t>(be, "seed", s.seed);
  p.grad_x = device_out<S>(be, "grad_x", grad_x);
  p.partial_w = p.partial_b = p.row_stats = nullptr;
  set_rows_fields<A>(p, s);
  p.ldp = cuda::partial_stride(s.N);
  p.relu = s.relu;
  p.x_vec = vector_access(s.N, {p.x, p.grad_out, p.grad_x});
  p.p_vec = vector_access(s.N, {p.weight, p.bias});
  return p;
}

// dropout_add_norm backward: x is the stored sum (dtype U); grad_residual nullptr when there is no residual.
template <typename S, typename U, typename P, typename A, class Backend>
dev::DanBackwardParams<S, U, P, A> backward_params(const AddNormSpec& s, Backend& be, const Tensor& grad_x,
                                                   const Tensor& grad_residual) {
  dev::DanBackwardParams<S, U, P, A> p;
  p.grad_out = device_in<S>(be, "grad_out", s.grad_out);
  p.grad_sum = device_in<U>(be, "grad_sum", s.grad_sum);
  p.x = device_in<U>(be, "sum", s.sum);
  p.weight = device_in<P>(be, "weight", s.weight);
  p.bias = device_in<P>(be, "bias", s.bias);
  p.mean = s.rms ? nullptr : device_in<A>(be, "mean", s.mean);
  p.rstd = device_in<A>(be, "rstd", s.rstd);
  p.seed = device_in<int64_t>(be, "seed", s.seed);
  p.grad_x = device_out<S>(be, "grad_x", grad_x);
  p.grad_residual = s.has_residual ? device_out<U>(be, "grad_residual", grad_residual) : nullptr;
  p.partial_w = p.partial_b = p.row_stats = nullptr;
  set_rows_fields<A>(p, s);
  p.ldp = cuda::partial_stride(s.N);
  p.x_vec = vector_access(s.N, {p.grad_out, p.x, p.grad_sum, p.grad_x, p.grad_residual});
  p.p_vec = vector_access(s.N, {p.weight});  // the bias is not read
  return p;
}

// bias_relu / bias_act forward.
template <typename S, typename B, class Backend>
dev::BiasActParams<S, B> forward_params(const BiasActSpec& s, Backend& be, const Tensor& out) {
  dev::BiasActParams<S, B> p;
  p.x = device_in<S>(be, "x", s.x);
  p.bias = device_in<B>(be, "bias", s.bias);
  p.out = device_out<S>(be, "out", out);
  p.M = s.M;
  p.N = s.N;
  return p;
}

// bias_relu / bias_act backward: saved is the output for relu (no bias read), x otherwise.
template <typename S, typename B, class Backend>
dev::BiasActBackwardParams<S, B> backward_params(const BiasActSpec& s, Backend& be, const Tensor& grad_x) {
  dev::BiasActBackwardParams<S, B> p;
  p.grad_out = device_in<S>(be, "grad_out", s.grad_out);
  p.saved = device_in<S>(be, s.bias.defined() ? "saved" : "out", s.saved);
  p.bias = s.act == kActRelu ? nullptr : device_in<B>(be, "bias", s.bias);
  p.grad_x = device_out<S>(be, "grad_x", grad_x);
  p.partial = nullptr;
  p.M = s.M;
  p.N = s.N;
  p.ldp = cuda::partial_stride(s.N);
  return p;
}

// ------------------------------------------------------------------------------------------ the ops
// layer_norm_dropout_relu and norm_dropout (s.rms, s.relu; mean is (0,) for RMSNorm): (out, mean, rstd).
template <class Backend>
std::tuple<Tensor, Tensor, Tensor> norm_forward(const NormSpec& s) {
  Backend be(s.x);
  Tensor out = empty_on(s.x, s.x.sizes(), s.x_dtype);
  Tensor mean = empty_on(s.x, {s.rms ? 0 : s.M}, s.acc_dtype);
  Tensor rstd = empty_on(s.x, {s.M}, s.acc_dtype);
  if (s.M == 0) return {out, mean, rstd};
  dispatch_norm_dtypes(s, [&](auto st, auto pt) {
    using S = typename decltype(st)::type;
    using P = typename decltype(pt)::type;
    cuda::run_nd_forward(forward_params<S, P, acc_type_t<S>>(s, be, out, mean, rstd), dev::read_map(s.dropout),
                         be.launcher());
  });
  be.finish();
  return {out, mean, rstd};
}

// The backwards of both: (grad_x, grad_weight, grad_bias), an absent parameter's gradient (0,)-shaped.
template <class Backend>
std::tuple<Tensor, Tensor, Tensor> norm_backward(const NormSpec& s) {
  Backend be(s.x);
  const DType pt = s.param_dtype;
  Tensor grad_x = empty_on(s.x, s.x.sizes(), s.x_dtype);
  if (s.M == 0) {  // sums over no rows
    return {grad_x, param_grad_on(s.x, s.weight.defined(), s.N, pt), param_grad_on(s.x, s.bias.defined(), s.N, pt)};
  }
  // every column is written by the stage-2 sum: no zero fill
  Tensor grad_w = empty_on(s.x, {s.weight.defined() ? s.N : 0}, pt);
  Tensor grad_b = empty_on(s.x, {s.bias.defined() ? s.N : 0}, pt);
  dispatch_norm_dtypes(s, [&](auto st, auto ptag) {
    using S = typename decltype(st)::type;
    using P = typename decltype(ptag)::type;
    const auto params = backward_params<S, P, acc_type_t<S>>(s, be, grad_x);
    P* gw = s.weight.defined() ? device_out<P>(be, "grad_weight", grad_w) : nullptr;
    P* gb = s.bias.defined() ? device_out<P>(be, "grad_bias", grad_b) : nullptr;
    cuda::run_nd_backward(params, dev::read_map(s.dropout), gw, gb, be.launcher());
  });
  be.finish();
  return {grad_x, grad_w, grad_b};
}

template <class Backend>
std::tuple<Tensor, Tensor, Tensor> ldr_forward_op(const Tensor& x, const std::optional<Tensor>& weight,
                                                  const std::optional<Tensor>& bias, const Tensor& seed, double p,
                                                  double eps) {
  return norm_forward<Backend>(check_ldr_forward(x, weight, bias, seed, p, eps));
}

template <class Backend>
std::tuple<Tensor, Tensor, Tensor> ldr_backward_op(const Tensor& grad_out, const Tensor& x,
                                                   const std::optional<Tensor>& weight,
                                                   const std::optional<Tensor>& bias, const Tensor& mean,
                                                   const Tensor& rstd, const Tensor& seed, double p) {
  return norm_backward<Backend>(check_ldr_backward(grad_out, x, weight, bias, mean, rstd, seed, p));
}

// norm_dropout: layer_norm_dropout_relu with RMSNorm and the ReLU as flags (the same kernels).
template <class Backend>
std::tuple<Tensor, Tensor, Tensor> nd_forward_op(const Tensor& x, const std::optional<Tensor>& weight,
                                                 const std::optional<Tensor>& bias, const Tensor& seed, double p,
                                                 double eps, bool rms, bool relu) {
  return norm_forward<Backend>(check_norm_dropout(x, weight, bias, seed, p, eps, rms, relu));
}

template <class Backend>
std::tuple<Tensor, Tensor, Tensor> nd_backward_op(const Tensor& grad_out, const Tensor& x,
                                                  const std::optional<Tensor>& weight,
                                                  const std::optional<Tensor>& bias, const Tensor& mean,
                                                  const Tensor& rstd, const Tensor& seed, double p, bool rms,
                                                  bool relu) {
  return norm_backward<Backend>(check_norm_dropout_backward(grad_out, x, weight, bias, mean, rstd, seed, p, rms, relu));
}

// bias_relu and bias_act: out.
template <class Backend>
Tensor bias_act_forward(const BiasActSpec& s) {
  Backend be(s.x);
  Tensor out = empty_on(s.x, s.x.sizes(), s.x_dtype);
  if (s.M == 0) return out;
  dispatch_act(s.act, [&](auto ac) {
    dispatch_dtypes<cuda::DeviceStorage>(s.x_dtype, s.bias_dtype, [&](auto st, auto bt) {
      using S = typename decltype(st)::type;
      using B = typename decltype(bt)::type;
      cuda::run_bias_act<decltype(ac)::value>(forward_params<S, B>(s, be, out), be.launcher());
    });
  });
  be.finish();
  return out;
}

// Their backwards: (grad_x, grad_bias), grad_bias in the accumulation dtype (the unrounded sum, so AMP's fp32
// bias gets it exactly).
template <class Backend>
std::tuple<Tensor, Tensor> bias_act_backward(const BiasActSpec& s) {
  Backend be(s.saved);
  Tensor grad_x = empty_on(s.saved, s.saved.sizes(), s.x_dtype);
  if (s.M == 0) return {grad_x, zeros_on(s.saved, {s.N}, s.acc_dtype)};
  Tensor grad_b = empty_on(s.saved, {s.N}, s.acc_dtype);
  dispatch_act(s.act, [&](auto ac) {
    constexpr int kAct = decltype(ac)::value;
    auto launch = [&](auto st, auto bt) {
      using S = typename decltype(st)::type;
      const auto params = backward_params<S, typename decltype(bt)::type>(s, be, grad_x);
      cuda::run_bias_act_backward<kAct>(params, device_out<acc_type_t<S>>(be, "grad_bias", grad_b), be.launcher());
    };
    if constexpr (kAct == kActRelu) {  // no bias read: one instantiation a dtype
      dispatch_dtype<cuda::DeviceStorage>(s.x_dtype, [&](auto st) { launch(st, st); });
    } else {
      dispatch_dtypes<cuda::DeviceStorage>(s.x_dtype, s.bias_dtype, launch);
    }
  });
  be.finish();
  return {grad_x, grad_b};
}

template <class Backend>
Tensor bias_relu_op(const Tensor& x, const Tensor& bias) {
  return bias_act_forward<Backend>(check_bias_relu(x, bias));
}

template <class Backend>
std::tuple<Tensor, Tensor> bias_relu_backward_op(const Tensor& grad_out, const Tensor& out) {
  return bias_act_backward<Backend>(check_bias_relu_backward(grad_out, out));
}

template <class Backend>
Tensor bias_act_op(const Tensor& x, const Tensor& bias, int64_t act) {
  return bias_act_forward<Backend>(check_bias_act(x, bias, act));
}

template <class Backend>
std::tuple<Tensor, Tensor> bias_act_backward_op(const Tensor& grad_out, const Tensor& saved, const Tensor& bias,
                                                int64_t act) {
  return bias_act_backward<Backend>(check_bias_act_backward(grad_out, saved, bias, act));
}

// Calls f(TypeTag<S>, TypeTag<U>, TypeTag<P>) for dropout_add_norm's x, sum and parameter dtypes.
template <typename F>
void dispatch_add_norm_dtypes(const AddNormSpec& s, F&& f) {
  dispatch_dtypes<cuda::DeviceStorage>(s.x_dtype, s.sum_dtype, s.param_dtype, f);
}

// dropout_add_norm: (out, sum, mean, rstd); mean is (0,) for RMSNorm.
template <class Backend>
std::tuple<Tensor, Tensor, Tensor, Tensor> dan_forward_op(const Tensor& x, const std::optional<Tensor>& residual,
                                                          const std::optional<Tensor>& weight,
                                                          const std::optional<Tensor>& bias, const Tensor& seed,
                                                          double p, double eps, bool rms, bool residual_in_fp32) {
  const AddNormSpec s = check_dropout_add_norm(x, residual, weight, bias, seed, p, eps, rms, residual_in_fp32);
  Backend be(s.x);
  Tensor out = empty_on(s.x, s.x.sizes(), s.x_dtype);
  Tensor sum = empty_on(s.x, s.x.sizes(), s.sum_dtype);
  Tensor mean = empty_on(s.x, {s.rms ? 0 : s.M}, s.acc_dtype);
  Tensor rstd = empty_on(s.x, {s.M}, s.acc_dtype);
  if (s.M == 0) return {out, sum, mean, rstd};
  dispatch_add_norm_dtypes(s, [&](auto st, auto ut, auto pt) {
    using S = typename decltype(st)::type;
    using U = typename decltype(ut)::type;
    using P = typename decltype(pt)::type;
    cuda::run_dan_forward(forward_params<S, U, P, acc_type_t<S>>(s, be, out, sum, mean, rstd), dev::read_map(s.dropout),
                          be.launcher());
  });
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
  const AddNormSpec s =
      check_dropout_add_norm_backward(grad_out, grad_sum, sum, weight, bias, mean, rstd, seed, p, rms, has_residual);
  Backend be(s.sum);
  const DType pt = s.param_dtype;
  Tensor grad_x = empty_on(s.sum, s.sum.sizes(), s.x_dtype);
  Tensor grad_res = s.has_residual ? empty_on(s.sum, s.sum.sizes(), s.sum_dtype) : empty_on(s.sum, {0}, s.sum_dtype);
  if (s.M == 0) {  // sums over no rows
    return {grad_x, grad_res, param_grad_on(s.sum, s.weight.defined(), s.N, pt),
            param_grad_on(s.sum, s.bias.defined(), s.N, pt)};
  }
  // every column is written by the stage-2 sum: no zero fill
  Tensor grad_w = empty_on(s.sum, {s.weight.defined() ? s.N : 0}, pt);
  Tensor grad_b = empty_on(s.sum, {s.bias.defined() ? s.N : 0}, pt);
  dispatch_add_norm_dtypes(s, [&](auto st, auto ut, auto ptag) {
    using S = typename decltype(st)::type;
    using U = typename decltype(ut)::type;
    using P = typename decltype(ptag)::type;
    const auto params = backward_params<S, U, P, acc_type_t<S>>(s, be, grad_x, grad_res);
    P* gw = s.weight.defined() ? device_out<P>(be, "grad_weight", grad_w) : nullptr;
    P* gb = s.bias.defined() ? device_out<P>(be, "grad_bias", grad_b) : nullptr;
    cuda::run_dan_backward(params, dev::read_map(s.dropout), gw, gb, be.launcher());
  });
  be.finish();
  return {grad_x, grad_res, grad_w, grad_b};
}

}  // namespace gpuopt
