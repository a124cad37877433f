// CPU softmax and log_softmax, forward and backward, row by row.
//
// Layout: dense [rows, cols]; each row is independent. Both directions write with `=`. Forward
// may read scale * in + mask instead of in (kernels/softmax.h, SoftmaxScaleMask), and backward
// then multiplies by the scale: attention's Mul, Add and Softmax as one pass each way.
// Threading: rows are spread over OpenMP threads; one row is always handled by one thread, so
// the results do not depend on the thread count.
// Precision: Float64 accumulates in double; Float32, Float16 and BFloat16 compute and
// accumulate in float. Forward subtracts the row maximum, so exp never overflows.
// Float32 forward rows, and softmax's backward rows, run in AVX2 where the CPU has it
// (kernels/cpu/vector_math.h): attention's softmax over [batch, heads, T, T] scores is all exp
// one way and one reduction the other.
#include "mpigrad/kernels/softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "mpigrad/kernels/cpu/parallel.h"
#include "mpigrad/kernels/cpu/scalar.h"
#include "mpigrad/kernels/cpu/vector_math.h"

namespace mpigrad::kernels::cpu {
namespace {

// exp costs far more than an add, so rows are worth threading sooner than plain elementwise.
constexpr int64_t kSoftmaxGrain = 8192;

#if defined(MPIGRAD_HAS_AVX2_MATH)
// forward_row's Float32 formulas in vector code; out may alias in here too.
MPIGRAD_AVX2 void forward_row_avx2(bool log, int64_t cols, float* out, const float* in) {
  const float row_max = vector_math::row_max(cols, in);
  if (!log) {
    const float sum = vector_math::exp_sum(cols, in, 1.0f, row_max, out);
    vector_math::scale_row(cols, out, 1.0f / sum);
    return;
  }
  const float shift = row_max + std::log(vector_math::exp_sum(cols, in, 1.0f, row_max, nullptr));
  for (int64_t j = 0; j < cols; ++j) out[j] = in[j] - shift;
}

// out = scale * in + mask (mask may be null), rounded after the mul and after the add as the
// separate ops round (no FMA), returning the row's maximum: the pass a separate mul and add
// would make, plus the maximum's.
MPIGRAD_AVX2 float scale_mask_row_avx2(int64_t cols, float* out, const float* in, float scale,
                                       const float* mask) {
  const __m256 s = _mm256_set1_ps(scale);
  __m256 m = _mm256_set1_ps(-__builtin_inff());
  int64_t j = 0;
  for (; j + 8 <= cols; j += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(in + j), s);
    if (mask != nullptr) v = _mm256_add_ps(v, _mm256_loadu_ps(mask + j));
    _mm256_storeu_ps(out + j, v);
    m = _mm256_max_ps(m, v);
  }
  float row_max = vector_math::max8(m);
  for (; j < cols; ++j) {
    out[j] = in[j] * scale;
    if (mask != nullptr) out[j] += mask[j];
    row_max = std::max(row_max, out[j]);
  }
  return row_max;
}

// forward_row_avx2 on scale * in + mask, written to out first; bit for bit the same softmax as
// on a separately computed input (the maximum of a row does not depend on the order).
MPIGRAD_AVX2 void forward_row_scale_mask_avx2(bool log, int64_t cols, float* out, const float* in,
                                              float scale, const float* mask) {
  const float row_max = scale_mask_row_avx2(cols, out, in, scale, mask);
  if (!log) {
    const float sum = vector_math::exp_sum(cols, out, 1.0f, row_max, out);
    vector_math::scale_row(cols, out, 1.0f / sum);
    return;
  }
  const float shift = row_max + std::log(vector_math::exp_sum(cols, out, 1.0f, row_max, nullptr));
  for (int64_t j = 0; j < cols; ++j) out[j] -= shift;
}

// backward_row's softmax formula in vector code: sum(g y) over 32 lanes (a dependency chain of
// fused multiply-adds in scalar code, its time), then y (g - sum), times the scale if not 1.
MPIGRAD_AVX2 void backward_row_avx2(int64_t cols, float* grad_in, const float* grad_out,
                                    const float* out, float scale) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t j = 0;
  for (; j + 32 <= cols; j += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(grad_out + j), _mm256_loadu_ps(out + j), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(grad_out + j + 8), _mm256_loadu_ps(out + j + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(grad_out + j + 16), _mm256_loadu_ps(out + j + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(grad_out + j + 24), _mm256_loadu_ps(out + j + 24), a3);
  }
  for (; j + 8 <= cols; j += 8) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(grad_out + j), _mm256_loadu_ps(out + j), a0);
  }
  if (j < cols) {
    a1 = _mm256_fmadd_ps(vector_math::load_tail(grad_out + j, cols - j, 0.0f),
                         vector_math::load_tail(out + j, cols - j, 0.0f), a1);
  }
  const float total =
      vector_math::sum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  const __m256 t = _mm256_set1_ps(total), s = _mm256_set1_ps(scale);
  const bool scaled = scale != 1.0f;
  for (j = 0; j + 8 <= cols; j += 8) {
    __m256 v =
        _mm256_mul_ps(_mm256_loadu_ps(out + j), _mm256_sub_ps(_mm256_loadu_ps(grad_out + j), t));
    if (scaled) v = _mm256_mul_ps(v, s);
    _mm256_storeu_ps(grad_in + j, v);
  }
  for (; j < cols; ++j) {
    grad_in[j] = out[j] * (grad_out[j] - total);
    if (scaled) grad_in[j] *= scale;
  }
}
#endif

