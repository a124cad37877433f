// CPU 2-d pooling: max (with argmax indices), average, adaptive average.
//
// Layout: dense [planes, height, width] in, [planes, out_h, out_w] out.
// Threading: planes are spread over threads; a plane's outputs and its input gradient belong to
// one thread, so backward's scatter needs no atomics and results do not depend on thread count.
#include "mpigrad/kernels/pooling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

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

// Whether the Float32 2x2 routines of namespace avx2 run: this CPU has AVX2 and a plane's flat
// indices fit in 32 bits.
template <typename T>
bool use_avx2_2x2(const Pool2dGeometry& g) {
#if defined(MPIGRAD_HAS_AVX2_MATH)
  return std::is_same_v<T, float> && is_2x2(g) && g.height * g.width < (int64_t(1) << 31) - 2 &&
         has_avx2_fma();
#else
  (void)g;
  return false;
#endif
}

#if defined(MPIGRAD_HAS_AVX2_MATH)
// Float32 2x2 windows, 8 outputs at a time (AVX2), with exactly the rules of max_forward_2x2 below:
// the four candidates of a window are taken in the order (0,0) (0,1) (1,0) (1,1), a later one
// replacing the best only when strictly greater, then every NaN replaces it in that same order.
// Indices are formed in 32 bits (the caller checks that a plane's do fit) and widened to int64.
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

// Outputs [0, count) of one output row: row0 and row1 are the window's two input rows from its
// first column, `first` the plane index of row0[0]. out and indices have room for `room` >= count
// elements, and those past the row are written again after it by the caller: a tail's stores are
// then whole vectors where they fit in the room, not the slower partial ones.
MPIGRAD_AVX2 void max_2x2_row(const float* row0, const float* row1, int64_t count, int32_t first,
                              int32_t width, int64_t room, float* out, int64_t* indices) {
  const __m256i step = _mm256_setr_epi32(0, 2, 8, 10, 4, 6, 12, 14);  // shuffled, as the data
  const __m256 at_b = _mm256_castsi256_ps(_mm256_set1_epi32(1));
  const __m256 at_c = _mm256_castsi256_ps(_mm256_set1_epi32(width));
  const __m256 at_d = _mm256_castsi256_ps(_mm256_set1_epi32(width + 1));
  for (int64_t ox = 0; ox < count; ox += 8) {
    const int64_t n = std::min<int64_t>(count - ox, 8);
    __m256 a, b, c, d;
    load_pairs(row0 + 2 * ox, n, a, b);
    load_pairs(row1 + 2 * ox, n, c, d);
    __m256 best = a, offset = _mm256_setzero_ps();
    __m256 take = _mm256_cmp_ps(b, best, _CMP_GT_OQ);
    best = _mm256_blendv_ps(best, b, take);
    offset = _mm256_blendv_ps(offset, at_b, take);
    take = _mm256_cmp_ps(c, best, _CMP_GT_OQ);
    best = _mm256_blendv_ps(best, c, take);
    offset = _mm256_blendv_ps(offset, at_c, take);
    take = _mm256_cmp_ps(d, best, _CMP_GT_OQ);
    best = _mm256_blendv_ps(best, d, take);
    offset = _mm256_blendv_ps(offset, at_d, take);
    const __m256 any_nan =
        _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_UNORD_Q), _mm256_cmp_ps(c, d, _CMP_UNORD_Q));
    if (_mm256_movemask_ps(any_nan) != 0) [[unlikely]] {
      // PyTorch's rule: a NaN wins, and a later NaN replaces an earlier one.
      const __m256 candidates[4] = {a, b, c, d};
      const __m256 offsets[4] = {_mm256_setzero_ps(), at_b, at_c, at_d};
      for (int k = 0; k < 4; ++k) {
        const __m256 nan = _mm256_cmp_ps(candidates[k], candidates[k], _CMP_UNORD_Q);
        best = _mm256_blendv_ps(best, candidates[k], nan);
        offset = _mm256_blendv_ps(offset, offsets[k], nan);
      }
    }
    const __m256i index =
        _mm256_add_epi32(_mm256_castps_si256(offset),
                         _mm256_add_epi32(step, _mm256_set1_epi32(first + 2 * int32_t(ox))));
    const __m256i ordered = _mm256_permute4x64_epi64(index, 0xD8);
    const __m256i low = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(ordered));
    const __m256i high = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(ordered, 1));
    if (ox + 8 <= room) {
      _mm256_storeu_ps(out + ox, unshuffle(best));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(indices + ox), low);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(indices + ox + 4), high);
    } else {
      // Through the stack: masked stores (vmaskmov) take tens of cycles on some CPUs, and
      // out_w = 7 (a 14-wide input) is all tail.
      alignas(32) int64_t lanes[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), low);
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes + 4), high);
      vector_math::store_tail(out + ox, n, unshuffle(best));
      for (int64_t k = 0; k < n; ++k) indices[ox + k] = lanes[k];
    }
  }
}

}  // namespace avx2
#endif

