// Direct CPU convolution of image stems: groups 1 and 1 to 4 input channels (grayscale and RGB),
// forward and filter gradient, float32, on NCHW as it is (kernels/conv.h).
//
// With so few input channels each output value sums only channels * kh * kw products: im2col
// copies every pixel kh * kw times to feed a GEMM whose inner dimension is 9 to 27, and oneDNN's
// direct kernel writes its blocked layout, which then has to be reordered back to NCHW (a second
// pass over the whole output, and one more OpenMP region). Here the input rows a band of output
// rows reads are first unrolled into a small per-thread buffer, one contiguous run per kernel
// column (stride and padding resolved: input column ox * stride + kj * dilation - pad lands in
// "phase" (kj * dilation) % stride at ox + (kj * dilation) / stride, zeros where it falls on
// padding), so every tap is an unaligned load of 8 output columns with no bounds checks.
//  * Forward: 4 output channels x up to 3 vectors of 8 output columns in registers, a weight
//    vector (broadcast once per call) loaded once per tap for all of them, and the bias added
//    to the sums on their way out. Threads split the batch's output rows; each output value is
//    written with `=` by one thread.
//  * Filter gradient: 2 output channels x up to 5 taps in registers, summed over an image's
//    rows and columns, then added to 8-lane sums per (channel, tap) and summed across the
//    lanes in a fixed order. Threads split the output channels, so the result does not depend
//    on the thread count. Where asked, the bias's gradient is summed the same way (8 lanes per
//    channel, then across them), from each gradient plane right after the taps have read it.
// AVX2 + FMA, chosen at run time (kernels/cpu/vector_math.h); without it the stems take the other
// paths. (AVX-512 was left out: on this Zen 4 it runs 512-bit FMAs at half rate, the same FLOPs.)
// The data gradient of a stem is rarely needed (its input is the data) and stays on GEMM.
#include <algorithm>
#include <string>
#include <vector>

#include "mpigrad/kernels/conv.h"
#include "mpigrad/kernels/cpu/parallel.h"
#include "mpigrad/kernels/cpu/scalar.h"
#include "mpigrad/kernels/cpu/vector_math.h"

namespace mpigrad::kernels::cpu {

bool is_small_channel(const Conv2dShape& shape) {
  return shape.groups == 1 && shape.geometry.channels >= 1 &&
         shape.geometry.channels <= kSmallChannels;
}

#if defined(MPIGRAD_HAS_AVX2_MATH)
namespace {

constexpr int64_t kLanes = 8;        // output columns per vector
constexpr int64_t kBlock = 4;        // output channels per forward register block
constexpr int64_t kFilterBlock = 2;  // output channels per filter-gradient register block
constexpr int64_t kTapBlock = 5;     // taps per filter-gradient register block

// The unrolled input of a band of padded rows: for each (channel, padded row) a group of
// `phases` runs of `length` floats; tap kj of a row starts tap_offset[kj] into its group. Padded
// row r is input row r - pad_h (zeros outside the image).
struct Unrolled {
  int64_t phases = 1, length = 0, group = 0;
  std::vector<int64_t> tap_offset;

