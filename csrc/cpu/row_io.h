// Row helpers shared by the CPU kernels of layer_norm_dropout_relu and dropout_add_norm: parameter rows converted
// once per call, the fixed-order 4-way sum, the fp32 staging of 16-bit rows, the rows per dropout tile, and the row
// drivers of both paths (fp32 row kernels and fp64 loops): tiles of rows for the forwards, the deterministic row
// blocks for the backwards.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "cpu/dropout_mask.h"
#include "cpu/row_blocks.h"
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

// An op's dropout as its row loops read it: the threshold, the scale cast once to acc_t, and keep(u, j) for the
// uniforms u of a row (nullptr when the op does not drop: every element kept).
template <typename acc_t>
struct RowDropout {
  uint32_t threshold;
  acc_t scale;
  bool active;
  explicit RowDropout(const DropoutParams& d)
      : threshold(d.threshold), scale(static_cast<acc_t>(d.scale)), active(d.active()) {}
  bool keep(const uint16_t* u, int64_t j) const { return u == nullptr || dropout_keep(u[j], threshold); }
};

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
// A thread's fp32 staging row for rows of T (load_row, result_row): n floats, none for fp32 rows (used in place).
template <typename T>
std::vector<float> staging_row(int64_t n) {
  return std::vector<float>(std::is_same_v<T, float> ? 0 : n);
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

// A thread's walk over rows of N elements with their dropout uniforms: rows(begin, end, row) calls row(r, u) for
// r in [begin, end), u the row's N uniforms (nullptr when the op does not drop), drawn tile_rows(N) rows at a time.
class RowUniforms {
 public:
  RowUniforms(const DropoutSeed& seed, bool dropping, int64_t N)
      : seed_(seed),
        dropping_(dropping),
        N_(N),
        R_(tile_rows(N)),
        buf_(dropping ? dropout_uniforms_capacity(R_ * N) : 0) {}

  template <typename Row>
  void rows(int64_t begin, int64_t end, const Row& row) {
    for (int64_t r0 = begin; r0 < end; r0 += R_) {
      const int64_t r1 = std::min(end, r0 + R_);
      const uint16_t* u = dropping_ ? dropout_uniforms_run(seed_, r0 * N_, (r1 - r0) * N_, buf_.data()) : nullptr;
      for (int64_t r = r0; r < r1; ++r) row(r, u ? u + (r - r0) * N_ : nullptr);
    }
  }

 private:
  const DropoutSeed& seed_;
  bool dropping_;
  int64_t N_, R_;
  std::vector<uint16_t> buf_;
};

// The forwards' rows: tiles of whole rows (about 64 KB of fp32, a multiple of tile_rows(N)) handed to torch's threads
// dynamically; on each thread scratch = make_scratch() once, then row(scratch, r, u) for every row r, u its dropout
// uniforms (RowUniforms). Rows are independent, so nothing depends on the thread count.
template <typename MakeScratch, typename Row>
void run_row_tiles(int64_t M, int64_t N, const DropoutSeed& seed, bool dropping, const MakeScratch& make_scratch,
                   const Row& row) {
  const int64_t R = tile_rows(N);
  const int64_t tile = std::max<int64_t>(R, 16384 / N / R * R);  // rows per scheduling tile
  parallel_tiles((M + tile - 1) / tile, [&](const auto& take) {
    auto scratch = make_scratch();
    RowUniforms uniforms(seed, dropping, N);
    for (int64_t t; (t = take()) * tile < M;) {
      uniforms.rows(t * tile, std::min(M, (t + 1) * tile), [&](int64_t r, const uint16_t* u) { row(scratch, r, u); });
    }
  });
}

// The backwards' rows and their deterministic dgamma / dbeta in acc_t: fixed row blocks (a function of M only,
// row_blocks.h) are the scheduling tiles; each sums its rows in order into its own partial rows, summed in block order
// at the end.
template <typename acc_t>
class BlockPartials {
 public:
  BlockPartials(int64_t M, int64_t N)
      : M_(M), N_(N), rb_(M), w_(rb_.blocks * N, acc_t(0)), b_(rb_.blocks * N, acc_t(0)) {}

  // On torch's threads: scratch = make_scratch() once a thread, then row(scratch, r, u, pw, pb) for every row r, u its
  // dropout uniforms (RowUniforms), pw / pb its block's partial rows.
  template <typename MakeScratch, typename Row>
  void run(const DropoutSeed& seed, bool dropping, const MakeScratch& make_scratch, const Row& row) {
    parallel_tiles(rb_.blocks, [&](const auto& take) {
      auto scratch = make_scratch();
      RowUniforms uniforms(seed, dropping, N_);
      for (int64_t blk; (blk = take()) < rb_.blocks;) {
        acc_t* pw = w_.data() + blk * N_;
        acc_t* pb = b_.data() + blk * N_;
        uniforms.rows(rb_.begin(blk), rb_.end(blk, M_),
                      [&](int64_t r, const uint16_t* u) { row(scratch, r, u, pw, pb); });
      }
    });
  }

  // The sums into grad_w / grad_b where the parameter is defined.
  template <typename param_t>
  void sum(const Tensor& weight, const Tensor& bias, Tensor& grad_w, Tensor& grad_b) const {
    if (weight.defined()) sum_partials(w_, rb_.blocks, N_, data_as<param_t>(grad_w));
    if (bias.defined()) sum_partials(b_, rb_.blocks, N_, data_as<param_t>(grad_b));
  }

 private:
  int64_t M_, N_;
  RowBlocks rb_;
  std::vector<acc_t> w_, b_;
};

// The generic (fp64) backwards' rows on BlockPartials<acc_t>: row(xhat, dxhat, r, u, pw, pb) for every row, xhat and
// dxhat a thread's two rows of N in acc_t, then the partial sums into grad_w / grad_b where the spec's weight / bias
// is defined.
template <typename acc_t, typename param_t, typename Spec, typename Row>
void generic_backward_rows(const Spec& a, const DropoutSeed& seed, Tensor& grad_w, Tensor& grad_b, const Row& row) {
  const int64_t N = a.N;
  BlockPartials<acc_t> partials(a.M, N);
  auto scratch = [N] { return std::array<std::vector<acc_t>, 2>{std::vector<acc_t>(N), std::vector<acc_t>(N)}; };
  partials.run(seed, a.dropout.active(), scratch, [&](auto& bufs, int64_t r, const uint16_t* u, acc_t* pw, acc_t* pb) {
    row(bufs[0].data(), bufs[1].data(), r, u, pw, pb);
  });
  partials.template sum<param_t>(a.weight, a.bias, grad_w, grad_b);
}

}  // namespace gpuopt
