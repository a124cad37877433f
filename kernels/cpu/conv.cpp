// CPU im2col / col2im for convolution as GEMM, and the direct depthwise convolution.
//
// Layout: one image [channels, height, width], columns [channels*kh*kw, out_h*out_w], both dense.
// Threading: im2col splits the column rows over threads (each row is written by one thread);
// col2im splits the channels (each channel's pixels are only touched by its own rows), so no two
// threads ever add into the same pixel and the result does not depend on the thread count.
// The depthwise kernels split output planes (forward), input planes (data gradient) or output
// channels (filter gradient) the same way: each value is summed by one thread, in one order.
#include "mpigrad/kernels/conv.h"

#include <algorithm>
#include <string>
#include <vector>

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

// Along one axis: kernel tap k of a convolution over `extent` input positions with `out_extent`
// outputs.
ColumnSpan tap_span(int64_t k, int64_t dilation, int64_t pad, int64_t stride, int64_t extent,
                    int64_t out_extent) {
  ColumnSpan span;
  span.x0 = k * dilation - pad;
  span.lo = span.x0 < 0 ? std::min(out_extent, (-span.x0 + stride - 1) / stride) : 0;
  const int64_t inside = span.x0 >= extent ? 0 : (extent - span.x0 + stride - 1) / stride;
  span.hi = std::max(span.lo, std::min(out_extent, inside));
  return span;
}

ColumnSpan column_span(const Conv2dGeometry& g, int64_t kj) {
  return tap_span(kj, g.dilation_w, g.pad_w, g.stride_w, g.width, g.out_w);
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

// ---- Direct depthwise convolution ---------------------------------------------------------------
// Output channel o reads input channel o / multiplier only, so each kernel tap (i, j) is a scaled
// shifted copy of a plane: the loops visit only the taps and pixels that fall inside the image,
// which on the small late-stage images of a CNN (a 7x7 kernel on 2x2 or 1x1) is a few percent of
// what im2col and a GEMM multiply by the padding's zeros.

// The output rows [lo, hi) of kernel row ki that read inside the image.
ColumnSpan row_span(const Conv2dGeometry& g, int64_t ki) {
  return tap_span(ki, g.dilation_h, g.pad_h, g.stride_h, g.height, g.out_h);
}

// The spans of every kernel row and column, worked out once per call, and the rows and columns
// that reach inside the image at all: the only taps the loops visit.
struct TapSpans {
  std::vector<ColumnSpan> rows, columns;
  std::vector<int64_t> valid_rows, valid_columns;
  explicit TapSpans(const Conv2dGeometry& g) {
    for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
      rows.push_back(row_span(g, ki));
      if (rows.back().hi > rows.back().lo) valid_rows.push_back(ki);
    }
    for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
      columns.push_back(column_span(g, kj));
      if (columns.back().hi > columns.back().lo) valid_columns.push_back(kj);
    }
  }
};

// Calls visit(tap, rows, columns) for each tap (index ki * kernel_w + kj) that touches the
// image somewhere, with its output rows and columns.
template <typename Visit>
void for_each_valid_tap(const Conv2dGeometry& g, const TapSpans& spans, Visit visit) {
  for (int64_t ki : spans.valid_rows) {
    for (int64_t kj : spans.valid_columns) {
      visit(ki * g.kernel_w + kj, spans.rows[size_t(ki)], spans.columns[size_t(kj)]);
    }
  }
}

// Calls visit(image_offset, out_offset) for each output row of one tap: the offsets of the
// row's first image element (stride_w apart after it) and first output element.
template <typename Visit>
void for_each_tap_row(const Conv2dGeometry& g, ColumnSpan rows, ColumnSpan columns, Visit visit) {
  for (int64_t oy = rows.lo; oy < rows.hi; ++oy) {
    visit((oy * g.stride_h + rows.x0) * g.width + columns.x0, oy * g.out_w);
  }
}

