// The per-element formulas are fused_math.h's (nd_forward_element, nd_backward_element, bias_relu_*_element),
// written out here as flat selects with unconditional loads: GCC does not if-convert the header's nested
// `keep ? (y <= 0 ? 0 : y * scale) : 0` / `keep && y > 0 ? g * scale : 0`, so calling them kept every loop
// scalar. Same operations in the same order, same NaN behaviour (the CPU kernel tests check it).
#include "cpu/row_kernels.h"

#include <cmath>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define GPUOPT_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GPUOPT_CLONES __attribute__((target_clones("avx2", "default")))
#elif defined(__x86_64__) && defined(__clang__)
#define GPUOPT_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define GPUOPT_CLONES
#endif

#if defined(__GNUC__)
#define GPUOPT_RESTRICT __restrict__
#else
#define GPUOPT_RESTRICT
#endif

// FP exceptions are never inspected: without -ftrapping-math GCC may compute both arms of a select (y * scale is
// evaluated for dropped elements too), which is what lets the dropout loops vectorize. Results are unchanged.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

// After the pragma, so bias_act's activations (inlined into the loops below) are compiled under it too: GCC
// does not vectorize a loop through functions compiled with other FP options.
#include "fused_math.h"  // NOLINT(build/include_order)

namespace gpuopt {
namespace cpu {
namespace {

constexpr int kLanes = 16;

// fp32 storage read / written as its bits (may_alias: no strict-aliasing assumptions across the two views)
typedef uint32_t __attribute__((may_alias)) bits32;

inline float combine(float* acc) {
  for (int w = kLanes / 2; w >= 1; w /= 2) {
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  }
  return acc[0];
}

// keep <=> u >= t, compared in fp32 (u <= 65535 and t <= 65536 are exact there): a uint16 -> fp32 widening the
// vectorizer handles, where a mixed int/float select would keep the loop scalar.

}  // namespace

GPUOPT_CLONES float row_sum(const float* GPUOPT_RESTRICT v, int64_t n) {
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += v[j + l];
  }
  for (int l = 0; j < n; ++j, ++l) acc[l] += v[j];
  return combine(acc);
}

GPUOPT_CLONES float row_sq_dev_sum(const float* GPUOPT_RESTRICT v, int64_t n, float mean) {
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float d = v[j + l] - mean;
      acc[l] += d * d;
    }
  }
  for (int l = 0; j < n; ++j, ++l) {
    const float d = v[j] - mean;
    acc[l] += d * d;
  }
  return combine(acc);
}

GPUOPT_CLONES float row_dot(const float* GPUOPT_RESTRICT a, const float* GPUOPT_RESTRICT b, int64_t n) {
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += a[j + l] * b[j + l];
  }
  for (int l = 0; j < n; ++j, ++l) acc[l] += a[j] * b[j];
  return combine(acc);
}

GPUOPT_CLONES void nd_forward_row(const float* GPUOPT_RESTRICT x, const float* GPUOPT_RESTRICT w,
                                  const float* GPUOPT_RESTRICT b, const uint16_t* GPUOPT_RESTRICT u, uint32_t t,
                                  float scale, float mean, float rstd, float* GPUOPT_RESTRICT out, int64_t n,
                                  bool relu) {
  // Same expression and select as fused_math.h's nd_forward_element (keep ? (relu && y <= 0 ? 0 : y * scale) : 0),
  // written branch-free so it vectorizes; a NaN that survives dropout stays NaN. `linear` is loop-invariant.
  const bool linear = !relu;
  if (u == nullptr) {
    for (int64_t j = 0; j < n; ++j) {
      const float y = (x[j] - mean) * rstd * w[j] + b[j];
      out[j] = (linear | !(y <= 0.0f)) ? y : 0.0f;
    }
    return;
  }
  const float tf = static_cast<float>(t);
  for (int64_t j = 0; j < n; ++j) {
    const float y = (x[j] - mean) * rstd * w[j] + b[j];
    const float r = y * scale;  // computed unconditionally: selects, no branches, so the loop vectorizes
    const bool pass = (static_cast<float>(u[j]) >= tf) & (linear | !(y <= 0.0f));
    out[j] = pass ? r : 0.0f;
  }
}

