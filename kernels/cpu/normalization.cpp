// CPU batch norm, forward and backward, alone, followed by a ReLU, or followed by a ReLU and a
// 2x2 max pooling (layer norm is normalization_layer.cpp's).
//
// Layout: dense [batch, channels, inner].
// Threading: channels spread over threads (a channel's statistics and gradients are reduced by
// one thread, in a fixed order). No result depends on the thread count.
// Precision: sums are accumulated in double, so float32 statistics are exact to float rounding.
#include "mpigrad/kernels/normalization.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <type_traits>
#include <vector>

#include "mpigrad/kernels/cpu/max_pool_2x2.h"
#include "mpigrad/kernels/cpu/normalization_lanes.h"
#include "mpigrad/kernels/cpu/parallel.h"
#include "mpigrad/kernels/cpu/scalar.h"
#include "mpigrad/kernels/cpu/vector_math.h"
#include "mpigrad/kernels/pooling.h"

namespace mpigrad::kernels::cpu {
namespace {

// Channels per thread at least: about 16384 elements' worth of work, a channel costing its
// batch * inner elements plus kChannelOverhead elements' worth of fixed work (its lane sums and
// their reduction, ~80 ns), which dominates the short channels of deep layers: ResNet-18's
// [8, 512, 1, 1] batch norm took 44 us serial, so it is worth two threads.
constexpr int64_t kChannelOverhead = 320;
int64_t channel_grain(int64_t batch, int64_t inner) {
  return std::max<int64_t>(1, 16384 / (std::max<int64_t>(0, batch * inner) + kChannelOverhead));
}

#if defined(MPIGRAD_HAS_AVX2_MATH)
// Float32 batch norm, 8 floats at a time (AVX2), for one channel: its `batch` rows of `inner`
// elements, `stride` apart. Sums run in float lanes over blocks of at most kBlock elements of a
// row (at most kBlock / 8 additions a lane), and each block's lanes are added into double
// lanes; the order depends only on batch and inner, never on the thread count. A row's tail
// goes through masked loads, so nothing past it is read.
namespace avx2 {

constexpr int64_t kBlock = 1024;

MPIGRAD_AVX2 inline __m256i lanes_below(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(std::min<int64_t>(count, 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

MPIGRAD_AVX2 inline __m256d widen(__m256 v) {
  return _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)),
                       _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

MPIGRAD_AVX2 inline double total(__m256d v) {
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, v);
  return (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]);
}

// For each block of each row: body(offset, 8 lanes valid mask or null) over the block in steps
// of 8, then flush() adds the block's float lanes into the double ones.
template <typename Step, typename Flush>
MPIGRAD_AVX2 inline void for_each_block(int64_t batch, int64_t stride, int64_t inner, Step step,
                                        Flush flush) {
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t first = 0; first < inner; first += kBlock) {
      const int64_t last = std::min(inner, first + kBlock);
      int64_t i = first;
      for (; i + 8 <= last; i += 8) step(n * stride + i, 8);
      if (i < last) step(n * stride + i, last - i);
      flush();
    }
  }
}

MPIGRAD_AVX2 inline __m256 load(const float* p, int64_t count) {
  return count == 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes_below(count));
}

// Two passes: a first mean m, then d = x - float(m) summed and squared. The mean is float(m) plus
// the mean of d and the variance the mean of d^2 less its square: with d centred to float
// rounding, no cancellation, and float(m)'s own rounding is corrected for. With `warm` (the
// channel's output, laid out as x), the second pass, which reads x from L2 and has load slots to
// spare, also fetches the output's lines into cache, so the stores of the normalize pass that
// follows do not each wait for their line to come from memory.
MPIGRAD_AVX2 void channel_statistics(int64_t batch, int64_t stride, int64_t inner, const float* x,
                                     float& mean, float& variance, const float* warm) {
  const double count = double(batch * inner);
  __m256 s = _mm256_setzero_ps();
  __m256d sum = _mm256_setzero_pd();
  for_each_block(
      batch, stride, inner,
      [&](int64_t at, int64_t n) MPIGRAD_AVX2 { s = _mm256_add_ps(s, load(x + at, n)); },
      [&]() MPIGRAD_AVX2 {
        sum = _mm256_add_pd(sum, widen(s));
        s = _mm256_setzero_ps();
      });
  const float shift = float(total(sum) / count);
  const __m256 centre = _mm256_set1_ps(shift);
  __m256 ds = _mm256_setzero_ps(), dd = _mm256_setzero_ps();
  __m256d sum_d = _mm256_setzero_pd(), sum_dd = _mm256_setzero_pd();
  for_each_block(
      batch, stride, inner,
      [&](int64_t at, int64_t n) MPIGRAD_AVX2 {
        if (warm != nullptr) _mm_prefetch(reinterpret_cast<const char*>(warm + at), _MM_HINT_T0);
        __m256 d = _mm256_sub_ps(load(x + at, n), centre);
        if (n < 8) d = _mm256_and_ps(d, _mm256_castsi256_ps(lanes_below(n)));
        ds = _mm256_add_ps(ds, d);
        dd = _mm256_fmadd_ps(d, d, dd);
      },
      [&]() MPIGRAD_AVX2 {
        sum_d = _mm256_add_pd(sum_d, widen(ds));
        sum_dd = _mm256_add_pd(sum_dd, widen(dd));
        ds = dd = _mm256_setzero_ps();
      });
  const double mean_d = total(sum_d) / count;
  mean = float(double(shift) + mean_d);
  variance = float(std::max(total(sum_dd) / count - mean_d * mean_d, 0.0));
}

