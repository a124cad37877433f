// CPU 2-d pooling: max (recording each winner's tap in its window), average, adaptive average.
//
// Layout: dense [planes, height, width] in, [planes, out_h, out_w] out.
// Threading: planes are spread over threads; a plane's outputs and its input gradient belong to
// one thread, so backward's scatter needs no atomics and results do not depend on thread count.
#include "mpigrad/kernels/pooling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "mpigrad/kernels/cpu/max_pool_2x2.h"
#include "mpigrad/kernels/cpu/parallel.h"
#include "mpigrad/kernels/cpu/scalar.h"
#include "mpigrad/kernels/cpu/vector_math.h"

namespace mpigrad::kernels::cpu {
namespace {

int64_t plane_grain(const Pool2dGeometry& g) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, g.height * g.width));
}

// The common 2x2 window, stride 2, no padding or dilation: windows tile the input without
// overlapping.
bool is_2x2(const Pool2dGeometry& g) {
  return g.kernel_h == 2 && g.kernel_w == 2 && g.stride_h == 2 && g.stride_w == 2 && g.pad_h == 0 &&
         g.pad_w == 0 && g.dilation_h == 1 && g.dilation_w == 1;
}

// Windows that never overlap (stride at least the kernel, no dilation), so each input element
// lies in at most one window and backward writes it once, its gradient or 0, with no zero fill
// of the plane first. Such a window always holds an input element (padding is at most half the
// kernel), so its tap names one.
bool windows_disjoint(const Pool2dGeometry& g) {
  return g.stride_h >= g.kernel_h && g.stride_w >= g.kernel_w &&
         (g.dilation_h == 1 || g.kernel_h == 1) && (g.dilation_w == 1 || g.kernel_w == 1);
}

// Whether the Float32 2x2 routines of namespace avx2 run.
template <typename T>
bool use_avx2_2x2(const Pool2dGeometry& g) {
#if defined(MPIGRAD_HAS_AVX2_MATH)
  return std::is_same_v<T, float> && is_2x2(g) && has_avx2_fma();
#else
  (void)g;
  return false;
#endif
}

// The plane position of tap `tap` of window (oy, ox); 0 where it lies in the padding (a window
// with no input element in it at all records tap 0, and PyTorch's index 0).
int64_t flat_of(const Pool2dGeometry& g, int64_t oy, int64_t ox, int64_t tap) {
  const int64_t y = oy * g.stride_h - g.pad_h + (tap / g.kernel_w) * g.dilation_h;
  const int64_t x = ox * g.stride_w - g.pad_w + (tap % g.kernel_w) * g.dilation_w;
  return y < 0 || y >= g.height || x < 0 || x >= g.width ? 0 : y * g.width + x;
}

// Calls fn with a value of the integer type that max_pool2d_tap_dtype(g) names.
template <typename Fn>
void with_tap_type(const Pool2dGeometry& g, Fn fn) {
  switch (max_pool2d_tap_dtype(g)) {
    case DType::UInt8:
      return fn(uint8_t{});
    case DType::Int32:
      return fn(int32_t{});
    default:
      return fn(int64_t{});
  }
}