GPUOPT_CLONES void nd_backward_row_pass1(const float* GPUOPT_RESTRICT x, const float* GPUOPT_RESTRICT g,
                                         const float* GPUOPT_RESTRICT w, const float* GPUOPT_RESTRICT b,
                                         const uint16_t* GPUOPT_RESTRICT u, uint32_t t, float scale, float mean,
                                         float rstd, float* GPUOPT_RESTRICT xhat, float* GPUOPT_RESTRICT dxhat,
                                         float* GPUOPT_RESTRICT pw, float* GPUOPT_RESTRICT pb, int64_t n, bool relu) {
  // nd_backward_element: dy = (keep && (!relu || y > 0)) ? g * scale : 0
  const bool linear = !relu;
  if (u == nullptr) {
    for (int64_t j = 0; j < n; ++j) {
      const float xh = (x[j] - mean) * rstd;
      const float y = xh * w[j] + b[j];
      const float gs = g[j] * scale;
      const float dy = (linear | (y > 0.0f)) ? gs : 0.0f;
      xhat[j] = xh;
      dxhat[j] = dy * w[j];
      pw[j] += dy * xh;
      pb[j] += dy;
    }
    return;
  }
  const float tf = static_cast<float>(t);
  for (int64_t j = 0; j < n; ++j) {
    const float xh = (x[j] - mean) * rstd;
    const float y = xh * w[j] + b[j];
    const float gs = g[j] * scale;
    const bool pass = (static_cast<float>(u[j]) >= tf) & (linear | (y > 0.0f));
    const float dy = pass ? gs : 0.0f;
    xhat[j] = xh;
    dxhat[j] = dy * w[j];
    pw[j] += dy * xh;
    pb[j] += dy;
  }
}

GPUOPT_CLONES void nd_backward_row_pass2(const float* GPUOPT_RESTRICT xhat, const float* GPUOPT_RESTRICT dxhat,
                                         float rstd, float c1, float c2, float* GPUOPT_RESTRICT dx, int64_t n) {
  for (int64_t j = 0; j < n; ++j) dx[j] = rstd * (dxhat[j] - xhat[j] * c1 - c2);
}

GPUOPT_CLONES void dan_sum_row(const float* GPUOPT_RESTRICT x, const float* GPUOPT_RESTRICT r,
                               const uint16_t* GPUOPT_RESTRICT u, uint32_t t, float scale, float* GPUOPT_RESTRICT s,
                               int64_t n) {
  // The product is rounded before the add: a select stands between them, so no FMA contraction can fuse them.
  const float tf = static_cast<float>(t);
  if (u == nullptr && r == nullptr) {
    std::memcpy(s, x, static_cast<size_t>(n) * sizeof(float));
  } else if (u == nullptr) {
    for (int64_t j = 0; j < n; ++j) s[j] = x[j] + r[j];
  } else if (r == nullptr) {
    for (int64_t j = 0; j < n; ++j) {
      const float d = x[j] * scale;
      s[j] = static_cast<float>(u[j]) >= tf ? d : 0.0f;
    }
  } else {
    for (int64_t j = 0; j < n; ++j) {
      const float d = x[j] * scale;
      s[j] = (static_cast<float>(u[j]) >= tf ? d : 0.0f) + r[j];
    }
  }
}

GPUOPT_CLONES void norm_forward_row(const float* GPUOPT_RESTRICT s, const float* GPUOPT_RESTRICT w,
                                    const float* GPUOPT_RESTRICT b, float mean, float rstd, float* GPUOPT_RESTRICT out,
                                    int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = (s[j] - mean) * rstd * w[j] + b[j];
}

GPUOPT_CLONES void norm_backward_row_pass1(const float* GPUOPT_RESTRICT s, const float* GPUOPT_RESTRICT g,
                                           const float* GPUOPT_RESTRICT w, float mean, float rstd,
                                           float* GPUOPT_RESTRICT xhat, float* GPUOPT_RESTRICT dxhat,
                                           float* GPUOPT_RESTRICT pw, float* GPUOPT_RESTRICT pb, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float xh = (s[j] - mean) * rstd;
    const float gj = g[j];
    xhat[j] = xh;
    dxhat[j] = gj * w[j];
    pw[j] += gj * xh;
    pb[j] += gj;
  }
}

