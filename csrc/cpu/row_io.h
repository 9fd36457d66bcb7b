// Row helpers shared by the CPU kernels of layer_norm_dropout_relu and dropout_add_norm: parameter rows converted
// once per call, the fixed-order 4-way sum, the fp32 staging of 16-bit rows, and the rows per dropout tile.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/row_kernels.h"
#include "torch_stable.h"

namespace gpuopt {

// A parameter row (or its absence, as `absent` everywhere) in acc_t, once per call: the row loops then need no
// branches.
template <typename acc_t, typename param_t>
std::vector<acc_t> param_row(const Tensor& t, int64_t N, acc_t absent) {
  std::vector<acc_t> row(N, absent);
  if (t.defined()) {
    const param_t* p = data_as<const param_t>(t);
    for (int64_t j = 0; j < N; ++j) row[j] = static_cast<acc_t>(p[j]);
  }
  return row;
}

// Sum over j of f(j), in 4 interleaved partial sums (as a 4-lane vector would), then combined in a fixed order.
template <typename acc_t, typename F>
acc_t sum4(int64_t n, const F& f) {
  acc_t s[4] = {0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    s[0] += f(j);
    s[1] += f(j + 1);
    s[2] += f(j + 2);
    s[3] += f(j + 3);
  }
  for (int k = 0; j < n; ++j, ++k) s[k] += f(j);
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// The fp32 fast paths read rows as fp32: fp32 rows in place, bf16 / fp16 rows converted into a per-thread buffer.
inline const float* load_row(const float* src, float* /*buf*/, int64_t /*n*/) { return src; }
template <typename T>
const float* load_row(const T* src, float* buf, int64_t n) {
  cpu::to_float(src, buf, n);
  return buf;
}
// Where a row's fp32 result is written: in place for fp32 outputs, else a buffer that store_row converts.
inline float* result_row(float* dst, float* /*buf*/) { return dst; }
template <typename T>
float* result_row(T* /*dst*/, float* buf) {
  return buf;
}
inline void store_row(float* /*dst*/, const float* /*buf*/, int64_t /*n*/) {}
template <typename T>
void store_row(T* dst, const float* buf, int64_t n) {
  cpu::from_float(buf, dst, n);
}

// Rows per dropout tile: the uniforms of a tile's R * N consecutive elements come from one call, so small N does
// not waste the 8-call (64-element) batches of the AVX2 Philox.
inline int64_t tile_rows(int64_t N) { return std::max<int64_t>(1, 2048 / N); }

}  // namespace gpuopt
