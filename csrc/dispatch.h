// dtype dispatch shared by the CPU and CUDA launchers of layer_norm_dropout_relu.
#pragma once
#include <ATen/Dispatch.h>

#include <type_traits>

#include "checks.h"

namespace gpuopt {

// Accumulation type: fp64 for fp64 inputs, fp32 otherwise.
template <typename scalar_t>
using acc_type_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls body(TypeTag<scalar_t>, TypeTag<param_t>) for x's dtype and the params' dtype (x's dtype or fp32).
template <typename Body>
void dispatch_ldr(const LdrArgs& a, Body&& body) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "layer_norm_dropout_relu", [&] {
    if (a.param_dtype == at::kFloat) {
      body(TypeTag<scalar_t>{}, TypeTag<float>{});
    } else {
      body(TypeTag<scalar_t>{}, TypeTag<scalar_t>{});
    }
  });
}

}  // namespace gpuopt
