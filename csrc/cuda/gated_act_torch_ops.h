// The torch-side entry of gated_act and its backward on the CUDA backend (torch_ops.h's Backend: the GPU's, or the
// emulator's in tools/cuda_emu/emulated_ops.cpp): the check shared with the CPU backend gives the spec, the outputs
// are allocated (M = 0: no launch), the kernel's parameters are built from the spec, then gated_act_launch.cuh.
#pragma once
#include <optional>
#include <tuple>
#include <vector>

#include "checks.h"
#include "cuda/gated_act_launch.cuh"
#include "cuda/torch_ops.h"
#include "dtypes.h"
#include "torch_stable.h"

namespace gpuopt {

// Calls f(std::integral_constant<int, kAct>, TypeTag<S>) for the spec's activation and dtype.
template <typename F>
void dispatch_gated(const GatedSpec& s, F&& f) {
  dispatch_act(s.act, [&](auto ac) { dispatch_dtype<cuda::DeviceStorage>(s.dtype, [&](auto st) { f(ac, st); }); });
}

// gate and up of the spec (packed: up = gate + F), and the dropout's scale and threshold.
template <typename S, class Pm, class Backend>
void set_gated_inputs(Pm& p, const GatedSpec& s, Backend& be) {
  p.gate = device_in<S>(be, "gate", s.gate);
  p.up = s.packed() ? p.gate + s.F : device_in<S>(be, "up", s.up);
  p.seed = device_in<int64_t>(be, "seed", s.seed);
  p.scale = static_cast<acc_type_t<S>>(s.dropout.scale);
  p.threshold = s.dropout.threshold;
}

// out: gate's shape with the last dimension F, contiguous.
template <class Backend>
Tensor gated_act_op(const Tensor& gate, const std::optional<Tensor>& up, const Tensor& seed, double p, int64_t act) {
  const GatedSpec s = check_gated_act(gate, up, seed, p, act);
  Backend be(s.gate);
  std::vector<int64_t> shape(s.gate.sizes().begin(), s.gate.sizes().end());
  shape.back() = s.F;
  Tensor out = empty_on(s.gate, shape, s.dtype);
  if (s.M == 0) return out;
  dispatch_gated(s, [&](auto ac, auto st) {
    using S = typename decltype(st)::type;
    dev::GatedForwardParams<S> params;
    set_gated_inputs<S>(params, s, be);
    params.out = device_out<S>(be, "out", out);
    cuda::run_gated_act<decltype(ac)::value>(params, s.M, s.F, s.packed(), s.dropout, be.launcher());
  });
  be.finish();
  return out;
}

// (grad_gate, grad_up): two tensors, each of its input's shape; packed, grad_gate of gate's (..., 2F) shape holding
// [grad_gate | grad_up] and grad_up (0,).
template <class Backend>
std::tuple<Tensor, Tensor> gated_act_backward_op(const Tensor& grad_out, const Tensor& gate,
                                                 const std::optional<Tensor>& up, const Tensor& seed, double p,
                                                 int64_t act) {
  const GatedSpec s = check_gated_act_backward(grad_out, gate, up, seed, p, act);
  Backend be(s.gate);
  Tensor grad_gate = empty_on(s.gate, s.gate.sizes(), s.dtype);
  Tensor grad_up = s.packed() ? empty_on(s.gate, {0}, s.dtype) : empty_on(s.gate, s.gate.sizes(), s.dtype);
  if (s.M == 0) return {grad_gate, grad_up};
  dispatch_gated(s, [&](auto ac, auto st) {
    using S = typename decltype(st)::type;
    dev::GatedBackwardParams<S> params;
    params.grad_out = device_in<S>(be, "grad_out", s.grad_out);
    set_gated_inputs<S>(params, s, be);
    params.grad_gate = device_out<S>(be, "grad_gate", grad_gate);
    params.grad_up = s.packed() ? params.grad_gate + s.F : device_out<S>(be, "grad_up", grad_up);
    cuda::run_gated_act_backward<decltype(ac)::value>(params, s.M, s.F, s.packed(), s.dropout, be.launcher());
  });
  be.finish();
  return {grad_gate, grad_up};
}

}  // namespace gpuopt