#if defined(MPIGRAD_HAS_AVX2_MATH)
// Float32 2x2 windows, 8 outputs at a time (AVX2), with exactly the rules of max_forward_2x2 below:
// the four candidates of a window are taken in the order (0,0) (0,1) (1,0) (1,1), taps 0 to 3, a
// later one replacing the best only when strictly greater, then every NaN replaces it in that same
// order. Backward writes each input element once: the gradient where its tap won, else 0.
namespace avx2 {

// Lanes [0, count) all ones: the mask of a tail's loads and stores.
MPIGRAD_AVX2 inline __m256i lanes_below(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(std::min<int64_t>(count, 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// The 2*count floats of `row` from 0 as its even and odd elements, count <= 8, in the lane order
// 0 1 4 5 2 3 6 7 that shuffle_ps leaves (put right once per result, by permute4x64 0xD8).
MPIGRAD_AVX2 inline void load_pairs(const float* row, int64_t count, __m256& even, __m256& odd) {
  __m256 low, high;
  if (count == 8) {
    low = _mm256_loadu_ps(row);
    high = _mm256_loadu_ps(row + 8);
  } else {
    // Masked loads read nothing past the row.
    low = _mm256_maskload_ps(row, lanes_below(2 * count));
    high = _mm256_maskload_ps(row + 8, lanes_below(std::max<int64_t>(2 * count - 8, 0)));
  }
  even = _mm256_shuffle_ps(low, high, 0x88);
  odd = _mm256_shuffle_ps(low, high, 0xDD);
}

MPIGRAD_AVX2 inline __m256 unshuffle(__m256 v) {
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(v), 0xD8));
}

// Stores the first `count` (<= 8) lanes of v at out; all 8 where they end before `limit`, as
// whole-vector stores beat partial ones (masked stores take tens of cycles on some CPUs), and
// every element past `count` is written again later by the caller.
MPIGRAD_AVX2 inline void store_up_to(float* out, int64_t count, const float* limit, __m256 v) {
  if (limit - out >= 8) {
    _mm256_storeu_ps(out, v);
  } else if (count > 0) {
    vector_math::store_tail(out, count, v);
  }
}

// Outputs [0, count) of 8 windows, count <= 8, from row0 and row1, the windows' two input rows
// from their first column: 16 floats each are loaded whole where `whole`, else only the 2*count
// wanted. Stores run past count up to `limit` (store_up_to).
MPIGRAD_AVX2 inline void max_2x2_forward_8(const float* row0, const float* row1, bool whole,
                                           int64_t count, const float* limit, float* out,
                                           uint8_t* taps) {
  const __m256 tap_b = _mm256_castsi256_ps(_mm256_set1_epi32(1));
  const __m256 tap_c = _mm256_castsi256_ps(_mm256_set1_epi32(2));
  const __m256 tap_d = _mm256_castsi256_ps(_mm256_set1_epi32(3));
  __m256 a, b, c, d;
  load_pairs(row0, whole ? 8 : count, a, b);
  load_pairs(row1, whole ? 8 : count, c, d);
  __m256 best = a, tap = _mm256_setzero_ps();
  __m256 take = _mm256_cmp_ps(b, best, _CMP_GT_OQ);
  best = _mm256_blendv_ps(best, b, take);
  tap = _mm256_blendv_ps(tap, tap_b, take);
  take = _mm256_cmp_ps(c, best, _CMP_GT_OQ);
  best = _mm256_blendv_ps(best, c, take);
  tap = _mm256_blendv_ps(tap, tap_c, take);
  take = _mm256_cmp_ps(d, best, _CMP_GT_OQ);
  best = _mm256_blendv_ps(best, d, take);
  tap = _mm256_blendv_ps(tap, tap_d, take);
  const __m256 any_nan =
      _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_UNORD_Q), _mm256_cmp_ps(c, d, _CMP_UNORD_Q));
  if (_mm256_movemask_ps(any_nan) != 0) [[unlikely]] {
    // PyTorch's rule: a NaN wins, and a later NaN replaces an earlier one.
    const __m256 candidates[4] = {a, b, c, d};
    const __m256 taps_of[4] = {_mm256_setzero_ps(), tap_b, tap_c, tap_d};
    for (int k = 0; k < 4; ++k) {
      const __m256 nan = _mm256_cmp_ps(candidates[k], candidates[k], _CMP_UNORD_Q);
      best = _mm256_blendv_ps(best, candidates[k], nan);
      tap = _mm256_blendv_ps(tap, taps_of[k], nan);
    }
  }
  // The eight taps (0..3) as bytes, in output order.
  const __m256i ordered = _mm256_permute4x64_epi64(_mm256_castps_si256(tap), 0xD8);
  const __m128i words =
      _mm_packus_epi32(_mm256_castsi256_si128(ordered), _mm256_extracti128_si256(ordered, 1));
  const __m128i bytes = _mm_packus_epi16(words, words);
  store_up_to(out, count, limit, unshuffle(best));
  if (limit - out >= 8) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(taps), bytes);
  } else {
    alignas(16) uint8_t lanes[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(lanes), bytes);
    std::memcpy(taps, lanes, size_t(count));
  }
}

// Planes [begin, end) of the output and taps, rows in order. A row of 8 or more outputs runs as
// groups of 8, the last one moved back to end with the row (some outputs computed twice, to the
// same values), so every load and store is whole; a shorter row is one group whose loads are
// whole but at the end of the input and whose stores run into the outputs after it, written
// later, up to the end of these planes.
MPIGRAD_AVX2 void max_2x2_forward_planes(const Pool2dGeometry& g, const float* in, float* out,
                                         uint8_t* taps, int64_t begin, int64_t end) {
  const int64_t height = g.height, width = g.width, out_h = g.out_h, out_w = g.out_w;
  const float* limit = out + end * out_h * out_w;
  const float* in_end = in + g.planes * height * width;
  for (int64_t p = begin; p < end; ++p) {
    const float* plane = in + p * height * width;
    for (int64_t oy = 0; oy < out_h; ++oy) {
      const float* row0 = plane + 2 * oy * width;
      const float* row1 = row0 + width;
      const int64_t o = (p * out_h + oy) * out_w;
      if (out_w >= 8) {
        for (int64_t ox = 0;; ox += 8) {
          ox = std::min(ox, out_w - 8);
          max_2x2_forward_8(row0 + 2 * ox, row1 + 2 * ox, true, 8, limit, out + o + ox,
                            taps + o + ox);
          if (ox + 8 == out_w) break;
        }
      } else {
        max_2x2_forward_8(row0, row1, in_end - row1 >= 16, out_w, limit, out + o, taps + o);
      }
    }
  }
}

