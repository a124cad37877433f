// CPU 2-d pooling: max (with argmax indices), average, adaptive average.
//
// Layout: dense [planes, height, width] in, [planes, out_h, out_w] out.
// Threading: planes are spread over threads; a plane's outputs and its input gradient belong to
// one thread, so backward's scatter needs no atomics and results do not depend on thread count.
#include "mpigrad/kernels/pooling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "mpigrad/kernels/cpu/parallel.h"
#include "mpigrad/kernels/cpu/scalar.h"

namespace mpigrad::kernels::cpu {
namespace {

int64_t plane_grain(const Pool2dGeometry& g) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, g.height * g.width));
}

// The common 2x2 window, stride 2, no padding or dilation, with the same rules as the general
// loop below (the first of equal maxima wins; NaN windows go through the general rule). Four
// loads and three masked selects per output, no branch on the data.
template <typename T>
bool max_forward_2x2(const Pool2dGeometry& g, const T* in, T* out, int64_t* indices) {
  if (g.kernel_h != 2 || g.kernel_w != 2 || g.stride_h != 2 || g.stride_w != 2 || g.pad_h != 0 ||
      g.pad_w != 0 || g.dilation_h != 1 || g.dilation_w != 1) {
    return false;
  }
  const int64_t width = g.width, out_h = g.out_h, out_w = g.out_w;
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