  explicit Unrolled(const Conv2dGeometry& g) {
    phases = g.stride_w;
    // The last vector of a row reads up to kLanes - 1 columns past out_w: they are zeros or
    // image values, never stored (forward) and multiplied by masked-off zeros (filter).
    length = g.out_w + (g.kernel_w - 1) * g.dilation_w / g.stride_w + kLanes;
    group = phases * length;
    for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
      const int64_t at = kj * g.dilation_w;
      tap_offset.push_back(at % g.stride_w * length + at / g.stride_w);
    }
  }
};

// Unrolls padded rows [first, first + rows) of `image` [channels, height, width] into `out`,
// channel by channel: run p of row r holds padded column p + i * stride_w, zeros on the padding.
void unroll(const Conv2dGeometry& g, const Unrolled& u, const float* image, int64_t first,
            int64_t rows, float* out) {
  for (int64_t c = 0; c < g.channels; ++c) {
    for (int64_t r = 0; r < rows; ++r) {
      float* group = out + (c * rows + r) * u.group;
      const int64_t y = first + r - g.pad_h;
      if (y < 0 || y >= g.height) {
        std::fill(group, group + u.group, 0.0f);
        continue;
      }
      const float* in = image + (c * g.height + y) * g.width;
      for (int64_t p = 0; p < u.phases; ++p) {
        float* run = group + p * u.length;
        // Element i reads input column p + i * stride - pad: inside for i in [lo, hi).
        const int64_t x0 = p - g.pad_w;
        const int64_t lo =
            std::min(u.length, x0 < 0 ? (-x0 + g.stride_w - 1) / g.stride_w : int64_t(0));
        const int64_t inside = x0 >= g.width ? 0 : (g.width - x0 + g.stride_w - 1) / g.stride_w;
        const int64_t hi = std::max(lo, std::min(u.length, inside));
        std::fill(run, run + lo, 0.0f);
        if (g.stride_w == 1) {
          std::copy(in + x0 + lo, in + x0 + hi, run + lo);
        } else {
          for (int64_t i = lo; i < hi; ++i) run[i] = in[x0 + i * g.stride_w];
        }
        std::fill(run + hi, run + u.length, 0.0f);
      }
    }
  }
}

// Where each tap (c, ki, kj), in w's order, starts in an unrolled band of `rows` padded rows,
// for output row 0 of the band; output row oy adds oy * stride_h * group.
std::vector<int64_t> tap_starts(const Conv2dGeometry& g, const Unrolled& u, int64_t rows) {
  std::vector<int64_t> starts;
  for (int64_t c = 0; c < g.channels; ++c) {
    for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
      for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
        starts.push_back((c * rows + ki * g.dilation_h) * u.group + u.tap_offset[size_t(kj)]);
      }
    }
  }
  return starts;
}

// Stores lanes [0, count) of v, count < kLanes, with plain stores: AMD's masked store
// (vmaskmovps) takes several times longer, which shows on rows as short as 28.
MPIGRAD_AVX2 inline void store_first(float* to, __m256 v, int64_t count) {
  __m128 part = _mm256_castps256_ps128(v);
  if (count >= 4) {
    _mm_storeu_ps(to, part);
    part = _mm256_extractf128_ps(v, 1);
    to += 4;
    count -= 4;
  }
  if (count >= 2) {
    _mm_storel_pi(reinterpret_cast<__m64*>(to), part);
    part = _mm_movehl_ps(part, part);
    to += 2;
    count -= 2;
  }
  if (count >= 1) _mm_store_ss(to, part);
}

// w [out, channels, kh, kw] as [block][tap][kBlock][kLanes]: each weight broadcast to a vector,
// out channels past the last zero.
std::vector<float> pack_weights(const Conv2dShape& s, const float* w) {
  const auto& g = s.geometry;
  const int64_t taps = g.channels * g.kernel_h * g.kernel_w;
  const int64_t blocks = (s.out_channels + kBlock - 1) / kBlock;
  std::vector<float> packed(size_t(blocks * taps * kBlock * kLanes), 0.0f);
  for (int64_t o = 0; o < s.out_channels; ++o) {
    for (int64_t t = 0; t < taps; ++t) {
      float* at = packed.data() + ((o / kBlock * taps + t) * kBlock + o % kBlock) * kLanes;
      std::fill(at, at + kLanes, w[o * taps + t]);
    }
  }
  return packed;
}