// max(0, v) as the ReLU kernel (kernels/cpu/elementwise.cpp) computes it: NaN and -0 pass.
MPIGRAD_AVX2 inline __m256 relu(__m256 v) {
  return _mm256_max_ps(_mm256_setzero_ps(), v);
}

// y = x * scale + shift, or with Relu max(0, x * scale + shift).
template <bool Relu>
MPIGRAD_AVX2 void channel_forward(int64_t batch, int64_t stride, int64_t inner, const float* x,
                                  float scale, float shift, float* y) {
  const __m256 a = _mm256_set1_ps(scale), b = _mm256_set1_ps(shift);
  const auto affine = [a, b](__m256 v) MPIGRAD_AVX2 {
    const __m256 z = _mm256_fmadd_ps(v, a, b);
    if constexpr (Relu) {
      return relu(z);
    } else {
      return z;
    }
  };
  for (int64_t n = 0; n < batch; ++n) {
    const float* in = x + n * stride;
    float* out = y + n * stride;
    int64_t i = 0;
    for (; i + 8 <= inner; i += 8) _mm256_storeu_ps(out + i, affine(_mm256_loadu_ps(in + i)));
    if (i < inner) {
      const __m256 v = affine(load(in + i, inner - i));
      // Not a masked store: vmaskmov stores take tens of cycles on some CPUs.
      vector_math::store_tail(out + i, inner - i, v);
    }
  }
}

// The gradient that reaches batch norm's output from `dy` (its lanes past a row's tail loaded as
// 0): dy itself, or with Relu dy where the ReLU's output is positive and +0 elsewhere, as the
// ReLU's backward writes it. The forward wrote y = max(0, fma(x, scale, shift)), so y > 0 exactly
// where fma(x, scale, shift) > 0: the same instruction on the same operands recomputes the mask
// from `xv`, which the backward reads anyway, and y (another stream the size of x) is not read.
template <bool Relu>
MPIGRAD_AVX2 inline __m256 grad_through(__m256 dy, __m256 xv, __m256 scale, __m256 shift) {
  if constexpr (Relu) {
    const __m256 z = _mm256_fmadd_ps(xv, scale, shift);
    return _mm256_and_ps(dy, _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_GT_OQ));
  } else {
    (void)xv, (void)scale, (void)shift;
    return dy;
  }
}

// One step of the backward's sums: `count` (<= 8) elements of x and dy added to the float lanes
// g, of dy (with Relu through the ReLU that followed y = x * scale + shift, scale and shift in a
// and b), and gx, of dy (x - mean) (mean in m).
template <bool Relu>
MPIGRAD_AVX2 inline void add_grad_terms(const float* x, const float* dy, int64_t count, __m256 m,
                                        __m256 a, __m256 b, __m256& g, __m256& gx) {
  // Masked lanes of a tail load as 0, so their dy adds nothing.
  const __m256 xv = load(x, count);
  const __m256 d = grad_through<Relu>(load(dy, count), xv, a, b);
  g = _mm256_add_ps(g, d);
  gx = _mm256_fmadd_ps(d, _mm256_sub_ps(xv, m), gx);
}