GPUOPT_CLONES void dan_backward_row_pass2(const float* GPUOPT_RESTRICT xhat, const float* GPUOPT_RESTRICT dxhat,
                                          const float* GPUOPT_RESTRICT gsum, const uint16_t* GPUOPT_RESTRICT u,
                                          uint32_t t, float scale, float rstd, float c1, float c2,
                                          float* GPUOPT_RESTRICT dres, float* GPUOPT_RESTRICT dx, int64_t n) {
  if (u == nullptr) {
    for (int64_t j = 0; j < n; ++j) {
      const float d = rstd * (dxhat[j] - xhat[j] * c1 - c2) + gsum[j];
      dres[j] = d;
      dx[j] = d;
    }
    return;
  }
  const float tf = static_cast<float>(t);
  for (int64_t j = 0; j < n; ++j) {
    const float d = rstd * (dxhat[j] - xhat[j] * c1 - c2) + gsum[j];
    const float ds = d * scale;
    dres[j] = d;
    dx[j] = static_cast<float>(u[j]) >= tf ? ds : 0.0f;
  }
}

GPUOPT_CLONES void bias_relu_row(const float* GPUOPT_RESTRICT x, const float* GPUOPT_RESTRICT b,
                                 float* GPUOPT_RESTRICT y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float v = x[j] + b[j];
    y[j] = v <= 0.0f ? 0.0f : v;
  }
}

GPUOPT_CLONES void bias_relu_backward_row(const float* GPUOPT_RESTRICT g, const float* GPUOPT_RESTRICT out,
                                          float* GPUOPT_RESTRICT dx, float* GPUOPT_RESTRICT pb, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float gj = g[j];
    const float d = out[j] > 0.0f ? gj : 0.0f;
    dx[j] = d;
    pb[j] += d;
  }
}

namespace {

// The fp32 primitives of the activations for the row loops (fused_math.h's ActMath interface): selects,
// arithmetic and bit moves only, so GCC vectorizes the loops that call them (the C library's exp2f keeps loops
// scalar).
struct RowMath {
  // 2^x = 2^n e^r, n = round(x), r = (x - n) ln 2 (x - n exact, |r| <= ln 2 / 2), e^r by its Taylor series to r^7
  // (truncation < 6e-9 relative); x clamped to [-126, 127] so 2^n stays a normal float (a NaN x gives a finite
  // value: every activation multiplies it by z, which restores the NaN).
  static float exp2(float x) {
    x = !(x >= -126.0f) ? -126.0f : (x > 127.0f ? 127.0f : x);
    const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    const float n = (x + shifter) - shifter;
    const float r = (x - n) * 0.693147180559945309f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
    return p * __builtin_bit_cast(float, bits);
  }
  static float rcp(float v) { return 1.0f / v; }
};

// The activation loops compute both arms of their selects (what lets them vectorize), and GCC folds the clamped
// arms of RowMath::exp2 into constants: silu's 1 / (1 + 2^127) is subnormal, so every vector took a microcode
// assist (measured 10x slower: 10-18 ns an element instead of ~1). The loops run with FTZ and DAZ set, as the
// GPU's .ftz primitives: values below 2^-126 are read and written as 0. The caller's MXCSR is restored.
class FlushSubnormals {
 public:
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }  // FTZ (bit 15) | DAZ (bit 6)
  ~FlushSubnormals() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
};

}  // namespace

// One loop per activation, written out in the cloned functions themselves (a helper template called from a clone
// is not vectorized for the clone's ISA).
#define GPUOPT_ACT_LOOP(kAct, body)       \
  case kAct:                              \
    for (int64_t j = 0; j < n; ++j) body; \
    return;