// The bias [out] as [block][kBlock][kLanes], each value broadcast to a vector; empty for none.
std::vector<float> pack_bias(const Conv2dShape& s, const float* bias) {
  if (bias == nullptr) return {};
  const int64_t blocks = (s.out_channels + kBlock - 1) / kBlock;
  std::vector<float> packed(size_t(blocks * kBlock * kLanes), 0.0f);
  for (int64_t o = 0; o < s.out_channels; ++o) {
    std::fill(packed.begin() + o * kLanes, packed.begin() + (o + 1) * kLanes, bias[o]);
  }
  return packed;
}

// `count` vectors of output columns from column ox of kBlock output channels: the weights of
// each tap are loaded once for all `count` columns' vectors, the input once for all channels.
// `in` is the band at the output row, `out` channel 0 of the block at the row; `shift` the
// block's packed bias, added after the products (null: none).
template <int count>
MPIGRAD_AVX2 void forward_columns(const int64_t* starts, int64_t taps, const float* in,
                                  const float* weights, const float* shift, int64_t channels,
                                  int64_t plane, int64_t ox, int64_t width, float* out) {
  __m256 acc[count][kBlock];
#pragma GCC unroll 4
  for (int a = 0; a < count; ++a) {
#pragma GCC unroll 4
    for (int b = 0; b < kBlock; ++b) acc[a][b] = _mm256_setzero_ps();
  }
  for (int64_t t = 0; t < taps; ++t) {
    const float* at = in + starts[t] + ox;
    __m256 v[count];
#pragma GCC unroll 4
    for (int a = 0; a < count; ++a) v[a] = _mm256_loadu_ps(at + a * kLanes);
#pragma GCC unroll 4
    for (int b = 0; b < kBlock; ++b) {
      __m256 weight = _mm256_loadu_ps(weights + (t * kBlock + b) * kLanes);
      // Keeps the weight in a register for the `count` FMAs: folded into each as a memory
      // operand (what GCC does otherwise) it costs a load per FMA, and loads are this loop's limit.
      asm("" : "+x"(weight));
#pragma GCC unroll 4
      for (int a = 0; a < count; ++a) acc[a][b] = _mm256_fmadd_ps(v[a], weight, acc[a][b]);
    }
  }
  if (shift != nullptr) {
#pragma GCC unroll 4
    for (int b = 0; b < kBlock; ++b) {
      const __m256 bias = _mm256_loadu_ps(shift + b * kLanes);
#pragma GCC unroll 4
      for (int a = 0; a < count; ++a) acc[a][b] = _mm256_add_ps(acc[a][b], bias);
    }
  }
#pragma GCC unroll 4
  for (int b = 0; b < kBlock; ++b) {
    if (b >= channels) break;
#pragma GCC unroll 4
    for (int a = 0; a < count; ++a) {
      float* to = out + b * plane + ox + a * kLanes;
      const int64_t left = width - ox - a * kLanes;
      if (left >= kLanes) {
        _mm256_storeu_ps(to, acc[a][b]);
      } else {
        store_first(to, acc[a][b], left);
      }
    }
  }
}

// Output row oy of one image's output `y` [out, out_h, out_w], from the band `in` unrolled at
// the row's first padded row; `shifts` the packed bias (null: none).
void forward_row(const Conv2dShape& s, const std::vector<int64_t>& starts, const float* in,
                 const float* packed, const float* shifts, float* y, int64_t oy) {
  const auto& g = s.geometry;
  const int64_t taps = int64_t(starts.size());
  const int64_t plane = g.out_h * g.out_w;
  const int64_t vectors = (g.out_w + kLanes - 1) / kLanes;
  for (int64_t block = 0; block * kBlock < s.out_channels; ++block) {
    const int64_t channels = std::min(kBlock, s.out_channels - block * kBlock);
    const float* weights = packed + block * taps * kBlock * kLanes;
    const float* shift = shifts == nullptr ? nullptr : shifts + block * kBlock * kLanes;
    float* out = y + block * kBlock * plane + oy * g.out_w;
    // Three vectors at a time (4 + 4 rather than 3 + 1 where 4 are left).
    int64_t v = 0;
    for (; vectors - v >= 3 && vectors - v != 4; v += 3) {
      forward_columns<3>(starts.data(), taps, in, weights, shift, channels, plane, v * kLanes,
                         g.out_w, out);
    }
    for (; vectors - v >= 2; v += 2) {
      forward_columns<2>(starts.data(), taps, in, weights, shift, channels, plane, v * kLanes,
                         g.out_w, out);
    }
    if (v < vectors) {
      forward_columns<1>(starts.data(), taps, in, weights, shift, channels, plane, v * kLanes,
                         g.out_w, out);
    }
  }
}

