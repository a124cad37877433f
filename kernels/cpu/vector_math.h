// Internal to kernels/cpu: exp and the row reductions around it, 8 floats at a time with AVX2 and
// FMA, for the kernels whose time is their exp (cross-entropy over a 50k vocabulary, softmax,
// GELU, softplus, sigmoid, SiLU). The library is built for baseline x86-64, so each vector routine
// carries a target attribute (MPIGRAD_AVX2) and a caller picks it at run time with has_avx2_fma(),
// keeping its scalar loop for other CPUs and for the 16-bit and Float64 types.
//
// exp8: n = round(x log2 e), r = x - n ln 2 (in two parts, so r is exact to float rounding),
// exp(r) by its Taylor series to r^7 (|r| <= ln2 / 2: the first term left out is below 5e-9
// relative), times 2^n built in the exponent bits. Within 2 ulp of std::exp for x in
// [-87.33, 88.37]; 0 below (std::exp gives subnormals there, which no softmax can tell from 0),
// +inf above, NaN for NaN.
// Sums over a row run in 32 float lanes combined in a fixed order: the result depends on the row
// alone, never on the thread count.
#pragma once

#include <cstdint>

#include "mpigrad/kernels/scalar.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MPIGRAD_HAS_AVX2_MATH 1
#include <immintrin.h>
#define MPIGRAD_AVX2 __attribute__((target("avx2,fma")))
#endif

namespace mpigrad::kernels::cpu {

#if defined(MPIGRAD_HAS_AVX2_MATH)

// Whether this CPU runs the MPIGRAD_AVX2 routines (asked once).
inline bool has_avx2_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

namespace vector_math {

MPIGRAD_AVX2 inline __m256 exp8(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-87.33654f);  // exp(lowest) = FLT_MIN, 2^-126
  const __m256 highest = _mm256_set1_ps(88.37f);     // n stays <= 127
  const __m256 clamped = _mm256_min_ps(_mm256_max_ps(x, lowest), highest);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(clamped, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // ln 2 = 0.693359375 (exact in 9 bits, so n * it is exact) - 2.12194440e-4.
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), clamped);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  // Horner on 1 + r + r^2/2! + ... + r^7/7!.
  __m256 p = _mm256_set1_ps(float(1.0 / 5040));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(float(1.0 / 720)));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(float(1.0 / 120)));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(float(1.0 / 24)));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(float(1.0 / 6)));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 result = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  result = _mm256_blendv_ps(result, _mm256_setzero_ps(), _mm256_cmp_ps(x, lowest, _CMP_LT_OQ));
  result = _mm256_blendv_ps(result, _mm256_set1_ps(__builtin_inff()),
                            _mm256_cmp_ps(x, highest, _CMP_GT_OQ));
  return _mm256_blendv_ps(result, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// log(1 + u) for u >= 0 (and +inf; NaN kept), within 2 ulp of std::log1p: w = 1 + u rounded,
// w = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) = 2 atanh(s), s = (m - 1) / (m + 1), by its
// series to s^9 (|s| <= 0.1716: the first term left out is below 1e-9 relative), plus e ln 2 (in
// two parts), plus (u - (w - 1)) / w, the part of u that the rounding of w lost: without it, a
// small u would keep only the bits of u that fit beside the 1.
MPIGRAD_AVX2 inline __m256 log1p8(__m256 u) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 w = _mm256_add_ps(one, u);
  const __m256 lost = _mm256_div_ps(_mm256_sub_ps(u, _mm256_sub_ps(w, one)), w);
  const __m256i bits = _mm256_castps_si256(w);
  __m256i exponent = _mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(127));
  __m256 m = _mm256_castsi256_ps(_mm256_or_si256(
      _mm256_and_si256(bits, _mm256_set1_epi32(0x007fffff)), _mm256_castps_si256(one)));
  // m in [1, 2): above sqrt(2), halve it and count one more in the exponent.
  const __m256 above = _mm256_cmp_ps(m, _mm256_set1_ps(1.41421356f), _CMP_GT_OQ);
  m = _mm256_blendv_ps(m, _mm256_mul_ps(m, _mm256_set1_ps(0.5f)), above);
  exponent = _mm256_sub_epi32(exponent, _mm256_castps_si256(above));  // all ones (-1): adds 1
  const __m256 f = _mm256_sub_ps(m, one);
  const __m256 s = _mm256_div_ps(f, _mm256_add_ps(f, _mm256_set1_ps(2.0f)));
  const __m256 s2 = _mm256_mul_ps(s, s);
  __m256 p = _mm256_set1_ps(float(1.0 / 9));
  p = _mm256_fmadd_ps(p, s2, _mm256_set1_ps(float(1.0 / 7)));
  p = _mm256_fmadd_ps(p, s2, _mm256_set1_ps(float(1.0 / 5)));
  p = _mm256_fmadd_ps(p, s2, _mm256_set1_ps(float(1.0 / 3)));
  // 2 s + 2 s^3 p, so that the leading term keeps its own rounding.
  const __m256 two_s = _mm256_add_ps(s, s);
  const __m256 log_m = _mm256_fmadd_ps(_mm256_mul_ps(two_s, s2), p, two_s);
  const __m256 e = _mm256_cvtepi32_ps(exponent);
  // ln 2 = 0.693359375 (exact in 9 bits, so e * it is exact) - 2.12194440e-4.
  const __m256 low =
      _mm256_add_ps(_mm256_fmadd_ps(e, _mm256_set1_ps(-2.12194440e-4f), lost), log_m);
  __m256 result = _mm256_fmadd_ps(e, _mm256_set1_ps(0.693359375f), low);
  result =
      _mm256_blendv_ps(result, u, _mm256_cmp_ps(u, _mm256_set1_ps(__builtin_inff()), _CMP_EQ_OQ));
  return _mm256_blendv_ps(result, u, _mm256_cmp_ps(u, u, _CMP_UNORD_Q));
}