// out may alias in (an in-place softmax): every pass reads in[j] before it writes out[j].
template <typename T>
void forward_row(bool log, int64_t cols, T* out, const T* in) {
  using Acc = acc_t<T>;
#if defined(MPIGRAD_HAS_AVX2_MATH)
  if constexpr (std::is_same_v<T, float>) {
    if (has_avx2_fma()) return forward_row_avx2(log, cols, out, in);
  }
#endif
  Acc row_max = -std::numeric_limits<Acc>::infinity();
  for (int64_t j = 0; j < cols; ++j) row_max = std::max(row_max, Acc(in[j]));

  Acc sum = 0;
  if (log) {
    for (int64_t j = 0; j < cols; ++j) sum += std::exp(Acc(in[j]) - row_max);
    const Acc shift = row_max + std::log(sum);
    for (int64_t j = 0; j < cols; ++j) out[j] = T(Acc(in[j]) - shift);
  } else if constexpr (std::is_same_v<T, Acc>) {
    // Full-precision storage: keep each exp in `out` so the second pass only scales.
    for (int64_t j = 0; j < cols; ++j) {
      const Acc e = std::exp(Acc(in[j]) - row_max);
      out[j] = e;
      sum += e;
    }
    const Acc inverse = Acc(1) / sum;
    for (int64_t j = 0; j < cols; ++j) out[j] *= inverse;
  } else {
    // 16-bit storage would round the exps before the division, so recompute them instead.
    for (int64_t j = 0; j < cols; ++j) sum += std::exp(Acc(in[j]) - row_max);
    const Acc inverse = Acc(1) / sum;
    for (int64_t j = 0; j < cols; ++j) out[j] = T(std::exp(Acc(in[j]) - row_max) * inverse);
  }
}

// out = scale * in + mask_row (mask_row may be null), rounded to T after each op as the
// separate mul and add would round.
template <typename T>
void scale_mask_row(int64_t cols, T* out, const T* in, T scale, const T* mask_row) {
  using Acc = acc_t<T>;
  if (mask_row == nullptr) {
    for (int64_t j = 0; j < cols; ++j) out[j] = T(Acc(in[j]) * Acc(scale));
  } else if (Acc(scale) == Acc(1)) {
    for (int64_t j = 0; j < cols; ++j) out[j] = T(Acc(in[j]) + Acc(mask_row[j]));
  } else {
    for (int64_t j = 0; j < cols; ++j) {
      out[j] = T(Acc(T(Acc(in[j]) * Acc(scale))) + Acc(mask_row[j]));
    }
  }
}

