// The dtype vocabulary of every C++ backend, once: the four floating dtypes the ops take, the accumulation type of
// each (DESIGN.md: fp64 for fp64 data, fp32 otherwise), and the dispatch from run-time dtypes and activation codes
// to template arguments. Plain C++ (no torch, no CUDA), so the CPU kernels, the CUDA launchers and the kernel
// headers share it. A backend names its storage types of the 16-bit dtypes in a Storage policy (torch's Half /
// BFloat16 on the CPU: torch_stable.h HostStorage; the device's on the GPU and the emulator); torch_stable.h maps
// torch's ScalarType to DType.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "fused_math.h"

namespace gpuopt {

enum class DType : uint8_t { kFloat16, kBFloat16, kFloat32, kFloat64 };

template <typename T>
struct TypeTag {
  using type = T;
};

// Accumulation type of storage type T: fp64 for fp64, fp32 otherwise.
template <typename T>
using acc_type_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

constexpr DType acc_dtype_of(DType t) { return t == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32; }
constexpr bool is_16bit(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

// A backend's C++ types of the 16-bit dtypes.
template <typename Half, typename BFloat16>
struct Storage {
  using half = Half;
  using bfloat16 = BFloat16;
};

// Calls f(TypeTag<T>) for the storage type T of dtype t.
template <class St, typename F>
void dispatch_dtype(DType t, F&& f) {
  if (t == DType::kFloat32) return f(TypeTag<float>{});
  if (t == DType::kFloat64) return f(TypeTag<double>{});
  if (t == DType::kFloat16) return f(TypeTag<typename St::half>{});
  f(TypeTag<typename St::bfloat16>{});
}

// Calls f(TypeTag<x type>, TypeTag<param type>): parameters (weight, bias) have x's dtype or fp32 (DESIGN.md).
template <class St, typename F>
void dispatch_dtypes(DType x, DType param, F&& f) {
  dispatch_dtype<St>(x, [&](auto xt) {
    if (param == DType::kFloat32) return f(xt, TypeTag<float>{});
    f(xt, xt);
  });
}

// dropout_add_norm: calls f(TypeTag<x type>, TypeTag<sum type>, TypeTag<param type>); the sum has x's dtype, or
// fp32 for 16-bit x (residual_in_fp32).
template <class St, typename F>
void dispatch_dtypes(DType x, DType sum, DType param, F&& f) {
  dispatch_dtypes<St>(x, param, [&](auto xt, auto pt) {
    if constexpr (sizeof(typename decltype(xt)::type) == 2) {
      if (sum == DType::kFloat32) return f(xt, TypeTag<float>{}, pt);
    }
    f(xt, xt, pt);
  });
}

// Calls f(std::integral_constant<int, kAct>) for an activation code (fused_math.h; checked by the op).
template <typename F, int... kActs>
void dispatch_act_in(int act, F&& f, std::integer_sequence<int, kActs...>) {
  const bool found = ((act == kActs ? (f(std::integral_constant<int, kActs>{}), true) : false) || ...);
  if (!found) throw std::runtime_error("gpuopt: internal error: unknown activation " + std::to_string(act));
}
template <typename F>
void dispatch_act(int act, F&& f) {
  dispatch_act_in(act, f, std::make_integer_sequence<int, kActCount>{});
}

}  // namespace gpuopt