// acc[b][t] += dy[b] * tap t's input at `at` (the unrolled row at the vector's first column).
template <int count>
[[gnu::always_inline]] MPIGRAD_AVX2 inline void filter_vector(__m256 (&acc)[kFilterBlock][count],
                                                              const __m256 (&dy)[kFilterBlock],
                                                              const float* at,
                                                              const int64_t* starts) {
#pragma GCC unroll 5
  for (int t = 0; t < count; ++t) {
    __m256 v = _mm256_loadu_ps(at + starts[t]);
    asm("" : "+x"(v));  // one load for both FMAs, not one folded into each (forward_columns)
#pragma GCC unroll 2
    for (int b = 0; b < kFilterBlock; ++b) acc[b][t] = _mm256_fmadd_ps(dy[b], v, acc[b][t]);
  }
}

// accum[b][t] += the sum over one image's output rows and columns of grad[b] times tap t's
// input, for `channels` (1 or kFilterBlock) output channels and `count` taps from `starts`,
// in 8 lanes. `in` is the image unrolled whole, `grad` the channels' gradient planes; the
// columns of each row past its last whole vector come from `tail` [kFilterBlock][out_h][kLanes],
// padded with zeros (plain loads: AMD's masked loads cost more).
template <int count>
MPIGRAD_AVX2 void filter_taps(const Conv2dGeometry& g, const Unrolled& u, const int64_t* starts,
                              const float* in, const float* const* grad, const float* tail,
                              int64_t channels, float* const* accum) {
  __m256 acc[kFilterBlock][count];
#pragma GCC unroll 2
  for (int b = 0; b < kFilterBlock; ++b) {
#pragma GCC unroll 5
    for (int t = 0; t < count; ++t) acc[b][t] = _mm256_setzero_ps();
  }
  const int64_t whole = g.out_w / kLanes * kLanes;
  for (int64_t oy = 0; oy < g.out_h; ++oy) {
    const float* row = in + oy * g.stride_h * u.group;
    __m256 dy[kFilterBlock];
    for (int64_t ox = 0; ox < whole; ox += kLanes) {
#pragma GCC unroll 2
      for (int b = 0; b < kFilterBlock; ++b) dy[b] = _mm256_loadu_ps(grad[b] + oy * g.out_w + ox);
      filter_vector(acc, dy, row + ox, starts);
    }
    if (whole < g.out_w) {
#pragma GCC unroll 2
      for (int b = 0; b < kFilterBlock; ++b) {
        dy[b] = _mm256_loadu_ps(tail + (b * g.out_h + oy) * kLanes);
      }
      filter_vector(acc, dy, row + whole, starts);
    }
  }
  for (int b = 0; b < channels; ++b) {
    for (int t = 0; t < count; ++t) {
      float* at = accum[b] + t * kLanes;
      _mm256_storeu_ps(at, _mm256_add_ps(_mm256_loadu_ps(at), acc[b][t]));
    }
  }
}