GPUOPT_CLONES void bias_act_row(int act, const float* GPUOPT_RESTRICT x, const float* GPUOPT_RESTRICT b,
                                float* GPUOPT_RESTRICT y, int64_t n) {
  const FlushSubnormals ftz;
  switch (act) {
    GPUOPT_ACT_LOOP(kActGelu, y[j] = (act_forward<kActGelu, float, RowMath>(x[j] + b[j])))
    GPUOPT_ACT_LOOP(kActGeluTanh, y[j] = (act_forward<kActGeluTanh, float, RowMath>(x[j] + b[j])))
    GPUOPT_ACT_LOOP(kActSilu, y[j] = (act_forward<kActSilu, float, RowMath>(x[j] + b[j])))
    default:
      return;
  }
}

GPUOPT_CLONES void bias_act_backward_row(int act, const float* GPUOPT_RESTRICT g, const float* GPUOPT_RESTRICT x,
                                         const float* GPUOPT_RESTRICT b, float* GPUOPT_RESTRICT dx,
                                         float* GPUOPT_RESTRICT pb, int64_t n) {
  const FlushSubnormals ftz;
  switch (act) {
    GPUOPT_ACT_LOOP(kActGelu, (dx[j] = g[j] * act_derivative<kActGelu, float, RowMath>(x[j] + b[j]), pb[j] += dx[j]))
    GPUOPT_ACT_LOOP(kActGeluTanh,
                    (dx[j] = g[j] * act_derivative<kActGeluTanh, float, RowMath>(x[j] + b[j]), pb[j] += dx[j]))
    GPUOPT_ACT_LOOP(kActSilu, (dx[j] = g[j] * act_derivative<kActSilu, float, RowMath>(x[j] + b[j]), pb[j] += dx[j]))
    default:
      return;
  }
}

// gated_act: one loop per activation and dropout setting. The keep bit is a select on (u >= t) in fp32 (as the
// dropout loops above); everything else is fused_math.h's element functions with the RowMath primitives.
#define GPUOPT_GATED_FWD(kAct)                                                                 \
  case kAct:                                                                                   \
    if (u == nullptr) {                                                                        \
      for (int64_t j = 0; j < n; ++j) out[j] = act_forward<kAct, float, RowMath>(g[j]) * v[j]; \
    } else {                                                                                   \
      for (int64_t j = 0; j < n; ++j) {                                                        \
        const float h = (act_forward<kAct, float, RowMath>(g[j]) * v[j]) * scale;              \
        out[j] = static_cast<float>(u[j]) >= tf ? h : 0.0f;                                    \
      }                                                                                        \
    }                                                                                          \
    return;

GPUOPT_CLONES void gated_forward_row(int act, const float* GPUOPT_RESTRICT g, const float* GPUOPT_RESTRICT v,
                                     const uint16_t* GPUOPT_RESTRICT u, uint32_t t, float scale,
                                     float* GPUOPT_RESTRICT out, int64_t n) {
  const FlushSubnormals ftz;
  const float tf = static_cast<float>(t);
  switch (act) {
    GPUOPT_GATED_FWD(kActRelu)
    GPUOPT_GATED_FWD(kActGelu)
    GPUOPT_GATED_FWD(kActGeluTanh)
    GPUOPT_GATED_FWD(kActSilu)
    default:
      return;
  }
}

// grad_gate: the expression of dg[j] from gh, g[j], v[j]; act'(g) for acts 1-3, relu's select g > 0 written out (as
// act_derivative has none). Two loops, so the loop without dropout has no select on u.
#define GPUOPT_GATED_BWD_BODY(kAct, grad_gate)          \
  dv[j] = gh * act_forward<kAct, float, RowMath>(g[j]); \
  dg[j] = grad_gate;
#define GPUOPT_GATED_BWD(kAct, grad_gate)                                       \
  case kAct:                                                                    \
    if (u == nullptr) {                                                         \
      for (int64_t j = 0; j < n; ++j) {                                         \
        const float gh = go[j];                                                 \
        GPUOPT_GATED_BWD_BODY(kAct, grad_gate)                                  \
      }                                                                         \
    } else {                                                                    \
      for (int64_t j = 0; j < n; ++j) {                                         \
        const float gh = static_cast<float>(u[j]) >= tf ? go[j] * scale : 0.0f; \
        GPUOPT_GATED_BWD_BODY(kAct, grad_gate)                                  \
      }                                                                         \
    }                                                                           \
    return;

