// The one place the C++ side meets libtorch: the LibTorch stable ABI (torch/csrc/stable, torch/headeronly), so
// one compiled _C loads in every torch from TORCH_TARGET_VERSION (2.11, set by setup.py) to the newest. Nothing
// here or anywhere in csrc/ may use at::, c10:: or torch:: functions that libtorch exports as C++ symbols: a test
// (the packaging tests) reads the built library's undefined symbols and fails on any. Header-only types
// (ScalarType, Half, BFloat16, HeaderOnlyArrayRef) are fine: they compile into this library.
#pragma once
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "dtypes.h"

namespace gpuopt {

using Tensor = torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;
using Half = torch::headeronly::Half;
using BFloat16 = torch::headeronly::BFloat16;
using IntArrayRef = torch::headeronly::IntHeaderOnlyArrayRef;

constexpr ScalarType kFloat = ScalarType::Float;
constexpr ScalarType kDouble = ScalarType::Double;
constexpr ScalarType kHalf = ScalarType::Half;
constexpr ScalarType kBFloat16 = ScalarType::BFloat16;
constexpr ScalarType kLong = ScalarType::Long;
constexpr ScalarType kByte = ScalarType::Byte;

template <class... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream s;
  (s << ... << args);
  return s.str();
}

// The message alone, as TORCH_CHECK shows it in Python (RuntimeError). STD_TORCH_CHECK would prepend the C++
// function, file and line, and our messages are the contract (gpuopt_ops/_validation.py repeats them).
[[noreturn]] inline void fail(const std::string& message) { throw std::runtime_error(message); }

#define GPUOPT_CHECK(cond, ...)                                  \
  do {                                                           \
    if (!(cond)) ::gpuopt::fail(::gpuopt::str_cat(__VA_ARGS__)); \
  } while (0)

// Python spelling of a device, as torch.device's str: "cpu", "cuda:1", "meta".
inline std::string device_str(const torch::stable::Device& d) {
  using torch::headeronly::DeviceType;
  std::string name;
  switch (d.type()) {
    case DeviceType::CPU:
      name = "cpu";
      break;
    case DeviceType::CUDA:
      name = "cuda";
      break;
    case DeviceType::HIP:
      name = "hip";
      break;
    case DeviceType::XPU:
      name = "xpu";
      break;
    case DeviceType::MPS:
      name = "mps";
      break;
    case DeviceType::Meta:
      name = "meta";
      break;
    case DeviceType::XLA:
      name = "xla";
      break;
    case DeviceType::HPU:
      name = "hpu";
      break;
    case DeviceType::MTIA:
      name = "mtia";
      break;
    case DeviceType::Lazy:
      name = "lazy";
      break;
    case DeviceType::PrivateUse1:
      name = "privateuseone";
      break;
    default:
      name = str_cat("device_type_", static_cast<int>(d.type()));
      break;
  }
  return d.has_index() ? str_cat(name, ":", static_cast<int>(d.index())) : name;
}

inline bool same_sizes(IntArrayRef a, IntArrayRef b) { return a.equals(b); }

// Last dimension (t.dim() >= 1).
inline int64_t last_dim(const Tensor& t) { return t.size(t.dim() - 1); }

inline int64_t nbytes(const Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

template <class T>
T* data_as(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// t itself when already contiguous (no dispatcher call), else a contiguous copy; undefined stays undefined.
inline Tensor as_contiguous(const Tensor& t) {
  if (!t.defined() || t.is_contiguous()) return t;
  return torch::stable::contiguous(t);
}

// torch's dtypes and the project's (dtypes.h): the one bridge, a table in DType's order. dtype_of takes a floating
// dtype (the checks see to it).
constexpr ScalarType kScalarTypeOf[] = {kHalf, kBFloat16, kFloat, kDouble};
inline ScalarType scalar_type_of(DType t) { return kScalarTypeOf[static_cast<int>(t)]; }
inline DType dtype_of(ScalarType t) {
  for (int i = 0; i < 4; ++i)
    if (kScalarTypeOf[i] == t) return static_cast<DType>(i);
  fail(str_cat("gpuopt: internal error: unsupported dtype ", torch::headeronly::toString(t)));
}
inline ScalarType scalar_type_of(ScalarType t) { return t; }

// The CPU kernels' storage types of the 16-bit dtypes (dtypes.h Storage).
using HostStorage = Storage<Half, BFloat16>;

// New tensors on like's device; dtype: a ScalarType or a DType.
template <class D>
Tensor empty_on(const Tensor& like, IntArrayRef sizes, D dtype) {
  return torch::stable::empty(sizes, scalar_type_of(dtype), std::nullopt, like.device());
}
template <class D>
Tensor zeros_on(const Tensor& like, IntArrayRef sizes, D dtype) {
  return torch::stable::new_zeros(like, sizes, scalar_type_of(dtype));
}
template <class D>
Tensor empty_on(const Tensor& like, std::initializer_list<int64_t> sizes, D dtype) {
  return empty_on(like, IntArrayRef(sizes), dtype);
}
template <class D>
Tensor zeros_on(const Tensor& like, std::initializer_list<int64_t> sizes, D dtype) {
  return zeros_on(like, IntArrayRef(sizes), dtype);
}
// A gradient of an optional (N,) parameter: zeros when it is defined, else (0,).
template <class D>
Tensor param_grad_on(const Tensor& like, bool defined, int64_t N, D dtype) {
  return defined ? zeros_on(like, {N}, dtype) : empty_on(like, {0}, dtype);
}

}  // namespace gpuopt
