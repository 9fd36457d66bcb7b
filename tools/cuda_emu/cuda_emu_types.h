// 16-bit storage types of the kernels under the emulator: c10's Half and BFloat16 (same bits as __half and
// __nv_bfloat16, round-to-nearest-even conversions), so the emulated ops read and write torch tensors directly.
#pragma once
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace gpuopt_emu {

using half_t = c10::Half;
using bfloat16_t = c10::BFloat16;

inline float to_float(half_t v) { return static_cast<float>(v); }
inline float to_float(bfloat16_t v) { return static_cast<float>(v); }

template <typename T>
inline T from_float(float v) {
  return T(v);
}

}  // namespace gpuopt_emu