// 1 / (1 + exp(-x)), never exponentiating a large positive number: with e = exp(-|x|) in (0, 1],
// 1 / (1 + e) for x >= 0 and e / (1 + e) below, as the scalar kernels compute it.
MPIGRAD_AVX2 inline __m256 sigmoid8(__m256 x) {
  const __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), magnitude));
  const __m256 r = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
  const __m256 negative = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
  return _mm256_blendv_ps(r, _mm256_mul_ps(e, r), negative);
}

// log(1 + e^x) as max(x, 0) + log1p(exp(-|x|)): it never overflows. NaN stays NaN (max gives 0
// for it, and exp and log1p keep it).
MPIGRAD_AVX2 inline __m256 softplus8(__m256 x) {
  const __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), magnitude));
  return _mm256_add_ps(_mm256_max_ps(x, _mm256_setzero_ps()), log1p8(e));
}

MPIGRAD_AVX2 inline float sum8(__m256 v) {
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 quarter = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(quarter, _mm_movehdup_ps(quarter)));
}

MPIGRAD_AVX2 inline float max8(__m256 v) {
  const __m128 half = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 quarter = _mm_max_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_max_ss(quarter, _mm_movehdup_ps(quarter)));
}

// The first `count` (< 8) lanes of x, the rest `fill`: a row's tail in the same vector code.
MPIGRAD_AVX2 inline __m256 load_tail(const float* x, int64_t count, float fill) {
  alignas(32) float lanes[8];
  for (int k = 0; k < 8; ++k) lanes[k] = k < count ? x[k] : fill;
  return _mm256_load_ps(lanes);
}

MPIGRAD_AVX2 inline void store_tail(float* out, int64_t count, __m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  for (int k = 0; k < count; ++k) out[k] = lanes[k];
}

// max(x[0..n)); -inf for n == 0. A NaN anywhere need not survive (as std::max in a loop).
MPIGRAD_AVX2 inline float row_max(int64_t n, const float* x) {
  const __m256 lowest = _mm256_set1_ps(-__builtin_inff());
  __m256 m0 = lowest, m1 = lowest, m2 = lowest, m3 = lowest;
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + j));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + j + 8));
    m2 = _mm256_max_ps(m2, _mm256_loadu_ps(x + j + 16));
    m3 = _mm256_max_ps(m3, _mm256_loadu_ps(x + j + 24));
  }
  for (; j + 8 <= n; j += 8) m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + j));
  if (j < n) m1 = _mm256_max_ps(m1, load_tail(x + j, n - j, -__builtin_inff()));
  return max8(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
}