// The channel's sums of dy and dy (x - mean); with Relu, dy through the ReLU that followed the
// forward's y = x * scale + shift. With `warm` (the channel's grad_x, laid out as x), it also
// fetches grad_x's lines, as channel_statistics does y's: grad_x is often a block that has left
// the cache, and channel_grad_input's stores would otherwise each wait for theirs (profiled in
// training: that pass ran 3x slower than with a block still in cache).
template <bool Relu>
MPIGRAD_AVX2 void channel_grad_sums(int64_t batch, int64_t stride, int64_t inner, const float* x,
                                    const float* dy, float mean, float scale, float shift,
                                    double& sum_dy, double& sum_dy_xc, const float* warm) {
  const __m256 m = _mm256_set1_ps(mean);
  const __m256 a = _mm256_set1_ps(scale), b = _mm256_set1_ps(shift);
  __m256 g = _mm256_setzero_ps(), gx = _mm256_setzero_ps();
  __m256d sum_g = _mm256_setzero_pd(), sum_gx = _mm256_setzero_pd();
  for_each_block(
      batch, stride, inner,
      [&](int64_t at, int64_t n) MPIGRAD_AVX2 {
        if (warm != nullptr) _mm_prefetch(reinterpret_cast<const char*>(warm + at), _MM_HINT_T0);
        add_grad_terms<Relu>(x + at, dy + at, n, m, a, b, g, gx);
      },
      [&]() MPIGRAD_AVX2 {
        sum_g = _mm256_add_pd(sum_g, widen(g));
        sum_gx = _mm256_add_pd(sum_gx, widen(gx));
        g = gx = _mm256_setzero_ps();
      });
  sum_dy = total(sum_g);
  sum_dy_xc = total(sum_gx);
}

// dx = a dy + b x + k; with Relu, dy through the ReLU as in channel_grad_sums.
template <bool Relu>
MPIGRAD_AVX2 void channel_grad_input(int64_t batch, int64_t stride, int64_t inner, const float* x,
                                     const float* dy, float scale, float shift, float a, float b,
                                     float k, float* dx) {
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b), vk = _mm256_set1_ps(k);
  const __m256 vscale = _mm256_set1_ps(scale), vshift = _mm256_set1_ps(shift);
  const auto row_piece = [&](const float* in, const float* grad, int64_t count) MPIGRAD_AVX2 {
    const __m256 xv = load(in, count);
    const __m256 g = grad_through<Relu>(load(grad, count), xv, vscale, vshift);
    return _mm256_fmadd_ps(va, g, _mm256_fmadd_ps(vb, xv, vk));
  };
  for (int64_t n = 0; n < batch; ++n) {
    const int64_t row = n * stride;
    int64_t i = 0;
    for (; i + 8 <= inner; i += 8) {
      _mm256_storeu_ps(dx + row + i, row_piece(x + row + i, dy + row + i, 8));
    }
    if (i < inner) {
      vector_math::store_tail(dx + row + i, inner - i,
                              row_piece(x + row + i, dy + row + i, inner - i));
    }
  }
}

// channel_grad_sums<true>'s work on one row of x and dy, stopped short of its sums: the double
// lanes that each block of the row adds to them, out[8j, 8j + 4) those of dy and out[8j + 4,
// 8j + 8) those of dy (x - mean) for block j. add_partials adds them up as channel_grad_sums
// does, so rows done apart, in any order and on any thread, still give its sums to the bit.
MPIGRAD_AVX2 void row_grad_partials(int64_t inner, const float* x, const float* dy, float mean,
                                    float scale, float shift, double* out) {
  const __m256 m = _mm256_set1_ps(mean);
  const __m256 a = _mm256_set1_ps(scale), b = _mm256_set1_ps(shift);
  __m256 g = _mm256_setzero_ps(), gx = _mm256_setzero_ps();
  for_each_block(
      1, 0, inner,
      [&](int64_t at, int64_t n)
          MPIGRAD_AVX2 { add_grad_terms<true>(x + at, dy + at, n, m, a, b, g, gx); },
      [&]() MPIGRAD_AVX2 {
        _mm256_storeu_pd(out, widen(g));
        _mm256_storeu_pd(out + 4, widen(gx));
        out += 8;
        g = gx = _mm256_setzero_ps();
      });
}

// A channel's sums from the partials of its `rows` rows (row_grad_partials), `stride` doubles
// apart, `blocks` blocks each, added in channel_grad_sums's order.
MPIGRAD_AVX2 void add_partials(int64_t rows, int64_t stride, int64_t blocks, const double* partials,
                               double& sum_dy, double& sum_dy_xc) {
  __m256d sum_g = _mm256_setzero_pd(), sum_gx = _mm256_setzero_pd();
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t j = 0; j < blocks; ++j) {
      const double* block = partials + n * stride + 8 * j;
      sum_g = _mm256_add_pd(sum_g, _mm256_loadu_pd(block));
      sum_gx = _mm256_add_pd(sum_gx, _mm256_loadu_pd(block + 4));
    }
  }
  sum_dy = total(sum_g);
  sum_dy_xc = total(sum_gx);
}

}  // namespace avx2
#endif

// Whether the Float32 routines of namespace avx2 run: this CPU has AVX2 and rows are long enough
// to fill a vector (BatchNorm1d's [N, C], inner 1, stays on the lane sums below).
template <typename T>
bool use_avx2(int64_t inner) {
#if defined(MPIGRAD_HAS_AVX2_MATH)
  return std::is_same_v<T, float> && inner >= 8 && has_avx2_fma();
#else
  (void)inner;
  return false;
#endif
}