// 0 + g where the window's tap is `tap`, else 0: as the scatter into a zeroed plane adds it (-0
// becomes +0).
MPIGRAD_AVX2 inline __m256 share_of_tap(__m256 g, __m256i taps, int tap) {
  const __m256 won = _mm256_castsi256_ps(_mm256_cmpeq_epi32(taps, _mm256_set1_epi32(tap)));
  return _mm256_add_ps(_mm256_and_ps(g, won), _mm256_setzero_ps());
}

// The two input rows of 8 windows (16 elements each, at row0 and row1) from their gradient and
// taps; `count` (<= 8) of them are wanted, and stores run past them up to `limit` (store_up_to).
// row0 is written first, so where its stores run into row1 row1's own overwrite them.
MPIGRAD_AVX2 inline void max_2x2_backward_8(__m256 g, __m256i taps, int64_t count,
                                            const float* limit, float* row0, float* row1) {
  const __m256 a = share_of_tap(g, taps, 0), b = share_of_tap(g, taps, 1);
  const __m256 c = share_of_tap(g, taps, 2), d = share_of_tap(g, taps, 3);
  // Interleave a with b and c with d: unpack works within 128-bit halves.
  const __m256 ab_low = _mm256_unpacklo_ps(a, b), ab_high = _mm256_unpackhi_ps(a, b);
  const __m256 cd_low = _mm256_unpacklo_ps(c, d), cd_high = _mm256_unpackhi_ps(c, d);
  const int64_t first = std::min<int64_t>(2 * count, 8),
                second = std::max<int64_t>(2 * count - 8, 0);
  store_up_to(row0, first, limit, _mm256_permute2f128_ps(ab_low, ab_high, 0x20));
  store_up_to(row0 + 8, second, limit, _mm256_permute2f128_ps(ab_low, ab_high, 0x31));
  store_up_to(row1, first, limit, _mm256_permute2f128_ps(cd_low, cd_high, 0x20));
  store_up_to(row1 + 8, second, limit, _mm256_permute2f128_ps(cd_low, cd_high, 0x31));
}

MPIGRAD_AVX2 inline __m256i load_taps_8(const uint8_t* taps) {
  uint64_t packed;
  std::memcpy(&packed, taps, 8);
  return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(packed)));
}

// Planes [begin, end) of grad_in from the gradient and taps of their windows, in order. A row
// of 8 or more windows runs as groups of 8, the last one moved back to end with the row (it
// writes some elements twice, with the same values) so that every load and store is whole; a
// shorter row is one group whose stores run into the elements after it, written later (up to
// the end of these planes), and whose loads are whole but at the end of the gradient.
MPIGRAD_AVX2 void max_2x2_backward_planes(const Pool2dGeometry& g, const float* grad_out,
                                          const uint8_t* taps, float* grad_in, int64_t begin,
                                          int64_t end) {
  const int64_t height = g.height, width = g.width, out_h = g.out_h, out_w = g.out_w;
  const float* limit = grad_in + end * height * width;
  const float* grad_end = grad_out + g.planes * out_h * out_w;
  for (int64_t p = begin; p < end; ++p) {
    float* plane = grad_in + p * height * width;
    for (int64_t oy = 0; oy < out_h; ++oy) {
      float* row0 = plane + 2 * oy * width;
      float* row1 = row0 + width;
      const int64_t o = (p * out_h + oy) * out_w;
      const float* grad = grad_out + o;
      const uint8_t* tap = taps + o;
      if (out_w >= 8) {
        for (int64_t ox = 0;; ox += 8) {
          ox = std::min(ox, out_w - 8);
          max_2x2_backward_8(_mm256_loadu_ps(grad + ox), load_taps_8(tap + ox), 8, limit,
                             row0 + 2 * ox, row1 + 2 * ox);
          if (ox + 8 == out_w) break;
        }
      } else if (grad_end - grad >= 8) {
        max_2x2_backward_8(_mm256_loadu_ps(grad), load_taps_8(tap), out_w, limit, row0, row1);
      } else {
        uint64_t packed = 0;
        for (int64_t k = 0; k < out_w; ++k) packed |= uint64_t(tap[k]) << (8 * k);
        max_2x2_backward_8(_mm256_maskload_ps(grad, lanes_below(out_w)),
                           _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(packed))), out_w, limit,
                           row0, row1);
      }
      if (width % 2 != 0) row0[width - 1] = row1[width - 1] = 0.0f;
    }
    if (height % 2 != 0) std::fill_n(plane + (height - 1) * width, width, 0.0f);
  }
}

}  // namespace avx2
#endif