// One image's part of the filter gradient of `channels` output channels.
void filter_image(const Conv2dGeometry& g, const Unrolled& u, const std::vector<int64_t>& starts,
                  const float* in, const float* const* grad, const float* tail, int64_t channels,
                  float* const* accum) {
  const int64_t taps = int64_t(starts.size());
  for (int64_t t = 0; t < taps; t += kTapBlock) {
    static_assert(kFilterBlock == 2);
    float* const sums[kFilterBlock] = {accum[0] + t * kLanes, accum[1] + t * kLanes};
    const int64_t* at = starts.data() + t;
    switch (std::min(kTapBlock, taps - t)) {
      case 1:
        filter_taps<1>(g, u, at, in, grad, tail, channels, sums);
        break;
      case 2:
        filter_taps<2>(g, u, at, in, grad, tail, channels, sums);
        break;
      case 3:
        filter_taps<3>(g, u, at, in, grad, tail, channels, sums);
        break;
      case 4:
        filter_taps<4>(g, u, at, in, grad, tail, channels, sums);
        break;
      default:
        filter_taps<5>(g, u, at, in, grad, tail, channels, sums);
        break;
    }
  }
}

// The 8 lanes of `lanes` summed in a fixed order.
float lane_sum(const float* lanes) {
  float total = 0;
  for (int64_t i = 0; i < kLanes; ++i) total += lanes[i];
  return total;
}

// The padded rows output rows [first, first + count) read.
int64_t band_rows(const Conv2dGeometry& g, int64_t count) {
  return (count - 1) * g.stride_h + (g.kernel_h - 1) * g.dilation_h + 1;
}

void forward(const Conv2dShape& s, const float* x, const float* w, const float* bias, float* y) {
  const auto& g = s.geometry;
  const Unrolled u(g);
  const std::vector<float> packed = pack_weights(s, w);
  const std::vector<float> shifts = pack_bias(s, bias);
  const int64_t taps = g.channels * g.kernel_h * g.kernel_w;
  const int64_t work = s.out_channels * g.out_w * taps;  // FMAs a row
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(work, 1));
  const int64_t in_image = g.channels * g.height * g.width;
  const int64_t out_image = s.out_channels * g.out_h * g.out_w;
  parallel_for(0, s.batch * g.out_h, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> band;
    for (int64_t row = begin; row < end;) {
      // The rows of this chunk in one image, unrolled as one band.
      const int64_t n = row / g.out_h, first = row % g.out_h;
      const int64_t count = std::min(end - row, g.out_h - first);
      const int64_t rows = band_rows(g, count);
      band.resize(size_t(g.channels * rows * u.group));
      unroll(g, u, x + n * in_image, first * g.stride_h, rows, band.data());
      const std::vector<int64_t> starts = tap_starts(g, u, rows);
      for (int64_t oy = first; oy < first + count; ++oy) {
        const float* in = band.data() + (oy - first) * g.stride_h * u.group;
        forward_row(s, starts, in, packed.data(), shifts.empty() ? nullptr : shifts.data(),
                    y + n * out_image, oy);
      }
      row += count;
    }
  });
}

// The sum of a gradient plane into 8 lanes, added to `lanes` (the bias's gradient, read while the
// filter gradient has just brought the plane into cache).
MPIGRAD_AVX2 void add_plane_lanes(const float* plane, int64_t count, float* lanes) {
  __m256 acc = _mm256_loadu_ps(lanes);
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) acc = _mm256_add_ps(acc, _mm256_loadu_ps(plane + i));
  _mm256_storeu_ps(lanes, acc);
  for (int64_t k = 0; i < count; ++i, ++k) lanes[k] += plane[i];
}

