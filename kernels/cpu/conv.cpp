// CPU im2col / col2im for convolution as GEMM.
//
// Layout: one image [channels, height, width], columns [channels*kh*kw, out_h*out_w], both dense.
// Threading: im2col splits the column rows over threads (each row is written by one thread);
// col2im splits the channels (each channel's pixels are only touched by its own rows), so no two
// threads ever add into the same pixel and the result does not depend on the thread count.
#include "mpigrad/kernels/conv.h"

#include "mpigrad/kernels/cpu/parallel.h"
#include "mpigrad/kernels/cpu/scalar.h"

namespace mpigrad::kernels::cpu {
namespace {

// Column rows are cheap to fill (a copy), so only thread when there is real work per chunk.
constexpr int64_t kRowGrain = 8;

// The output columns [lo, hi) of kernel column kj that read inside an input row, starting at
// input column x0 + lo * stride; the rest fall on padding. The same for every output row, so it
// is worked out once per kernel column and the copies need no per-element bounds check.
struct ColumnSpan {
  int64_t x0 = 0, lo = 0, hi = 0;
};

ColumnSpan column_span(const Conv2dGeometry& g, int64_t kj) {
  ColumnSpan span;
  const int64_t stride = g.stride_w;
  span.x0 = kj * g.dilation_w - g.pad_w;
  span.lo = span.x0 < 0 ? std::min(g.out_w, (-span.x0 + stride - 1) / stride) : 0;
  const int64_t inside = span.x0 >= g.width ? 0 : (g.width - span.x0 + stride - 1) / stride;
  span.hi = std::max(span.lo, std::min(g.out_w, inside));
  return span;
}

template <typename T>
void im2col_typed(const Conv2dGeometry& g, const T* image, T* columns) {
  const int64_t kernel_area = g.kernel_h * g.kernel_w;
  const int64_t out_area = g.out_h * g.out_w;
  const int64_t rows = g.channels * kernel_area;
  const int64_t grain = std::max<int64_t>(1, kRowGrain * 4096 / std::max<int64_t>(out_area, 1));
  parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t c = row / kernel_area;
      const int64_t ki = (row % kernel_area) / g.kernel_w;
      const int64_t kj = row % g.kernel_w;
      const T* plane = image + c * g.height * g.width;
      T* out = columns + row * out_area;
      const auto [x0, lo, hi] = column_span(g, kj);
      const int64_t stride = g.stride_w, out_w = g.out_w;
      for (int64_t oy = 0; oy < g.out_h; ++oy) {
        const int64_t y = oy * g.stride_h - g.pad_h + ki * g.dilation_h;
        T* out_row = out + oy * out_w;
        if (y < 0 || y >= g.height) {
          std::fill(out_row, out_row + out_w, T(0));
          continue;
        }
        const T* in_row = plane + y * g.width;  // output column ox reads x0 + ox * stride
        std::fill(out_row, out_row + lo, T(0));
        if (stride == 1) {
          std::copy(in_row + x0 + lo, in_row + x0 + hi, out_row + lo);
        } else {
          for (int64_t ox = lo; ox < hi; ++ox) out_row[ox] = in_row[x0 + ox * stride];
        }
        std::fill(out_row + hi, out_row + out_w, T(0));
      }
    }
  });
}

template <typename T>
void col2im_typed(const Conv2dGeometry& g, const T* columns, T* image) {
  const int64_t kernel_area = g.kernel_h * g.kernel_w;
  const int64_t out_area = g.out_h * g.out_w;
  parallel_for(0, g.channels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      T* plane = image + c * g.height * g.width;
      for (int64_t k = 0; k < kernel_area; ++k) {
        const int64_t ki = k / g.kernel_w, kj = k % g.kernel_w;
        const T* in = columns + (c * kernel_area + k) * out_area;
        const auto [x0, lo, hi] = column_span(g, kj);
        const int64_t stride = g.stride_w;
        for (int64_t oy = 0; oy < g.out_h; ++oy) {
          const int64_t y = oy * g.stride_h - g.pad_h + ki * g.dilation_h;
          if (y < 0 || y >= g.height) continue;
          T* image_row = plane + y * g.width;
          const T* in_row = in + oy * g.out_w;
          for (int64_t ox = lo; ox < hi; ++ox) image_row[x0 + ox * stride] += in_row[ox];
        }
      }
    }
  });
}

}  // namespace

void im2col(DType dtype, const Conv2dGeometry& geometry, const void* image, void* columns) {
  switch (dtype) {
    case DType::Float32:
      return im2col_typed(geometry, static_cast<const float*>(image), static_cast<float*>(columns));
    case DType::Float64:
      return im2col_typed(geometry, static_cast<const double*>(image),
                          static_cast<double*>(columns));
    case DType::BFloat16:  // mixed precision's columns (core/autocast.h)
      return im2col_typed(geometry, static_cast<const BFloat16*>(image),
                          static_cast<BFloat16*>(columns));
    case DType::Float16:
      return im2col_typed(geometry, static_cast<const Half*>(image), static_cast<Half*>(columns));
    default:
      throw_unsupported("im2col", "", dtype);
  }
}

void col2im(DType dtype, const Conv2dGeometry& geometry, const void* columns, void* image) {
  switch (dtype) {
    case DType::Float32:
      return col2im_typed(geometry, static_cast<const float*>(columns), static_cast<float*>(image));
    case DType::Float64:
      return col2im_typed(geometry, static_cast<const double*>(columns),
                          static_cast<double*>(image));
    default:
      throw_unsupported("col2im", "", dtype);
  }
}

}  // namespace mpigrad::kernels::cpu