// The common 2x2 window, stride 2, no padding or dilation, with the same rules as the general
// loop below (the first of equal maxima wins; NaN windows go through the general rule). Four
// loads and three masked selects per output, no branch on the data.
template <typename T>
void max_forward_2x2(const Pool2dGeometry& g, const T* in, T* out, uint8_t* taps) {
  const int64_t width = g.width, out_h = g.out_h, out_w = g.out_w;
#if defined(MPIGRAD_HAS_AVX2_MATH)
  if constexpr (std::is_same_v<T, float>) {
    if (use_avx2_2x2<T>(g)) {
      parallel_for(0, g.planes, plane_grain(g), [&](int64_t begin, int64_t end) {
        avx2::max_2x2_forward_planes(g, in, out, taps, begin, end);
      });
      return;
    }
  }
#endif
  parallel_for(0, g.planes, plane_grain(g), [&, width, out_h, out_w](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* plane = in + p * g.height * width;
      for (int64_t oy = 0; oy < out_h; ++oy) {
        const T* row0 = plane + 2 * oy * width;
        const T* row1 = row0 + width;
        T* out_row = out + (p * out_h + oy) * out_w;
        uint8_t* tap_row = taps + (p * out_h + oy) * out_w;
        for (int64_t ox = 0; ox < out_w; ++ox) {
          const T a = row0[2 * ox], b = row0[2 * ox + 1], c = row1[2 * ox], d = row1[2 * ox + 1];
          T best = a;
          int32_t tap = 0;
          int32_t take = -int32_t(b > best);
          tap = (tap & ~take) | (1 & take);
          best = best >= b ? best : b;
          take = -int32_t(c > best);
          tap = (tap & ~take) | (2 & take);
          best = best >= c ? best : c;
          take = -int32_t(d > best);
          tap = (tap & ~take) | (3 & take);
          best = best >= d ? best : d;
          if ((a != a) | (b != b) | (c != c) | (d != d)) [[unlikely]] {
            // PyTorch's rule: a NaN wins, and a later NaN replaces an earlier one.
            const T window[4] = {a, b, c, d};
            for (int k = 0; k < 4; ++k) {
              if (std::isnan(window[k])) {
                best = window[k];
                tap = k;
              }
            }
          }
          out_row[ox] = best;
          tap_row[ox] = uint8_t(tap);
        }
      }
    }
  });
}

// One tap of a row of windows: the candidates row[ox * stride + offset] for outputs ox in [lo, hi),
// against the row's best values so far (in the output row), their taps (-1: none yet) and NaN
// flags. A candidate takes the window when strictly greater or when the window has none yet; the
// value only when strictly greater (so a first -inf or NaN leaves -inf, and ties keep the first).
// Branch-free, so that the compiler vectorizes it over ox; Stride > 0 fixes the stride at compile
// time (1 and 2: contiguous and pairwise loads), 0 reads it from `stride`.
template <int Stride, typename T>
inline __attribute__((always_inline)) void max_tap_row(const T* row, int64_t offset,
                                                       int64_t stride, int64_t lo, int64_t hi,
                                                       int32_t tap, T* best, int32_t* taps,
                                                       int32_t* nan) {
  const int64_t step = Stride > 0 ? Stride : stride;
  for (int64_t ox = lo; ox < hi; ++ox) {
    const T v = row[ox * step + offset];
    const T b = best[ox];
    const int32_t t = taps[ox];
    // A blend written as arithmetic: as `?:` GCC makes it a masked store, tens of cycles on AMD.
    const int32_t take = -int32_t((v > b) | (t < 0));
    taps[ox] = t ^ ((t ^ tap) & take);
    best[ox] = v > b ? v : b;
    nan[ox] |= int32_t(v != v);
  }
}

// The outputs [lo, hi) of a row of windows whose column j lies in the input: the same for every
// row, so worked out once a call.
struct ColumnRange {
  int64_t lo = 0, hi = 0;
};

std::vector<ColumnRange> column_ranges(const Pool2dGeometry& g) {
  std::vector<ColumnRange> ranges(size_t(g.kernel_w));
  for (int64_t j = 0; j < g.kernel_w; ++j) {
    // Input column x = ox * stride_w + offset.
    const int64_t offset = j * g.dilation_w - g.pad_w;
    const int64_t lo = offset >= 0 ? 0 : (-offset + g.stride_w - 1) / g.stride_w;
    const int64_t last_x = g.width - 1 - offset;
    const int64_t hi = last_x < 0 ? 0 : std::min(g.out_w, last_x / g.stride_w + 1);
    ranges[size_t(j)] = {lo, std::max(lo, hi)};
  }
  return ranges;
}