// dst[i * dst_stride] += tap * src[i * src_stride] for i in [lo, hi).
template <typename T>
void add_scaled_row(T* dst, int64_t dst_stride, const T* src, int64_t src_stride, T tap, int64_t lo,
                    int64_t hi) {
  if (dst_stride == 1 && src_stride == 1) {
    for (int64_t i = lo; i < hi; ++i) dst[i] += tap * src[i];
  } else {
    for (int64_t i = lo; i < hi; ++i) dst[i * dst_stride] += tap * src[i * src_stride];
  }
}

// `bias` (null: none) is added to each plane once its taps are summed, while it is in cache.
template <typename T>
void depthwise_forward_typed(const Conv2dShape& s, const T* x, const T* w, const T* bias, T* y) {
  const Conv2dGeometry& g = s.geometry;
  const TapSpans spans(g);
  const int64_t multiplier = s.out_channels / s.groups;
  const int64_t in_plane = g.height * g.width, out_plane = g.out_h * g.out_w;
  const int64_t planes = s.batch * s.out_channels;
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(out_plane, 1));
  parallel_for(0, planes, grain, [&](int64_t begin, int64_t end) {
    for (int64_t plane = begin; plane < end; ++plane) {
      const int64_t n = plane / s.out_channels, o = plane % s.out_channels;
      const T* image = x + (n * g.channels + o / multiplier) * in_plane;
      const T* taps = w + o * g.kernel_h * g.kernel_w;
      T* out = y + plane * out_plane;
      std::fill(out, out + out_plane, T(0));
      for_each_valid_tap(g, spans, [&](int64_t tap, ColumnSpan rows, ColumnSpan columns) {
        for_each_tap_row(g, rows, columns, [&](int64_t in_at, int64_t out_at) {
          add_scaled_row(out + out_at, 1, image + in_at, g.stride_w, taps[tap], columns.lo,
                         columns.hi);
        });
      });
      if (bias != nullptr) {
        const T shift = bias[o];
        for (int64_t i = 0; i < out_plane; ++i) out[i] += shift;
      }
    }
  });
}

template <typename T>
void depthwise_backward_data_typed(const Conv2dShape& s, const T* grad_y, const T* w, T* grad_x) {
  const Conv2dGeometry& g = s.geometry;
  const TapSpans spans(g);
  const int64_t multiplier = s.out_channels / s.groups;
  const int64_t in_plane = g.height * g.width, out_plane = g.out_h * g.out_w;
  const int64_t planes = s.batch * g.channels;
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(out_plane * multiplier, 1));
  parallel_for(0, planes, grain, [&](int64_t begin, int64_t end) {
    for (int64_t plane = begin; plane < end; ++plane) {
      const int64_t n = plane / g.channels, c = plane % g.channels;
      T* image = grad_x + plane * in_plane;
      std::fill(image, image + in_plane, T(0));
      for (int64_t o = c * multiplier; o < (c + 1) * multiplier; ++o) {
        const T* grad = grad_y + (n * s.out_channels + o) * out_plane;
        const T* taps = w + o * g.kernel_h * g.kernel_w;
        for_each_valid_tap(g, spans, [&](int64_t tap, ColumnSpan rows, ColumnSpan columns) {
          for_each_tap_row(g, rows, columns, [&](int64_t in_at, int64_t out_at) {
            add_scaled_row(image + in_at, g.stride_w, grad + out_at, 1, taps[tap], columns.lo,
                           columns.hi);
          });
        });
      }
    }
  });
}