// One channel's mean and biased variance; the AVX2 path for Float32 rows of 8 or more, which
// also brings the channel's part of `warm` into cache when it is not null.
template <typename T>
void channel_statistics(int64_t batch, int64_t channels, int64_t inner, const T* x, int64_t c,
                        T& mean, T& variance, const T* warm = nullptr) {
#if defined(MPIGRAD_HAS_AVX2_MATH)
  if constexpr (std::is_same_v<T, float>) {
    if (use_avx2<T>(inner)) {
      const float* out = warm == nullptr ? nullptr : warm + c * inner;
      avx2::channel_statistics(batch, channels * inner, inner, x + c * inner, mean, variance, out);
      return;
    }
  }
#endif
  (void)warm;
  const double count = double(batch * inner);
  LaneSums total[1];
  for (int64_t n = 0; n < batch; ++n) {
    const T* row = x + (n * channels + c) * inner;
    add_lanes(inner, total, [row](int64_t i) { return std::array<double, 1>{double(row[i])}; });
  }
  const double m = total[0].total() / count;
  // Two passes: sum((x - m)^2) does not cancel catastrophically like E[x^2] - m^2.
  LaneSums squares[1];
  for (int64_t n = 0; n < batch; ++n) {
    const T* row = x + (n * channels + c) * inner;
    add_lanes(inner, squares, [row, m](int64_t i) {
      const double d = double(row[i]) - m;
      return std::array<double, 1>{d * d};
    });
  }
  mean = T(m);
  variance = T(squares[0].total() / count);
}

// Channel c's y = (x - mean) * invstd * weight[c] + bias[c] as y = x * scale + shift. The forward
// and the fused backward's recomputed ReLU mask both take scale and shift from here, bitwise the
// same: not inlined, so that a build allowed to contract a - b * c into one fma cannot do so in
// one caller and not in the other.
template <typename T>
[[gnu::noinline]] void channel_affine(int64_t c, T mean, T invstd, const T* weight, const T* bias,
                                      T& scale, T& shift) {
  scale = invstd * (weight ? weight[c] : T(1));
  shift = (bias ? bias[c] : T(0)) - mean * scale;
}

// y = x * scale + shift over one channel (channel_affine); with Relu, max(0, that) as the ReLU
// kernel writes it (`v < 0 ? 0 : v`: NaN and -0 pass).
template <bool Relu, typename T>
void channel_normalize(int64_t batch, int64_t channels, int64_t inner, const T* x, int64_t c,
                       T mean, T invstd, const T* weight, const T* bias, T* y) {
  T scale, shift;
  channel_affine(c, mean, invstd, weight, bias, scale, shift);
#if defined(MPIGRAD_HAS_AVX2_MATH)
  if constexpr (std::is_same_v<T, float>) {
    if (use_avx2<T>(inner)) {
      avx2::channel_forward<Relu>(batch, channels * inner, inner, x + c * inner, scale, shift,
                                  y + c * inner);
      return;
    }
  }
#endif
  for (int64_t n = 0; n < batch; ++n) {
    const T* in = x + (n * channels + c) * inner;
    T* out = y + (n * channels + c) * inner;
    for (int64_t i = 0; i < inner; ++i) {
      const T v = in[i] * scale + shift;
      if constexpr (Relu) {
        out[i] = v < T(0) ? T(0) : v;
      } else {
        out[i] = v;
      }
    }
  }
}

// dy[i] as it reaches batch norm's output: with Relu through the ReLU whose output is y, as its
// backward writes it (`y > 0 ? dy : 0`; y > 0 exactly where the ReLU's input is).
template <bool Relu, typename T>
inline T grad_through(const T* dy, const T* y, int64_t i) {
  if constexpr (Relu) {
    return y[i] > T(0) ? dy[i] : T(0);
  } else {
    (void)y;
    return dy[i];
  }
}

template <typename T>
void bn_statistics(int64_t batch, int64_t channels, int64_t inner, const T* x, T* mean,
                   T* variance) {
  parallel_for(0, channels, channel_grain(batch, inner), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      channel_statistics(batch, channels, inner, x, c, mean[c], variance[c]);
    }
  });
}

template <typename T>
void bn_forward(int64_t batch, int64_t channels, int64_t inner, const T* x, const T* mean,
                const T* invstd, const T* weight, const T* bias, T* y) {
  parallel_for(0, channels, channel_grain(batch, inner), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      channel_normalize<false>(batch, channels, inner, x, c, mean[c], invstd[c], weight, bias, y);
    }
  });
}