// exp(x[0..8) * scale - shift), stored to out unless it is null.
MPIGRAD_AVX2 inline __m256 exp_store(const float* x, __m256 scale, __m256 shift, float* out) {
  const __m256 e = exp8(_mm256_fmsub_ps(_mm256_loadu_ps(x), scale, shift));
  if (out != nullptr) _mm256_storeu_ps(out, e);
  return e;
}

// sum_j exp(scale * x[j] - shift), also written to out[j] when out is not null (out may be x).
MPIGRAD_AVX2 inline float exp_sum(int64_t n, const float* x, float scale, float shift, float* out) {
  const __m256 s = _mm256_set1_ps(scale), b = _mm256_set1_ps(shift);
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    a0 = _mm256_add_ps(a0, exp_store(x + j, s, b, out == nullptr ? nullptr : out + j));
    a1 = _mm256_add_ps(a1, exp_store(x + j + 8, s, b, out == nullptr ? nullptr : out + j + 8));
    a2 = _mm256_add_ps(a2, exp_store(x + j + 16, s, b, out == nullptr ? nullptr : out + j + 16));
    a3 = _mm256_add_ps(a3, exp_store(x + j + 24, s, b, out == nullptr ? nullptr : out + j + 24));
  }
  for (; j + 8 <= n; j += 8) {
    a0 = _mm256_add_ps(a0, exp_store(x + j, s, b, out == nullptr ? nullptr : out + j));
  }
  if (j < n) {
    // Lanes past the row's end are masked to 0 before they are summed or stored.
    const __m256 e = exp8(_mm256_fmsub_ps(load_tail(x + j, n - j, 0.0f), s, b));
    const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
        _mm256_set1_epi32(int(n - j)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
    const __m256 tail = _mm256_and_ps(e, keep);
    if (out != nullptr) store_tail(out + j, n - j, tail);
    a1 = _mm256_add_ps(a1, tail);
  }
  return sum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

// x[j] *= factor.
MPIGRAD_AVX2 inline void scale_row(int64_t n, float* x, float factor) {
  const __m256 f = _mm256_set1_ps(factor);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), f));
  for (; j < n; ++j) x[j] *= factor;
}

// 1 + erf(z), to about 1e-6 relative even where it is tiny (z far below 0): the
// Chebyshev-fitted erfc of Numerical Recipes (fractional error under 1.2e-7),
// erfc(a) = t exp(-a^2 - 1.26551223 + t P(t)), t = 1 / (1 + a / 2), a = |z|.
MPIGRAD_AVX2 inline __m256 one_plus_erf8(__m256 z) {
  const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), z);
  const __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f),
                                 _mm256_fmadd_ps(a, _mm256_set1_ps(0.5f), _mm256_set1_ps(1.0f)));
  const float coefficients[] = {0.17087277f,  -0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f,
                                -0.18628806f, 0.09678418f,  0.37409196f, 1.00002368f};
  __m256 p = _mm256_set1_ps(coefficients[0]);
  for (int k = 1; k < 9; ++k) p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(coefficients[k]));
  p = _mm256_fmsub_ps(p, t, _mm256_set1_ps(1.26551223f));
  const __m256 erfc = _mm256_mul_ps(t, exp8(_mm256_fnmadd_ps(a, a, p)));
  const __m256 positive = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_GE_OQ);
  return _mm256_blendv_ps(erfc, _mm256_sub_ps(_mm256_set1_ps(2.0f), erfc), positive);
}

// GELU's two forms (kernels/scalar.h's constants), and d gelu / dx times g.
// tanh form as a sigmoid: 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)), which also keeps the small
// values of x far below 0 that 1 + tanh(u) would cancel to 0.
MPIGRAD_AVX2 inline __m256 gelu_tanh_sigmoid8(__m256 x) {
  const __m256 x2 = _mm256_mul_ps(x, x);
  const __m256 minus_2u =
      _mm256_mul_ps(x, _mm256_fmadd_ps(x2, _mm256_set1_ps(float(-2 * kSqrt2OverPi * kGeluCubic)),
                                       _mm256_set1_ps(float(-2 * kSqrt2OverPi))));
  return _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(minus_2u)));
}

MPIGRAD_AVX2 inline __m256 gelu8(bool tanh_form, __m256 x) {
  if (tanh_form) return _mm256_mul_ps(x, gelu_tanh_sigmoid8(x));
  const __m256 half_x = _mm256_mul_ps(x, _mm256_set1_ps(0.5f));
  return _mm256_mul_ps(half_x, one_plus_erf8(_mm256_mul_ps(x, _mm256_set1_ps(float(kSqrtHalf)))));
}