GPUOPT_CLONES void gated_backward_row(int act, const float* GPUOPT_RESTRICT go, const float* GPUOPT_RESTRICT g,
                                      const float* GPUOPT_RESTRICT v, const uint16_t* GPUOPT_RESTRICT u, uint32_t t,
                                      float scale, float* GPUOPT_RESTRICT dg, float* GPUOPT_RESTRICT dv, int64_t n) {
  const FlushSubnormals ftz;
  const float tf = static_cast<float>(t);
  switch (act) {
    GPUOPT_GATED_BWD(kActRelu, (g[j] > 0.0f ? gh * v[j] : 0.0f))
    GPUOPT_GATED_BWD(kActGelu, (gh * v[j]) * (act_derivative<kActGelu, float, RowMath>(g[j])))
    GPUOPT_GATED_BWD(kActGeluTanh, (gh * v[j]) * (act_derivative<kActGeluTanh, float, RowMath>(g[j])))
    GPUOPT_GATED_BWD(kActSilu, (gh * v[j]) * (act_derivative<kActSilu, float, RowMath>(g[j])))
    default:
      return;
  }
}

#undef GPUOPT_GATED_FWD
#undef GPUOPT_GATED_BWD
#undef GPUOPT_GATED_BWD_BODY
#undef GPUOPT_ACT_LOOP

GPUOPT_CLONES void to_float(const torch::headeronly::BFloat16* GPUOPT_RESTRICT src, float* GPUOPT_RESTRICT dst,
                            int64_t n) {
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  bits32* d = reinterpret_cast<bits32*>(dst);
  for (int64_t j = 0; j < n; ++j) d[j] = static_cast<uint32_t>(s[j]) << 16;
}

GPUOPT_CLONES void from_float(const float* GPUOPT_RESTRICT src, torch::headeronly::BFloat16* GPUOPT_RESTRICT dst,
                              int64_t n) {
  // c10::detail::round_to_nearest_even on the bits, branch-free: NaN -> 0x7FC0, else round half to even
  const bits32* s = reinterpret_cast<const bits32*>(src);
  uint16_t* d = reinterpret_cast<uint16_t*>(dst);
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t u = s[j];
    const uint32_t rounded = (u + (((u >> 16) & 1u) + 0x7FFFu)) >> 16;
    const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
    d[j] = static_cast<uint16_t>(nan ? 0x7FC0u : rounded);
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// fp16 <-> fp32 with the F16C instructions (round to nearest even, as c10::Half), picked at run time.
__attribute__((target("avx,f16c"))) static void half_to_float_f16c(const uint16_t* s, float* d, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    _mm256_storeu_ps(d + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + j))));
  }
  for (; j < n; ++j) d[j] = static_cast<float>(torch::headeronly::Half(s[j], torch::headeronly::Half::from_bits()));
}

__attribute__((target("avx,f16c"))) static void float_to_half_f16c(const float* s, uint16_t* d, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + j),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + j), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; j < n; ++j) d[j] = torch::headeronly::Half(s[j]).x;
}

static bool have_f16c() {
  static const bool yes = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return yes;
}
#define GPUOPT_HAVE_F16C_PATH 1
#endif

void to_float(const torch::headeronly::Half* src, float* dst, int64_t n) {
#if GPUOPT_HAVE_F16C_PATH
  if (have_f16c()) return half_to_float_f16c(reinterpret_cast<const uint16_t*>(src), dst, n);
#endif
  for (int64_t j = 0; j < n; ++j) dst[j] = static_cast<float>(src[j]);
}

void from_float(const float* src, torch::headeronly::Half* dst, int64_t n) {
#if GPUOPT_HAVE_F16C_PATH
  if (have_f16c()) return float_to_half_f16c(src, reinterpret_cast<uint16_t*>(dst), n);
#endif
  for (int64_t j = 0; j < n; ++j) dst[j] = static_cast<torch::headeronly::Half>(src[j]);
}

}  // namespace cpu
}  // namespace gpuopt