template <typename T>
void depthwise_backward_filter_typed(const Conv2dShape& s, const T* x, const T* grad_y, T* grad_w) {
  const Conv2dGeometry& g = s.geometry;
  const TapSpans spans(g);
  const int64_t multiplier = s.out_channels / s.groups;
  const int64_t in_plane = g.height * g.width, out_plane = g.out_h * g.out_w;
  const int64_t taps = g.kernel_h * g.kernel_w;
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(s.batch * out_plane, 1));
  parallel_for(0, s.out_channels, grain, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const int64_t c = o / multiplier;
      std::fill(grad_w + o * taps, grad_w + (o + 1) * taps, T(0));  // taps wholly on padding
      for_each_valid_tap(g, spans, [&](int64_t tap, ColumnSpan rows, ColumnSpan columns) {
        const auto [x0, lo, hi] = columns;
        const int64_t stride = g.stride_w;
        T total = 0;
        for (int64_t n = 0; n < s.batch; ++n) {
          const T* image = x + (n * g.channels + c) * in_plane;
          const T* grad = grad_y + (n * s.out_channels + o) * out_plane;
          for_each_tap_row(g, rows, columns, [&](int64_t in_at, int64_t out_at) {
            const T* in_row = image + in_at;
            const T* grad_row = grad + out_at;
            T row_total = 0;
            if (stride == 1) {
#pragma omp simd reduction(+ : row_total)
              for (int64_t ox = lo; ox < hi; ++ox) row_total += grad_row[ox] * in_row[ox];
            } else {
              for (int64_t ox = lo; ox < hi; ++ox) row_total += grad_row[ox] * in_row[ox * stride];
            }
            total += row_total;
          });
        }
        grad_w[o * taps + tap] = total;
      });
    }
  });
}

// Calls run(float()) or run(double()) for dtype; any other dtype is the error naming `kernel`.
template <typename Run>
void run_float_or_double(DType dtype, const char* kernel, Run&& run) {
  switch (dtype) {
    case DType::Float32:
      return run(float());
    case DType::Float64:
      return run(double());
    default:
      throw_unsupported("cpu", kernel, "", dtype);
  }
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

void fill_channel_bias(DType dtype, int64_t batch, int64_t channels, int64_t area, const void* bias,
                       void* y) {
  auto run = [&](auto typed) {
    using T = decltype(typed);
    const T* shift = static_cast<const T*>(bias);
    T* out = static_cast<T*>(y);
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(area, 1));
    parallel_for(0, batch * channels, grain, [&](int64_t begin, int64_t end) {
      for (int64_t plane = begin; plane < end; ++plane) {
        const T value = shift[plane % channels];
        T* row = out + plane * area;
        std::fill(row, row + area, value);
      }
    });
  };
  run_float_or_double(dtype, "fill_channel_bias", run);
}

bool is_depthwise(const Conv2dShape& shape) {
  return shape.groups > 1 && shape.groups == shape.geometry.channels;
}

void depthwise_conv2d(ConvPass pass, DType dtype, const Conv2dShape& shape, const void* first,
                      const void* second, void* out, const void* bias) {
  if (!is_depthwise(shape)) {
    throw_invalid("depthwise_conv2d",
                  "groups " + std::to_string(shape.groups) + " differ from the " +
                      std::to_string(shape.geometry.channels) + " input channels");
  }
  auto run = [&](auto typed) {
    using T = decltype(typed);
    const T* a = static_cast<const T*>(first);
    const T* b = static_cast<const T*>(second);
    T* result = static_cast<T*>(out);
    switch (pass) {
      case ConvPass::Forward:
        return depthwise_forward_typed(shape, a, b, static_cast<const T*>(bias), result);
      case ConvPass::BackwardData:
        return depthwise_backward_data_typed(shape, a, b, result);
      case ConvPass::BackwardFilter:
        return depthwise_backward_filter_typed(shape, a, b, result);
    }
  };
  run_float_or_double(dtype, "depthwise_conv2d", run);
}

bool has_direct_conv2d(ConvPass pass, DType dtype, const Conv2dShape& shape) {
  if (is_depthwise(shape)) return dtype == DType::Float32 || dtype == DType::Float64;
  return has_small_channel_conv2d(pass, dtype, shape);
}

bool direct_conv2d(ConvPass pass, DType dtype, const Conv2dShape& shape, const void* first,
                   const void* second, void* out, const void* bias, void* grad_bias) {
  if (is_depthwise(shape)) {
    depthwise_conv2d(pass, dtype, shape, first, second, out, bias);
    return false;
  }
  small_channel_conv2d(pass, dtype, shape, first, second, out, bias, grad_bias);
  return grad_bias != nullptr && pass == ConvPass::BackwardFilter;
}

}  // namespace mpigrad::kernels::cpu