MPIGRAD_AVX2 inline __m256 gelu_grad8(bool tanh_form, __m256 g, __m256 x) {
  const __m256 x2 = _mm256_mul_ps(x, x);
  if (tanh_form) {
    // s + 2 x s (1 - s) du/dx, du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
    const __m256 s = gelu_tanh_sigmoid8(x);
    const __m256 du = _mm256_fmadd_ps(x2, _mm256_set1_ps(float(kSqrt2OverPi * 3 * kGeluCubic)),
                                      _mm256_set1_ps(float(kSqrt2OverPi)));
    const __m256 slope = _mm256_mul_ps(_mm256_mul_ps(_mm256_add_ps(x, x), s),
                                       _mm256_mul_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), s), du));
    return _mm256_mul_ps(g, _mm256_add_ps(s, slope));
  }
  // Phi(x) + x phi(x).
  const __m256 cdf = _mm256_mul_ps(
      _mm256_set1_ps(0.5f), one_plus_erf8(_mm256_mul_ps(x, _mm256_set1_ps(float(kSqrtHalf)))));
  const __m256 pdf = _mm256_mul_ps(_mm256_set1_ps(float(kInvSqrt2Pi)),
                                   exp8(_mm256_mul_ps(x2, _mm256_set1_ps(-0.5f))));
  return _mm256_mul_ps(g, _mm256_fmadd_ps(x, pdf, cdf));
}

// The activations of the dense Float32 unary kernels, forward and d/dx times g: GELU's two
// forms, and those whose time is their exp and log1p (SchNet's shifted softplus runs on every
// edge's filter).
enum class Activation { GeluTanh, GeluErf, Softplus, Sigmoid, Silu };

template <Activation A>
MPIGRAD_AVX2 inline __m256 activation8(__m256 x) {
  if constexpr (A == Activation::GeluTanh || A == Activation::GeluErf) {
    return gelu8(A == Activation::GeluTanh, x);
  }
  if constexpr (A == Activation::Softplus) return softplus8(x);
  if constexpr (A == Activation::Sigmoid) return sigmoid8(x);
  if constexpr (A == Activation::Silu) return _mm256_mul_ps(x, sigmoid8(x));
}

template <Activation A>
MPIGRAD_AVX2 inline __m256 activation_grad8(__m256 g, __m256 x) {
  if constexpr (A == Activation::GeluTanh || A == Activation::GeluErf) {
    return gelu_grad8(A == Activation::GeluTanh, g, x);
  } else {
    const __m256 s = sigmoid8(x);
    if constexpr (A == Activation::Softplus) return _mm256_mul_ps(g, s);
    const __m256 one_minus_s = _mm256_sub_ps(_mm256_set1_ps(1.0f), s);
    if constexpr (A == Activation::Sigmoid) return _mm256_mul_ps(g, _mm256_mul_ps(s, one_minus_s));
    // silu' = s (1 + x (1 - s)).
    if constexpr (A == Activation::Silu) {
      return _mm256_mul_ps(g,
                           _mm256_mul_ps(s, _mm256_fmadd_ps(x, one_minus_s, _mm256_set1_ps(1.0f))));
    }
  }
}

// out[i] = A(x[i]) when g is null, else g[i] A'(x[i]).
template <Activation A>
MPIGRAD_AVX2 inline void activation(int64_t n, const float* g, const float* x, float* out) {
  int64_t i = 0;
  if (g == nullptr) {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, activation8<A>(_mm256_loadu_ps(x + i)));
    if (i < n) store_tail(out + i, n - i, activation8<A>(load_tail(x + i, n - i, 0.0f)));
    return;
  }
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, activation_grad8<A>(_mm256_loadu_ps(g + i), _mm256_loadu_ps(x + i)));
  }
  if (i < n) {
    store_tail(out + i, n - i,
               activation_grad8<A>(load_tail(g + i, n - i, 0.0f), load_tail(x + i, n - i, 0.0f)));
  }
}

}  // namespace vector_math

#else

inline bool has_avx2_fma() {
  return false;
}

#endif

}  // namespace mpigrad::kernels::cpu