// The common 2x2 window, stride 2, no padding or dilation, with the same rules as the general
// loop below (the first of equal maxima wins; NaN windows go through the general rule). Four
// loads and three masked selects per output, no branch on the data.
template <typename T>
bool max_forward_2x2(const Pool2dGeometry& g, const T* in, T* out, int64_t* indices) {
  if (!is_2x2(g)) return false;
  const int64_t width = g.width, out_h = g.out_h, out_w = g.out_w;
#if defined(MPIGRAD_HAS_AVX2_MATH)
  if constexpr (std::is_same_v<T, float>) {
    if (use_avx2_2x2<T>(g)) {
      parallel_for(0, g.planes, plane_grain(g),
                   [&, width, out_h, out_w](int64_t begin, int64_t end) {
                     for (int64_t p = begin; p < end; ++p) {
                       const float* plane = in + p * g.height * width;
                       for (int64_t oy = 0; oy < out_h; ++oy) {
                         const int64_t row = (p * out_h + oy) * out_w;
                         // A tail may run into the rows that follow in this chunk, which are
                         // written after it; not past the chunk (another thread's, or the end).
                         const int64_t room = end * out_h * out_w - row;
                         avx2::max_2x2_row(plane + 2 * oy * width, plane + (2 * oy + 1) * width,
                                           out_w, int32_t(2 * oy * width), int32_t(width), room,
                                           out + row, indices + row);
                       }
                     }
                   });
      return true;
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
        int64_t* index_row = indices + (p * out_h + oy) * out_w;
        for (int64_t ox = 0; ox < out_w; ++ox) {
          const T a = row0[2 * ox], b = row0[2 * ox + 1], c = row1[2 * ox], d = row1[2 * ox + 1];
          const int64_t first = 2 * oy * width + 2 * ox;
          T best = a;
          int64_t index = first;
          int64_t take = -int64_t(b > best);
          index = (index & ~take) | ((first + 1) & take);
          best = best >= b ? best : b;
          take = -int64_t(c > best);
          index = (index & ~take) | ((first + width) & take);
          best = best >= c ? best : c;
          take = -int64_t(d > best);
          index = (index & ~take) | ((first + width + 1) & take);
          best = best >= d ? best : d;
          if ((a != a) | (b != b) | (c != c) | (d != d)) [[unlikely]] {
            // PyTorch's rule: a NaN wins, and a later NaN replaces an earlier one.
            const T window[4] = {a, b, c, d};
            const int64_t offsets[4] = {0, 1, width, width + 1};
            for (int k = 0; k < 4; ++k) {
              if (std::isnan(window[k])) {
                best = window[k];
                index = first + offsets[k];
              }
            }
          }
          out_row[ox] = best;
          index_row[ox] = index;
        }
      }
    }
  });
  return true;
}