// Output row oy of one plane: every tap in window order (row i, then column j), each over the
// whole row of windows, then PyTorch's NaN rule for the windows that saw one. Same comparisons in
// the same order per window as one window at a time, so the same winners and bits.
template <int Stride, typename T, typename Tap>
inline __attribute__((always_inline)) void max_forward_row(const Pool2dGeometry& g,
                                                           const ColumnRange* columns,
                                                           const T* plane, int64_t oy, T* out_row,
                                                           Tap* tap_row, int32_t* taps,
                                                           int32_t* nan) {
  std::fill_n(out_row, g.out_w, -std::numeric_limits<T>::infinity());
  std::fill_n(taps, g.out_w, -1);
  std::fill_n(nan, g.out_w, 0);
  for (int64_t i = 0; i < g.kernel_h; ++i) {
    const int64_t y = oy * g.stride_h - g.pad_h + i * g.dilation_h;
    if (y < 0 || y >= g.height) continue;
    const T* row = plane + y * g.width;
    for (int64_t j = 0; j < g.kernel_w; ++j) {
      const ColumnRange c = columns[j];
      max_tap_row<Stride>(row, j * g.dilation_w - g.pad_w, g.stride_w, c.lo, c.hi,
                          int32_t(i * g.kernel_w + j), out_row, taps, nan);
    }
  }
  int32_t any_nan = 0;
  for (int64_t ox = 0; ox < g.out_w; ++ox) any_nan |= nan[ox];
  for (int64_t ox = 0; any_nan != 0 && ox < g.out_w; ++ox) {
    if (nan[ox] == 0) continue;
    // PyTorch's rule: a NaN wins, and a later NaN replaces an earlier one.
    for (int64_t i = 0; i < g.kernel_h; ++i) {
      const int64_t y = oy * g.stride_h - g.pad_h + i * g.dilation_h;
      for (int64_t j = 0; y >= 0 && y < g.height && j < g.kernel_w; ++j) {
        const int64_t x = ox * g.stride_w - g.pad_w + j * g.dilation_w;
        if (x >= 0 && x < g.width && std::isnan(plane[y * g.width + x])) {
          out_row[ox] = plane[y * g.width + x];
          taps[ox] = int32_t(i * g.kernel_w + j);
        }
      }
    }
  }
  for (int64_t ox = 0; ox < g.out_w; ++ox) tap_row[ox] = Tap(taps[ox] < 0 ? 0 : taps[ox]);
}

// Planes [begin, end), a row of windows at a time.
template <int Stride, typename T, typename Tap>
inline __attribute__((always_inline)) void max_forward_planes(const Pool2dGeometry& g,
                                                              const ColumnRange* columns,
                                                              const T* in, T* out, Tap* taps,
                                                              int64_t begin, int64_t end,
                                                              int32_t* row_taps, int32_t* row_nan) {
  for (int64_t p = begin; p < end; ++p) {
    const T* plane = in + p * g.height * g.width;
    for (int64_t oy = 0; oy < g.out_h; ++oy) {
      const int64_t o = (p * g.out_h + oy) * g.out_w;
      max_forward_row<Stride>(g, columns, plane, oy, out + o, taps + o, row_taps, row_nan);
    }
  }
}

#if defined(MPIGRAD_HAS_AVX2_MATH)
template <int Stride, typename T, typename Tap>
MPIGRAD_AVX2 void max_forward_planes_avx2(const Pool2dGeometry& g, const ColumnRange* columns,
                                          const T* in, T* out, Tap* taps, int64_t begin,
                                          int64_t end, int32_t* row_taps, int32_t* row_nan) {
  max_forward_planes<Stride>(g, columns, in, out, taps, begin, end, row_taps, row_nan);
}
#endif

template <int Stride, typename T, typename Tap>
void max_forward_rows(const Pool2dGeometry& g, const T* in, T* out, Tap* taps) {
  const std::vector<ColumnRange> columns = column_ranges(g);
  parallel_for(0, g.planes, plane_grain(g), [&](int64_t begin, int64_t end) {
    std::vector<int32_t> row_taps(size_t(g.out_w)), row_nan(size_t(g.out_w));
#if defined(MPIGRAD_HAS_AVX2_MATH)
    if (has_avx2_fma()) {
      return max_forward_planes_avx2<Stride>(g, columns.data(), in, out, taps, begin, end,
                                             row_taps.data(), row_nan.data());
    }
#endif
    max_forward_planes<Stride>(g, columns.data(), in, out, taps, begin, end, row_taps.data(),
                               row_nan.data());
  });
}

template <typename T, typename Tap>
void max_forward(const Pool2dGeometry& g, const T* in, T* out, Tap* taps) {
  if constexpr (std::is_same_v<Tap, uint8_t>) {
    if (is_2x2(g)) return max_forward_2x2(g, in, out, taps);
  }
  if (g.stride_w == 1) return max_forward_rows<1>(g, in, out, taps);
  if (g.stride_w == 2) return max_forward_rows<2>(g, in, out, taps);
  max_forward_rows<0>(g, in, out, taps);
}

// Float32 2x2 windows with AVX2 (max_2x2_backward_planes).
template <typename T>
bool max_backward_2x2(const Pool2dGeometry& g, const T* grad_out, const uint8_t* taps, T* grad_in) {
#if defined(MPIGRAD_HAS_AVX2_MATH)
  if constexpr (std::is_same_v<T, float>) {
    if (use_avx2_2x2<T>(g)) {
      parallel_for(0, g.planes, plane_grain(g), [&](int64_t begin, int64_t end) {
        avx2::max_2x2_backward_planes(g, grad_out, taps, grad_in, begin, end);
      });
      return true;
    }
  }
#endif
  (void)g, (void)grad_out, (void)taps, (void)grad_in;
  return false;
}