// Channel c's mean and invstd and, when running_mean is not null, its running statistics blended
// in place: core's ops' arithmetic in T (invstd = 1 / sqrt(variance + eps); running = running *
// (1 - factor) + stat * factor, the variance unbiased), one rounding per operation as
// batch_norm_statistics + those ops give. `warm` as channel_statistics takes it.
template <typename T>
void channel_training_statistics(int64_t batch, int64_t channels, int64_t inner, double factor,
                                 double eps, const T* x, int64_t c, T* running_mean, T* running_var,
                                 T* mean, T* invstd, const T* warm) {
  const double count = double(batch * inner);
  T variance;
  channel_statistics(batch, channels, inner, x, c, mean[c], variance, warm);
  const T shifted = variance + T(eps);
  invstd[c] = T(1) / std::sqrt(shifted);
  if (running_mean != nullptr) {
    const T keep = T(1.0 - factor), add = T(factor);
    const T keep_mean = running_mean[c] * keep;
    const T add_mean = mean[c] * add;
    running_mean[c] = keep_mean + add_mean;
    const T unbiased = variance * T(count / (count - 1.0));
    const T keep_var = running_var[c] * keep;
    const T add_var = unbiased * add;
    running_var[c] = keep_var + add_var;
  }
}

// Each channel's statistics, invstd and running statistics, then its y while the channel (200 KB
// for [64, C, 28, 28] Float32) is still in cache: the statistics and the normalization in turn
// read it from memory twice, and fork and join the threads twice. The statistics also fetch the
// channel's lines of y, which the normalization then writes. Bitwise batch_norm_statistics,
// channel_training_statistics's arithmetic and batch_norm_forward in turn. With Relu, y is
// max(0, that), in the same pass.
template <bool Relu, typename T>
void bn_forward_training(int64_t batch, int64_t channels, int64_t inner, double factor, double eps,
                         const T* x, const T* weight, const T* bias, T* running_mean,
                         T* running_var, T* y, T* mean, T* invstd) {
  parallel_for(0, channels, channel_grain(batch, inner), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      channel_training_statistics(batch, channels, inner, factor, eps, x, c, running_mean,
                                  running_var, mean, invstd, y);
      channel_normalize<Relu>(batch, channels, inner, x, c, mean[c], invstd[c], weight, bias, y);
    }
  });
}

// One (sample, channel) plane of max pooling's geometry `pool`.
Pool2dGeometry one_plane(const Pool2dGeometry& pool) {
  Pool2dGeometry plane = pool;
  plane.planes = 1;
  return plane;
}

#if defined(MPIGRAD_HAS_AVX2_MATH)
// bn_forward_training<true> then max pooling (batch_norm_relu_max_pool_supported): each plane's
// ReLU output goes to a scratch plane in L1 and max pooling's own kernel pools it from there, so
// every result is bitwise the two ops' and the full-size ReLU output is never written.
void bnrp_forward_training(const Pool2dGeometry& pool, int64_t batch, int64_t channels,
                           double factor, double eps, const float* x, const float* weight,
                           const float* bias, float* running_mean, float* running_var, float* out,
                           uint8_t* taps, float* mean, float* invstd) {
  const int64_t inner = pool.height * pool.width, outer = pool.out_h * pool.out_w;
  const Pool2dGeometry plane = one_plane(pool);
  parallel_for(0, channels, channel_grain(batch, inner), [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(static_cast<size_t>(inner));
    for (int64_t c = begin; c < end; ++c) {
      channel_training_statistics(batch, channels, inner, factor, eps, x, c, running_mean,
                                  running_var, mean, invstd, static_cast<const float*>(nullptr));
      float scale, shift;
      channel_affine(c, mean[c], invstd[c], weight, bias, scale, shift);
      for (int64_t n = 0; n < batch; ++n) {
        const int64_t p = n * channels + c;
        avx2::channel_forward<true>(1, inner, inner, x + p * inner, scale, shift, scratch.data());
        max_pool_2x2_forward_plane(plane, scratch.data(), out + p * outer, taps + p * outer);
      }
    }
  });
}
#endif

// Channel c's grad_weight and grad_bias (either may be null) from its sums of dy and
// dy (x - mean), and the coefficients of its grad_x = a dy + b x + k.
template <typename T>
void channel_gradients(int64_t c, double count, bool training, const T* mean, const T* invstd,
                       const T* weight, double sum_dy, double sum_dy_xc, T* grad_weight,
                       T* grad_bias, T& ta, T& tb, T& tk) {
  const double m = double(mean[c]), s = double(invstd[c]);
  const double sum_dy_xhat = sum_dy_xc * s;
  if (grad_weight) grad_weight[c] = T(sum_dy_xhat);
  if (grad_bias) grad_bias[c] = T(sum_dy);
  const double w = weight ? double(weight[c]) : 1.0;
  const double mean_dy = training ? sum_dy / count : 0.0;
  const double mean_dy_xhat = training ? sum_dy_xhat / count : 0.0;
  // dx = w s (dy - mean_dy - xhat mean_dy_xhat) with xhat = (x - m) s, folded into
  // dx = a dy + b x + k per channel so the loop runs in T and vectorizes.
  const double a = w * s, b = -w * s * s * mean_dy_xhat;
  const double k = -w * s * mean_dy + w * s * s * m * mean_dy_xhat;
  ta = T(a), tb = T(b), tk = T(k);
}