void backward_filter(const Conv2dShape& s, const float* x, const float* grad_y, float* grad_w,
                     float* grad_bias) {
  const auto& g = s.geometry;
  const Unrolled u(g);
  const int64_t taps = g.channels * g.kernel_h * g.kernel_w;
  const int64_t in_image = g.channels * g.height * g.width;
  const int64_t plane = g.out_h * g.out_w;
  const int64_t rows = band_rows(g, g.out_h);
  const std::vector<int64_t> starts = tap_starts(g, u, rows);
  const int64_t work = s.batch * plane * taps;  // FMAs an output channel
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(work, 1));
  parallel_for(0, s.out_channels, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> image(size_t(g.channels * rows * u.group));
    const int64_t whole = g.out_w / kLanes * kLanes;
    std::vector<float> tail(size_t(kFilterBlock * g.out_h * kLanes), 0.0f);  // zeros past out_w
    std::vector<float> accum(size_t((end - begin) * taps * kLanes), 0.0f);
    std::vector<float> bias_lanes(grad_bias != nullptr ? size_t((end - begin) * kLanes) : 0, 0.0f);
    for (int64_t n = 0; n < s.batch; ++n) {
      unroll(g, u, x + n * in_image, 0, rows, image.data());
      for (int64_t o = begin; o < end; o += kFilterBlock) {
        const int64_t channels = std::min(kFilterBlock, end - o);
        const int64_t last = o + channels - 1;
        const float* const grad[kFilterBlock] = {grad_y + (n * s.out_channels + o) * plane,
                                                 grad_y + (n * s.out_channels + last) * plane};
        for (int64_t b = 0; b < kFilterBlock && whole < g.out_w; ++b) {
          for (int64_t oy = 0; oy < g.out_h; ++oy) {
            float* to = tail.data() + (b * g.out_h + oy) * kLanes;
            for (int64_t ox = whole; ox < g.out_w; ++ox)
              to[ox - whole] = grad[b][oy * g.out_w + ox];
          }
        }
        float* const sums[kFilterBlock] = {accum.data() + (o - begin) * taps * kLanes,
                                           accum.data() + (last - begin) * taps * kLanes};
        filter_image(g, u, starts, image.data(), grad, tail.data(), channels, sums);
        for (int64_t b = 0; b < channels && grad_bias != nullptr; ++b) {
          add_plane_lanes(grad[b], plane, bias_lanes.data() + (o + b - begin) * kLanes);
        }
      }
    }
    for (int64_t o = begin; o < end; ++o) {
      for (int64_t t = 0; t < taps; ++t) {
        grad_w[o * taps + t] = lane_sum(accum.data() + ((o - begin) * taps + t) * kLanes);
      }
      if (grad_bias != nullptr) grad_bias[o] = lane_sum(bias_lanes.data() + (o - begin) * kLanes);
    }
  });
}

}  // namespace
#endif  // MPIGRAD_HAS_AVX2_MATH

bool has_small_channel_conv2d(ConvPass pass, DType dtype, const Conv2dShape& shape) {
#if defined(MPIGRAD_HAS_AVX2_MATH)
  const auto& g = shape.geometry;
  return has_avx2_fma() && dtype == DType::Float32 && pass != ConvPass::BackwardData &&
         is_small_channel(shape) && g.out_h > 0 && g.out_w > 0;
#else
  (void)pass, (void)dtype, (void)shape;
  return false;
#endif
}

void small_channel_conv2d(ConvPass pass, DType dtype, const Conv2dShape& shape, const void* first,
                          const void* second, void* out, const void* bias, void* grad_bias) {
  if (!has_small_channel_conv2d(pass, dtype, shape)) {
    throw_invalid("small_channel_conv2d",
                  "no direct kernel for this case (it takes float32 forward and filter-gradient "
                  "passes with groups 1 and 1 to " +
                      std::to_string(kSmallChannels) + " input channels, on a CPU with AVX2)");
  }
#if defined(MPIGRAD_HAS_AVX2_MATH)
  const float* a = static_cast<const float*>(first);
  const float* b = static_cast<const float*>(second);
  float* result = static_cast<float*>(out);
  if (pass == ConvPass::Forward) {
    return forward(shape, a, b, static_cast<const float*>(bias), result);
  }
  backward_filter(shape, a, b, result, static_cast<float*>(grad_bias));
#else
  (void)first, (void)second, (void)out, (void)bias, (void)grad_bias;
#endif
}

}  // namespace mpigrad::kernels::cpu