// Disjoint windows (windows_disjoint): each input element written once with `=`, its window's
// gradient where its tap won (0 + g, as a scatter into zeros adds it), else 0.
template <typename T, typename Tap>
void max_backward_disjoint(const Pool2dGeometry& geometry, const T* grad_out, const Tap* taps,
                           T* grad_in) {
  parallel_for(0, geometry.planes, plane_grain(geometry),
               [g = geometry, grad_out, taps, grad_in](int64_t begin, int64_t end) {
                 for (int64_t p = begin; p < end; ++p) {
                   T* plane = grad_in + p * g.height * g.width;
                   const T* grad_plane = grad_out + p * g.out_h * g.out_w;
                   const Tap* tap_plane = taps + p * g.out_h * g.out_w;
                   // Input row y is kernel row i of window row oy: y + pad_h = oy*stride_h + i.
                   int64_t oy = g.pad_h / g.stride_h, i = g.pad_h % g.stride_h;
                   for (int64_t y = 0; y < g.height; ++y) {
                     T* row = plane + y * g.width;
                     if (i < g.kernel_h && oy < g.out_h) {
                       const T* grad_row = grad_plane + oy * g.out_w;
                       const Tap* tap_row = tap_plane + oy * g.out_w;
                       int64_t ox = g.pad_w / g.stride_w, j = g.pad_w % g.stride_w;
                       for (int64_t x = 0; x < g.width; ++x) {
                         const bool won = j < g.kernel_w && ox < g.out_w &&
                                          int64_t(tap_row[ox]) == i * g.kernel_w + j;
                         row[x] = won ? T(0) + grad_row[ox] : T(0);
                         if (++j == g.stride_w) j = 0, ++ox;
                       }
                     } else {
                       std::fill_n(row, g.width, T(0));
                     }
                     if (++i == g.stride_h) i = 0, ++oy;
                   }
                 }
               });
}

// Overlapping windows: zero the plane, then add each output's gradient to its winner, outputs in
// order (so sums on shared winners round the same at any thread count). A tap's row and column
// offsets in its window come from a table made once a call (flat_of divides per output).
template <typename T, typename Tap>
void max_backward_scatter(const Pool2dGeometry& geometry, const T* grad_out, const Tap* taps,
                          T* grad_in) {
  const int64_t window = geometry.kernel_h * geometry.kernel_w;
  std::vector<int64_t> tap_dy(static_cast<size_t>(window)), tap_dx(static_cast<size_t>(window));
  for (int64_t t = 0; t < window; ++t) {
    tap_dy[size_t(t)] = (t / geometry.kernel_w) * geometry.dilation_h - geometry.pad_h;
    tap_dx[size_t(t)] = (t % geometry.kernel_w) * geometry.dilation_w - geometry.pad_w;
  }
  parallel_for(0, geometry.planes, plane_grain(geometry),
               [g = geometry, grad_out, taps, grad_in, dy = tap_dy.data(),
                dx = tap_dx.data()](int64_t begin, int64_t end) {
                 for (int64_t p = begin; p < end; ++p) {
                   T* plane = grad_in + p * g.height * g.width;
                   std::fill_n(plane, g.height * g.width, T(0));
                   const T* grad_plane = grad_out + p * g.out_h * g.out_w;
                   const Tap* tap_plane = taps + p * g.out_h * g.out_w;
                   for (int64_t oy = 0; oy < g.out_h; ++oy) {
                     for (int64_t ox = 0; ox < g.out_w; ++ox) {
                       const int64_t o = oy * g.out_w + ox;
                       const int64_t t = int64_t(tap_plane[o]);
                       const int64_t y = oy * g.stride_h + dy[t], x = ox * g.stride_w + dx[t];
                       // A window with no input element recorded tap 0 (flat_of's position 0).
                       const bool inside = y >= 0 && y < g.height && x >= 0 && x < g.width;
                       plane[inside ? y * g.width + x : 0] += grad_plane[o];
                     }
                   }
                 }
               });
}

template <typename T, typename Tap>
void max_backward(const Pool2dGeometry& g, const T* grad_out, const Tap* taps, T* grad_in) {
  if constexpr (std::is_same_v<Tap, uint8_t>) {
    if (max_backward_2x2(g, grad_out, taps, grad_in)) return;
  }
  if (windows_disjoint(g)) return max_backward_disjoint(g, grad_out, taps, grad_in);
  max_backward_scatter(g, grad_out, taps, grad_in);
}

template <typename T>
void max_forward_any(const Pool2dGeometry& g, const T* in, T* out, void* taps) {
  with_tap_type(g, [&](auto tag) {
    using Tap = decltype(tag);
    max_forward(g, in, out, static_cast<Tap*>(taps));
  });
}