// With Relu, grad_y is the gradient of y = relu(batch norm), `relu_output` that y and `bias` the
// forward's, and each read of grad_y goes through the ReLU's derivative: the same values, summed
// in the same order, as the ReLU's backward followed by this one without Relu. The AVX2 path
// recomputes the ReLU's mask from x (avx2::grad_through); the scalar one, whose rounding of
// x * scale + shift the compiler may contract differently from the forward's, reads y.
template <bool Relu, typename T>
void bn_backward(int64_t batch, int64_t channels, int64_t inner, bool training, const T* x,
                 const T* relu_output, const T* grad_y, const T* mean, const T* invstd,
                 const T* weight, const T* bias, T* grad_x, T* grad_weight, T* grad_bias) {
  // Without Relu nothing reads the output; grad_y stands in so no offset is taken from null.
  const T* y = Relu ? relu_output : grad_y;
  // grad_x written over grad_y is already in cache.
  const bool warm = grad_x != nullptr && grad_x != grad_y;
  const double count = double(batch * inner);
  parallel_for(0, channels, channel_grain(batch, inner), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const double m = double(mean[c]);
      double sum_dy = 0, sum_dy_xc = 0;  // of dy and dy * (x - m)
      const bool vector = use_avx2<T>(inner);
      T scale = T(1), shift = T(0);  // the forward's, for the recomputed mask
      if (Relu) channel_affine(c, mean[c], invstd[c], weight, bias, scale, shift);
#if defined(MPIGRAD_HAS_AVX2_MATH)
      if constexpr (std::is_same_v<T, float>) {
        if (vector) {
          avx2::channel_grad_sums<Relu>(batch, channels * inner, inner, x + c * inner,
                                        grad_y + c * inner, mean[c], scale, shift, sum_dy,
                                        sum_dy_xc, warm ? grad_x + c * inner : nullptr);
        }
      }
#endif
      if (!vector) {
        LaneSums sums[2];
        for (int64_t n = 0; n < batch; ++n) {
          const T* in = x + (n * channels + c) * inner;
          const T* dy = grad_y + (n * channels + c) * inner;
          const T* out = y + (n * channels + c) * inner;
          add_lanes(inner, sums, [in, dy, out, m](int64_t i) {
            const double g = double(grad_through<Relu>(dy, out, i));
            return std::array<double, 2>{g, g * (double(in[i]) - m)};
          });
        }
        sum_dy = sums[0].total();
        sum_dy_xc = sums[1].total();
      }
      T ta, tb, tk;
      channel_gradients(c, count, training, mean, invstd, weight, sum_dy, sum_dy_xc, grad_weight,
                        grad_bias, ta, tb, tk);
      if (!grad_x) continue;
#if defined(MPIGRAD_HAS_AVX2_MATH)
      if constexpr (std::is_same_v<T, float>) {
        if (vector) {
          avx2::channel_grad_input<Relu>(batch, channels * inner, inner, x + c * inner,
                                         grad_y + c * inner, scale, shift, ta, tb, tk,
                                         grad_x + c * inner);
          continue;
        }
      }
#endif
      for (int64_t n = 0; n < batch; ++n) {
        const T* in = x + (n * channels + c) * inner;
        const T* dy = grad_y + (n * channels + c) * inner;
        const T* out = y + (n * channels + c) * inner;
        T* dx = grad_x + (n * channels + c) * inner;
        for (int64_t i = 0; i < inner; ++i) {
          dx[i] = ta * grad_through<Relu>(dy, out, i) + tb * in[i] + tk;
        }
      }
    }
  });
}

