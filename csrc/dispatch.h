// dtype and activation dispatch shared by the CPU launchers.
#pragma once
#include <type_traits>

#include "checks.h"
#include "torch_stable.h"

namespace gpuopt {

// Accumulation type: fp64 for fp64 inputs, fp32 otherwise.
template <typename scalar_t>
using acc_type_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

// Calls body(TypeTag<scalar_t>, TypeTag<param_t>) for x's dtype and the params' dtype (x's dtype or fp32).
template <typename Body>
void dispatch_ldr(const LdrArgs& a, Body&& body) {
  dispatch_floating(a.x.scalar_type(), "layer_norm_dropout_relu", [&](auto st) {
    using scalar_t = typename decltype(st)::type;
    if (a.param_dtype == kFloat) {
      body(TypeTag<scalar_t>{}, TypeTag<float>{});
    } else {
      body(TypeTag<scalar_t>{}, TypeTag<scalar_t>{});
    }
  });
}

// dropout_add_norm (DanArgs or DanBackwardArgs): calls body(TypeTag<scalar_t>, TypeTag<param_t>, TypeTag<sum_t>)
// for x's dtype, the parameters' dtype (x's or fp32) and S, the dtype of `sum` (x's or fp32).
template <typename Args, typename Body>
void dispatch_dan(const Args& a, Body&& body) {
  dispatch_floating(a.x_dtype, "dropout_add_norm", [&](auto st) {
    using scalar_t = typename decltype(st)::type;
    auto with_sum = [&](auto pt) {
      if (a.sum_dtype == kFloat) {
        body(TypeTag<scalar_t>{}, pt, TypeTag<float>{});
      } else {
        body(TypeTag<scalar_t>{}, pt, TypeTag<scalar_t>{});
      }
    };
    if (a.param_dtype == kFloat) {
      with_sum(TypeTag<float>{});
    } else {
      with_sum(TypeTag<scalar_t>{});
    }
  });
}

// Calls body(std::integral_constant<int, kAct>) for the activation code (checked by the caller).
template <typename Body>
void dispatch_act(int act, Body&& body) {
  switch (act) {
    case kActGelu:
      return body(std::integral_constant<int, kActGelu>{});
    case kActGeluTanh:
      return body(std::integral_constant<int, kActGeluTanh>{});
    case kActSilu:
      return body(std::integral_constant<int, kActSilu>{});
    default:  // kActRelu
      return body(std::integral_constant<int, kActRelu>{});
  }
}

}  // namespace gpuopt
