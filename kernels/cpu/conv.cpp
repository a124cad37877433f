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
      for (int64_t oy = 0; oy < g.out_h; ++oy) {
        const int64_t y = oy * g.stride_h - g.pad_h + ki * g.dilation_h;
        T* out_row = out + oy * g.out_w;
        if (y < 0 || y >= g.height) {
          for (int64_t ox = 0; ox < g.out_w; ++ox) out_row[ox] = T(0);
          continue;
        }
        const T* in_row = plane + y * g.width;
        // Output columns [lo, hi) read inside the row, the rest are padding: the inner copy has
        // no bounds check (with padding, two of a 3x3 kernel's three columns need one).
        const int64_t x0 = kj * g.dilation_w - g.pad_w, stride = g.stride_w;
        const int64_t lo = x0 < 0 ? std::min(g.out_w, (-x0 + stride - 1) / stride) : 0;
        const int64_t inside = x0 >= g.width ? 0 : (g.width - x0 + stride - 1) / stride;
        const int64_t hi = std::max(lo, std::min(g.out_w, inside));
        for (int64_t ox = 0; ox < lo; ++ox) out_row[ox] = T(0);
        if (stride == 1) {
          for (int64_t ox = lo; ox < hi; ++ox) out_row[ox] = in_row[x0 + ox];
        } else {
          for (int64_t ox = lo; ox < hi; ++ox) out_row[ox] = in_row[x0 + ox * stride];
        }
        for (int64_t ox = hi; ox < g.out_w; ++ox) out_row[ox] = T(0);
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
        for (int64_t oy = 0; oy < g.out_h; ++oy) {
          const int64_t y = oy * g.stride_h - g.pad_h + ki * g.dilation_h;
          if (y < 0 || y >= g.height) continue;
          T* image_row = plane + y * g.width;
          const T* in_row = in + oy * g.out_w;
          const int64_t x0 = kj * g.dilation_w - g.pad_w;
          for (int64_t ox = 0; ox < g.out_w; ++ox) {
            const int64_t x = x0 + ox * g.stride_w;
            if (x >= 0 && x < g.width) image_row[x] += in_row[ox];
          }
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
    default: throw_unsupported("im2col", "", dtype);
  }
}

void col2im(DType dtype, const Conv2dGeometry& geometry, const void* columns, void* image) {
  switch (dtype) {
    case DType::Float32:
      return col2im_typed(geometry, static_cast<const float*>(columns), static_cast<float*>(image));
    case DType::Float64:
      return col2im_typed(geometry, static_cast<const double*>(columns),
                          static_cast<double*>(image));
    default: throw_unsupported("col2im", "", dtype);
  }
}

}  // namespace mpigrad::kernels::cpu