#if defined(MPIGRAD_HAS_AVX2_MATH)
// The backward of bnrp_forward_training from the pooled gradient and taps, in three passes where
// bn_backward<true> makes two per channel: the planes in memory order, each plane's gradient of
// the ReLU output built in an L1 scratch plane by max pooling's own backward and its sums' block
// lanes kept (row_grad_partials); each channel's sums and grad_x coefficients from those lanes;
// the planes in memory order again, the gradient built again and grad_x written from it. Every
// stream is read front to back (a channel at a time, each plane's short pieces of the pooled
// gradient and taps lie a whole row of planes apart, which the hardware prefetcher does not
// follow), and the full-size gradient of the ReLU output that the unfused ops write to memory and
// read back twice is never written. The values and their order are the unfused ops', so every
// result is bitwise theirs.
void bnrp_backward(const Pool2dGeometry& pool, int64_t batch, int64_t channels, const float* x,
                   const float* grad_out, const uint8_t* taps, const float* mean,
                   const float* invstd, const float* weight, const float* bias, float* grad_x,
                   float* grad_weight, float* grad_bias) {
  const int64_t inner = pool.height * pool.width, outer = pool.out_h * pool.out_w;
  const int64_t planes = batch * channels, blocks = (inner + avx2::kBlock - 1) / avx2::kBlock;
  const Pool2dGeometry one = one_plane(pool);
  const int64_t grain = std::max<int64_t>(1, 16384 / inner);
  std::vector<float> scale(static_cast<size_t>(channels)), shift(scale.size());
  for (int64_t c = 0; c < channels; ++c) {
    channel_affine(c, mean[c], invstd[c], weight, bias, scale[size_t(c)], shift[size_t(c)]);
  }
  const auto partials = std::make_unique_for_overwrite<double[]>(size_t(planes * blocks * 8));
  parallel_for(0, planes, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> dy(static_cast<size_t>(inner));
    for (int64_t p = begin; p < end; ++p) {
      const size_t c = size_t(p % channels);
      max_pool_2x2_backward_plane(one, grad_out + p * outer, taps + p * outer, dy.data());
      avx2::row_grad_partials(inner, x + p * inner, dy.data(), mean[c], scale[c], shift[c],
                              partials.get() + p * blocks * 8);
    }
  });
  std::vector<float> a(scale.size()), b(scale.size()), k(scale.size());
  for (int64_t c = 0; c < channels; ++c) {
    double sum_dy, sum_dy_xc;
    avx2::add_partials(batch, channels * blocks * 8, blocks, partials.get() + c * blocks * 8,
                       sum_dy, sum_dy_xc);
    channel_gradients(c, double(batch * inner), /*training=*/true, mean, invstd, weight, sum_dy,
                      sum_dy_xc, grad_weight, grad_bias, a[size_t(c)], b[size_t(c)], k[size_t(c)]);
  }
  if (grad_x == nullptr) return;
  parallel_for(0, planes, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> dy(static_cast<size_t>(inner));
    for (int64_t p = begin; p < end; ++p) {
      const size_t c = size_t(p % channels);
      max_pool_2x2_backward_plane(one, grad_out + p * outer, taps + p * outer, dy.data());
      avx2::channel_grad_input<true>(1, inner, inner, x + p * inner, dy.data(), scale[c], shift[c],
                                     a[c], b[c], k[c], grad_x + p * inner);
    }
  });
}
#endif

template <typename T>
const T* in_ptr(const void* p) {
  return static_cast<const T*>(p);
}
template <typename T>
T* out_ptr(void* p) {
  return static_cast<T*>(p);
}

}  // namespace

void batch_norm_statistics(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                           const void* x, void* mean, void* variance) {
  MPIGRAD_NORM_DISPATCH(
      "batch_norm_statistics",
      bn_statistics(batch, channels, inner, in_ptr<T>(x), out_ptr<T>(mean), out_ptr<T>(variance)))
}

void batch_norm_forward(DType dtype, int64_t batch, int64_t channels, int64_t inner, const void* x,
                        const void* mean, const void* invstd, const void* weight, const void* bias,
                        void* y) {
  MPIGRAD_NORM_DISPATCH(
      "batch_norm_forward",
      bn_forward(batch, channels, inner, in_ptr<T>(x), in_ptr<T>(mean), in_ptr<T>(invstd),
                 in_ptr<T>(weight), in_ptr<T>(bias), out_ptr<T>(y)))
}

void batch_norm_forward_training(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                                 double factor, double eps, const void* x, const void* weight,
                                 const void* bias, void* running_mean, void* running_var, void* y,
                                 void* mean, void* invstd) {
  MPIGRAD_NORM_DISPATCH("batch_norm_forward_training",
                        bn_forward_training<false>(
                            batch, channels, inner, factor, eps, in_ptr<T>(x), in_ptr<T>(weight),
                            in_ptr<T>(bias), out_ptr<T>(running_mean), out_ptr<T>(running_var),
                            out_ptr<T>(y), out_ptr<T>(mean), out_ptr<T>(invstd)))
}

void batch_norm_relu_forward_training(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                                      double factor, double eps, const void* x, const void* weight,
                                      const void* bias, void* running_mean, void* running_var,
                                      void* y, void* mean, void* invstd) {
  MPIGRAD_NORM_DISPATCH("batch_norm_relu_forward_training",
                        bn_forward_training<true>(
                            batch, channels, inner, factor, eps, in_ptr<T>(x), in_ptr<T>(weight),
                            in_ptr<T>(bias), out_ptr<T>(running_mean), out_ptr<T>(running_var),
                            out_ptr<T>(y), out_ptr<T>(mean), out_ptr<T>(invstd)))
}