template <typename T>
void max_backward_any(const Pool2dGeometry& g, const T* grad_out, const void* taps, T* grad_in) {
  with_tap_type(g, [&](auto tag) {
    using Tap = decltype(tag);
    max_backward(g, grad_out, static_cast<const Tap*>(taps), grad_in);
  });
}

// The window of output (oy, ox) clipped to the input, and its divisor.
struct Window {
  int64_t y0, y1, x0, x1;
  int64_t divisor;
};

Window avg_window(const Pool2dGeometry& g, bool count_include_pad, int64_t oy, int64_t ox) {
  int64_t y0 = oy * g.stride_h - g.pad_h, x0 = ox * g.stride_w - g.pad_w;
  int64_t y1 = std::min(y0 + g.kernel_h, g.height + g.pad_h);
  int64_t x1 = std::min(x0 + g.kernel_w, g.width + g.pad_w);
  const int64_t padded_area = (y1 - y0) * (x1 - x0);
  y0 = std::max<int64_t>(y0, 0);
  x0 = std::max<int64_t>(x0, 0);
  y1 = std::min(y1, g.height);
  x1 = std::min(x1, g.width);
  const int64_t divisor = count_include_pad ? padded_area : (y1 - y0) * (x1 - x0);
  return {y0, y1, x0, x1, std::max<int64_t>(divisor, 1)};
}

template <typename T>
void avg_forward(const Pool2dGeometry& g, bool include_pad, const T* in, T* out) {
  parallel_for(0, g.planes, plane_grain(g), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* plane = in + p * g.height * g.width;
      T* out_plane = out + p * g.out_h * g.out_w;
      for (int64_t oy = 0; oy < g.out_h; ++oy) {
        for (int64_t ox = 0; ox < g.out_w; ++ox) {
          const Window w = avg_window(g, include_pad, oy, ox);
          double total = 0;
          for (int64_t y = w.y0; y < w.y1; ++y)
            for (int64_t x = w.x0; x < w.x1; ++x) total += double(plane[y * g.width + x]);
          out_plane[oy * g.out_w + ox] = T(total / double(w.divisor));
        }
      }
    }
  });
}

template <typename T>
void avg_backward(const Pool2dGeometry& g, bool include_pad, const T* grad_out, T* grad_in) {
  parallel_for(0, g.planes, plane_grain(g), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      T* plane = grad_in + p * g.height * g.width;
      std::fill(plane, plane + g.height * g.width, T(0));
      const T* go = grad_out + p * g.out_h * g.out_w;
      for (int64_t oy = 0; oy < g.out_h; ++oy) {
        for (int64_t ox = 0; ox < g.out_w; ++ox) {
          const Window w = avg_window(g, include_pad, oy, ox);
          const T share = T(double(go[oy * g.out_w + ox]) / double(w.divisor));
          for (int64_t y = w.y0; y < w.y1; ++y)
            for (int64_t x = w.x0; x < w.x1; ++x) plane[y * g.width + x] += share;
        }
      }
    }
  });
}

inline int64_t adaptive_start(int64_t i, int64_t in, int64_t out) {
  return (i * in) / out;
}
inline int64_t adaptive_end(int64_t i, int64_t in, int64_t out) {
  return ((i + 1) * in + out - 1) / out;
}

template <typename T>
void adaptive_forward(const Pool2dGeometry& g, const T* in, T* out) {
  parallel_for(0, g.planes, plane_grain(g), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* plane = in + p * g.height * g.width;
      T* out_plane = out + p * g.out_h * g.out_w;
      for (int64_t oy = 0; oy < g.out_h; ++oy) {
        const int64_t y0 = adaptive_start(oy, g.height, g.out_h);
        const int64_t y1 = adaptive_end(oy, g.height, g.out_h);
        for (int64_t ox = 0; ox < g.out_w; ++ox) {
          const int64_t x0 = adaptive_start(ox, g.width, g.out_w);
          const int64_t x1 = adaptive_end(ox, g.width, g.out_w);
          double total = 0;
          for (int64_t y = y0; y < y1; ++y)
            for (int64_t x = x0; x < x1; ++x) total += double(plane[y * g.width + x]);
          out_plane[oy * g.out_w + ox] = T(total / double((y1 - y0) * (x1 - x0)));
        }
      }
    }
  });
}

template <typename T>
void adaptive_backward(const Pool2dGeometry& g, const T* grad_out, T* grad_in) {
  parallel_for(0, g.planes, plane_grain(g), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      T* plane = grad_in + p * g.height * g.width;
      std::fill(plane, plane + g.height * g.width, T(0));
      const T* go = grad_out + p * g.out_h * g.out_w;
      for (int64_t oy = 0; oy < g.out_h; ++oy) {
        const int64_t y0 = adaptive_start(oy, g.height, g.out_h);
        const int64_t y1 = adaptive_end(oy, g.height, g.out_h);
        for (int64_t ox = 0; ox < g.out_w; ++ox) {
          const int64_t x0 = adaptive_start(ox, g.width, g.out_w);
          const int64_t x1 = adaptive_end(ox, g.width, g.out_w);
          const T share = T(double(go[oy * g.out_w + ox]) / double((y1 - y0) * (x1 - x0)));
          for (int64_t y = y0; y < y1; ++y)
            for (int64_t x = x0; x < x1; ++x) plane[y * g.width + x] += share;
        }
      }
    }
  });
}

}  // namespace