template <typename T>
void backward_row(bool log, int64_t cols, T* grad_in, const T* grad_out, const T* out, T scale) {
  using Acc = acc_t<T>;
#if defined(MPIGRAD_HAS_AVX2_MATH)
  if constexpr (std::is_same_v<T, float>) {
    if (!log && has_avx2_fma()) return backward_row_avx2(cols, grad_in, grad_out, out, scale);
  }
#endif
  Acc total = 0;
  if (log) {
    for (int64_t j = 0; j < cols; ++j) total += Acc(grad_out[j]);
    for (int64_t j = 0; j < cols; ++j) {
      grad_in[j] = T(Acc(grad_out[j]) - std::exp(Acc(out[j])) * total);
    }
  } else {
    for (int64_t j = 0; j < cols; ++j) total += Acc(grad_out[j]) * Acc(out[j]);
    for (int64_t j = 0; j < cols; ++j) grad_in[j] = T(Acc(out[j]) * (Acc(grad_out[j]) - total));
  }
  // The scale's own backward (a mul by the same constant), on the rounded gradient.
  if (Acc(scale) != Acc(1)) {
    for (int64_t j = 0; j < cols; ++j) grad_in[j] = T(Acc(grad_in[j]) * Acc(scale));
  }
}

template <typename RowFn>
void for_each_row(const char* kernel, DType dtype, int64_t rows, int64_t cols, RowFn row_fn) {
  if (rows < 0 || cols < 0) throw_invalid(kernel, "negative size");
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!is_floating_v<T>) {
      throw_unsupported(kernel, "", dtype);
    } else {
      if (rows == 0 || cols == 0) return;
      const int64_t grain = std::max<int64_t>(1, kSoftmaxGrain / cols);
      parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
        for (int64_t row = begin; row < end; ++row) row_fn(tag, row * cols);
      });
    }
  });
}

}  // namespace

void softmax_forward(bool log, DType dtype, int64_t rows, int64_t cols, void* out, const void* in,
                     const SoftmaxScaleMask& input) {
  if (input.mask != nullptr && (input.mask_inner < 1 || input.mask_repeat < 1)) {
    throw_invalid("softmax_forward", "mask_inner and mask_repeat must be at least 1");
  }
  for_each_row("softmax_forward", dtype, rows, cols, [&](auto tag, int64_t offset) {
    using T = decltype(tag);
    T* y = static_cast<T*>(out) + offset;
    const T* x = static_cast<const T*>(in) + offset;
    if (input.identity()) return forward_row<T>(log, cols, y, x);
    // The scaled, masked row is written into `out` and the softmax runs on it in place, so the
    // scores a separate mul and add would write are never written.
    const T* mask_row = nullptr;
    if (input.mask != nullptr) {
      const int64_t row = offset / cols, inner = input.mask_inner;
      const int64_t mask_index = row / (inner * input.mask_repeat) * inner + row % inner;
      mask_row = static_cast<const T*>(input.mask) + mask_index * cols;
    }
#if defined(MPIGRAD_HAS_AVX2_MATH)
    if constexpr (std::is_same_v<T, float>) {
      if (has_avx2_fma()) {
        return forward_row_scale_mask_avx2(log, cols, y, x, float(input.scale), mask_row);
      }
    }
#endif
    scale_mask_row<T>(cols, y, x, T(input.scale), mask_row);
    forward_row<T>(log, cols, y, y);
  });
}

void softmax_backward(bool log, DType dtype, int64_t rows, int64_t cols, void* grad_in,
                      const void* grad_out, const void* out, double scale) {
  for_each_row("softmax_backward", dtype, rows, cols, [&](auto tag, int64_t offset) {
    using T = decltype(tag);
    backward_row<T>(log, cols, static_cast<T*>(grad_in) + offset,
                    static_cast<const T*>(grad_out) + offset, static_cast<const T*>(out) + offset,
                    T(scale));
  });
}

}  // namespace mpigrad::kernels::cpu