void batch_norm_backward(DType dtype, int64_t batch, int64_t channels, int64_t inner, bool training,
                         const void* x, const void* grad_y, const void* mean, const void* invstd,
                         const void* weight, void* grad_x, void* grad_weight, void* grad_bias) {
  MPIGRAD_NORM_DISPATCH(
      "batch_norm_backward",
      bn_backward<false>(batch, channels, inner, training, in_ptr<T>(x), in_ptr<T>(nullptr),
                         in_ptr<T>(grad_y), in_ptr<T>(mean), in_ptr<T>(invstd), in_ptr<T>(weight),
                         in_ptr<T>(nullptr), out_ptr<T>(grad_x), out_ptr<T>(grad_weight),
                         out_ptr<T>(grad_bias)))
}

void batch_norm_relu_backward(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                              const void* x, const void* y, const void* grad_y, const void* mean,
                              const void* invstd, const void* weight, const void* bias,
                              void* grad_x, void* grad_weight, void* grad_bias) {
  MPIGRAD_NORM_DISPATCH(
      "batch_norm_relu_backward",
      bn_backward<true>(batch, channels, inner, /*training=*/true, in_ptr<T>(x), in_ptr<T>(y),
                        in_ptr<T>(grad_y), in_ptr<T>(mean), in_ptr<T>(invstd), in_ptr<T>(weight),
                        in_ptr<T>(bias), out_ptr<T>(grad_x), out_ptr<T>(grad_weight),
                        out_ptr<T>(grad_bias)))
}

bool batch_norm_relu_max_pool_supported(DType dtype, const Pool2dGeometry& pool) {
#if defined(MPIGRAD_HAS_AVX2_MATH)
  return dtype == DType::Float32 && has_avx2_fma() && pool.height * pool.width >= 8 &&
         pool.kernel_h == 2 && pool.kernel_w == 2 && pool.stride_h == 2 && pool.stride_w == 2 &&
         pool.pad_h == 0 && pool.pad_w == 0 && pool.dilation_h == 1 && pool.dilation_w == 1 &&
         pool.out_h == pool.height / 2 && pool.out_w == pool.width / 2 && pool.out_h >= 1 &&
         pool.out_w >= 1;
#else
  (void)dtype, (void)pool;
  return false;
#endif
}

void batch_norm_relu_max_pool_forward_training(DType dtype, const Pool2dGeometry& pool,
                                               int64_t batch, int64_t channels, double factor,
                                               double eps, const void* x, const void* weight,
                                               const void* bias, void* running_mean,
                                               void* running_var, void* out, void* taps, void* mean,
                                               void* invstd) {
  if (!batch_norm_relu_max_pool_supported(dtype, pool) || pool.planes != batch * channels) {
    throw_unsupported("batch_norm_relu_max_pool_forward_training", "this pooling geometry", dtype);
  }
#if defined(MPIGRAD_HAS_AVX2_MATH)
  bnrp_forward_training(pool, batch, channels, factor, eps, in_ptr<float>(x), in_ptr<float>(weight),
                        in_ptr<float>(bias), out_ptr<float>(running_mean),
                        out_ptr<float>(running_var), out_ptr<float>(out), out_ptr<uint8_t>(taps),
                        out_ptr<float>(mean), out_ptr<float>(invstd));
#else
  (void)batch, (void)channels, (void)factor, (void)eps, (void)x, (void)weight, (void)bias;
  (void)running_mean, (void)running_var, (void)out, (void)taps, (void)mean, (void)invstd;
#endif
}

void batch_norm_relu_max_pool_backward(DType dtype, const Pool2dGeometry& pool, int64_t batch,
                                       int64_t channels, const void* x, const void* grad_out,
                                       const void* taps, const void* mean, const void* invstd,
                                       const void* weight, const void* bias, void* grad_x,
                                       void* grad_weight, void* grad_bias) {
  if (!batch_norm_relu_max_pool_supported(dtype, pool) || pool.planes != batch * channels) {
    throw_unsupported("batch_norm_relu_max_pool_backward", "this pooling geometry", dtype);
  }
#if defined(MPIGRAD_HAS_AVX2_MATH)
  bnrp_backward(pool, batch, channels, in_ptr<float>(x), in_ptr<float>(grad_out),
                in_ptr<uint8_t>(taps), in_ptr<float>(mean), in_ptr<float>(invstd),
                in_ptr<float>(weight), in_ptr<float>(bias), out_ptr<float>(grad_x),
                out_ptr<float>(grad_weight), out_ptr<float>(grad_bias));
#else
  (void)x, (void)grad_out, (void)taps, (void)mean, (void)invstd, (void)weight, (void)bias;
  (void)grad_x, (void)grad_weight, (void)grad_bias;
#endif
}

}  // namespace mpigrad::kernels::cpu