template <typename T>
void max_forward(const Pool2dGeometry& geometry, const T* in, T* out, int64_t* indices) {
  if (max_forward_2x2(geometry, in, out, indices)) return;
  // The lambda takes the geometry by value: through a reference every field would be reloaded
  // after each int64 index store, which might alias it.
  parallel_for(0, geometry.planes, plane_grain(geometry),
               [g = geometry, in, out, indices](int64_t begin, int64_t end) {
                 for (int64_t p = begin; p < end; ++p) {
                   const T* plane = in + p * g.height * g.width;
                   T* out_plane = out + p * g.out_h * g.out_w;
                   int64_t* index_plane = indices + p * g.out_h * g.out_w;
                   for (int64_t oy = 0; oy < g.out_h; ++oy) {
                     for (int64_t ox = 0; ox < g.out_w; ++ox) {
                       // No data-dependent branch: on real activations it mispredicts about half
                       // the time, which made this loop a quarter of a CNN step. (m > v ? m : v) is
                       // one maxss, and NaNs are handled after the window, in the rare window that
                       // has one.
                       T best = -std::numeric_limits<T>::infinity();
                       int64_t best_index = -1;
                       bool nan = false;
                       for (int64_t i = 0; i < g.kernel_h; ++i) {
                         const int64_t y = oy * g.stride_h - g.pad_h + i * g.dilation_h;
                         if (y < 0 || y >= g.height)
                           continue;  // padding: predictable, rarely taken
                         for (int64_t j = 0; j < g.kernel_w; ++j) {
                           const int64_t x = ox * g.stride_w - g.pad_w + j * g.dilation_w;
                           if (x < 0 || x >= g.width) continue;
                           const T v = plane[y * g.width + x];
                           // Masks rather than ?: for the index: GCC turns that select into a
                           // branch.
                           const int64_t take = -int64_t((v > best) | (best_index < 0));
                           best_index = (best_index & ~take) | ((y * g.width + x) & take);
                           best = best > v ? best : v;
                           nan |= v != v;
                         }
                       }
                       if (nan) {
                         // PyTorch's rule: a NaN wins, and a later NaN replaces an earlier one.
                         for (int64_t i = 0; i < g.kernel_h; ++i) {
                           const int64_t y = oy * g.stride_h - g.pad_h + i * g.dilation_h;
                           for (int64_t j = 0; y >= 0 && y < g.height && j < g.kernel_w; ++j) {
                             const int64_t x = ox * g.stride_w - g.pad_w + j * g.dilation_w;
                             if (x >= 0 && x < g.width && std::isnan(plane[y * g.width + x])) {
                               best = plane[y * g.width + x];
                               best_index = y * g.width + x;
                             }
                           }
                         }
                       }
                       out_plane[oy * g.out_w + ox] = best;
                       index_plane[oy * g.out_w + ox] = best_index < 0 ? 0 : best_index;
                     }
                   }
                 }
               });
}

template <typename T>
void max_backward(const Pool2dGeometry& g, const T* grad_out, const int64_t* indices, T* grad_in) {
  parallel_for(0, g.planes, plane_grain(g), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      T* plane = grad_in + p * g.height * g.width;
      std::fill(plane, plane + g.height * g.width, T(0));
      const T* go = grad_out + p * g.out_h * g.out_w;
      const int64_t* idx = indices + p * g.out_h * g.out_w;
      for (int64_t o = 0; o < g.out_h * g.out_w; ++o) plane[idx[o]] += go[o];
    }
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

void max_pool2d_forward(DType dtype, const Pool2dGeometry& g, const void* in, void* out,
                        int64_t* indices) {
  MPIGRAD_POOL_DISPATCH(
      "max_pool2d_forward",
      max_forward(g, static_cast<const float*>(in), static_cast<float*>(out), indices),
      max_forward(g, static_cast<const double*>(in), static_cast<double*>(out), indices))
}

void max_pool2d_backward(DType dtype, const Pool2dGeometry& g, const void* grad_out,
                         const int64_t* indices, void* grad_in) {
  MPIGRAD_POOL_DISPATCH(
      "max_pool2d_backward",
      max_backward(g, static_cast<const float*>(grad_out), indices, static_cast<float*>(grad_in)),
      max_backward(g, static_cast<const double*>(grad_out), indices, static_cast<double*>(grad_in)))
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

}  // namespace mpigrad::kernels::cpu