#define MPIGRAD_POOL_DISPATCH(kernel, call_float, call_double) \
  switch (dtype) {                                             \
    case DType::Float32:                                       \
      return call_float;                                       \
    case DType::Float64:                                       \
      return call_double;                                      \
    default:                                                   \
      throw_unsupported(kernel, "", dtype);                    \
  }

DType max_pool2d_tap_dtype(const Pool2dGeometry& g) {
  const int64_t taps = g.kernel_h * g.kernel_w;
  if (taps <= 256) return DType::UInt8;
  return taps <= std::numeric_limits<int32_t>::max() ? DType::Int32 : DType::Int64;
}

void max_pool2d_forward(DType dtype, const Pool2dGeometry& g, const void* in, void* out,
                        void* taps) {
  MPIGRAD_POOL_DISPATCH(
      "max_pool2d_forward",
      max_forward_any(g, static_cast<const float*>(in), static_cast<float*>(out), taps),
      max_forward_any(g, static_cast<const double*>(in), static_cast<double*>(out), taps))
}

void max_pool2d_backward(DType dtype, const Pool2dGeometry& g, const void* grad_out,
                         const void* taps, void* grad_in) {
  MPIGRAD_POOL_DISPATCH(
      "max_pool2d_backward",
      max_backward_any(g, static_cast<const float*>(grad_out), taps, static_cast<float*>(grad_in)),
      max_backward_any(g, static_cast<const double*>(grad_out), taps,
                       static_cast<double*>(grad_in)))
}

void max_pool2d_flat_indices(const Pool2dGeometry& g, const void* taps, int64_t* flat) {
  with_tap_type(g, [&](auto tag) {
    using Tap = decltype(tag);
    const Tap* tap = static_cast<const Tap*>(taps);
    for (int64_t p = 0; p < g.planes; ++p) {
      for (int64_t oy = 0; oy < g.out_h; ++oy) {
        for (int64_t ox = 0; ox < g.out_w; ++ox, ++tap, ++flat) *flat = flat_of(g, oy, ox, *tap);
      }
    }
  });
}

void avg_pool2d_forward(DType dtype, const Pool2dGeometry& g, bool count_include_pad,
                        const void* in, void* out) {
  MPIGRAD_POOL_DISPATCH(
      "avg_pool2d_forward",
      avg_forward(g, count_include_pad, static_cast<const float*>(in), static_cast<float*>(out)),
      avg_forward(g, count_include_pad, static_cast<const double*>(in), static_cast<double*>(out)))
}

void avg_pool2d_backward(DType dtype, const Pool2dGeometry& g, bool count_include_pad,
                         const void* grad_out, void* grad_in) {
  MPIGRAD_POOL_DISPATCH("avg_pool2d_backward",
                        avg_backward(g, count_include_pad, static_cast<const float*>(grad_out),
                                     static_cast<float*>(grad_in)),
                        avg_backward(g, count_include_pad, static_cast<const double*>(grad_out),
                                     static_cast<double*>(grad_in)))
}

void adaptive_avg_pool2d_forward(DType dtype, const Pool2dGeometry& g, const void* in, void* out) {
  MPIGRAD_POOL_DISPATCH(
      "adaptive_avg_pool2d_forward",
      adaptive_forward(g, static_cast<const float*>(in), static_cast<float*>(out)),
      adaptive_forward(g, static_cast<const double*>(in), static_cast<double*>(out)))
}

void adaptive_avg_pool2d_backward(DType dtype, const Pool2dGeometry& g, const void* grad_out,
                                  void* grad_in) {
  MPIGRAD_POOL_DISPATCH(
      "adaptive_avg_pool2d_backward",
      adaptive_backward(g, static_cast<const float*>(grad_out), static_cast<float*>(grad_in)),
      adaptive_backward(g, static_cast<const double*>(grad_out), static_cast<double*>(grad_in)))
}

#undef MPIGRAD_POOL_DISPATCH

#if defined(MPIGRAD_HAS_AVX2_MATH)
void max_pool_2x2_forward_plane(const Pool2dGeometry& plane, const float* in, float* out,
                                uint8_t* taps) {
  avx2::max_2x2_forward_planes(plane, in, out, taps, 0, 1);
}

void max_pool_2x2_backward_plane(const Pool2dGeometry& plane, const float* grad_out,
                                 const uint8_t* taps, float* grad_in) {
  avx2::max_2x2_backward_planes(plane, grad_out, taps, grad_in, 0, 1);
}
#endif

}  // namespace mpigrad::kernels::cpu
