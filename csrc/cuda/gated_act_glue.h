// The torch side of gated_act and its backward on the CUDA backend (ops_glue.h's Backend: the GPU's, or the
// emulator's in tools/cuda_emu/emulated_ops.cpp): the checks shared with the CPU backend, the outputs, M = 0 (empty
// outputs, no launch), then gated_act_launch.cuh.
#pragma once
#include <optional>
#include <tuple>
#include <vector>

#include "checks.h"
#include "cuda/gated_act_launch.cuh"
#include "cuda/ops_glue.h"
#include "torch_stable.h"

namespace gpuopt {

// out: gate's shape with the last dimension F, contiguous.
template <class Backend>
Tensor gated_act_op(const Tensor& gate, const std::optional<Tensor>& up, const Tensor& seed, double p, int64_t act) {
  const GatedActArgs a = check_gated_act(gate, up, seed, p, act);
  Backend be(a.gate);
  std::vector<int64_t> shape(gate.sizes().begin(), gate.sizes().end());
  shape.back() = a.F;
  Tensor out = empty_on(a.gate, shape, gate.scalar_type());
  if (a.M == 0) return out;
  const Tensor seed_c = as_contiguous(seed);
  cuda::GatedBuffers b{nullptr,
                       be.in("gate", a.gate),
                       a.packed() ? nullptr : be.in("up", a.up),
                       static_cast<const int64_t*>(be.in("seed", seed_c)),
                       be.out("out", out),
                       nullptr,
                       nullptr,
                       a.M,
                       a.F,
                       a.packed(),
                       dtype_of(gate.scalar_type()),
                       a.act,
                       a.dropout};
  cuda::run_gated_act(b, be.launcher());
  be.finish();
  return out;
}

// (grad_gate, grad_up): two tensors, each of its input's shape; packed, grad_gate of gate's (..., 2F) shape holding
// [grad_gate | grad_up] and grad_up (0,).
template <class Backend>
std::tuple<Tensor, Tensor> gated_act_backward_op(const Tensor& grad_out, const Tensor& gate,
                                                 const std::optional<Tensor>& up, const Tensor& seed, double p,
                                                 int64_t act) {
  const GatedActArgs a = check_gated_act_backward(grad_out, gate, up, seed, p, act);
  Backend be(a.gate);
  const ScalarType dt = gate.scalar_type();
  Tensor grad_gate = empty_on(a.gate, gate.sizes(), dt);
  Tensor grad_up = a.packed() ? empty_on(a.gate, {0}, dt) : empty_on(a.gate, gate.sizes(), dt);
  if (a.M == 0) return {grad_gate, grad_up};
  const Tensor seed_c = as_contiguous(seed);
  cuda::GatedBuffers b{be.in("grad_out", a.grad_out),
                       be.in("gate", a.gate),
                       a.packed() ? nullptr : be.in("up", a.up),
                       static_cast<const int64_t*>(be.in("seed", seed_c)),
                       nullptr,
                       be.out("grad_gate", grad_gate),
                       a.packed() ? nullptr : be.out("grad_up", grad_up),
                       a.M,
                       a.F,
                       a.packed(),
                       dtype_of(dt),
                       a.act,
                       a.dropout};
  cuda::run_gated_act_backward(b, be.launcher());
  be.finish();
  return {grad_gate, grad_up};
}

}  // namespace gpuopt
