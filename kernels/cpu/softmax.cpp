// CPU softmax and log_softmax, forward and backward, row by row.
//
// Layout: dense [rows, cols]; each row is independent. Both directions write with `=`.
// Threading: rows are spread over OpenMP threads; one row is always handled by one thread, so
// the results do not depend on the thread count.
// Precision: Float64 accumulates in double; Float32, Float16 and BFloat16 compute and
// accumulate in float. Forward subtracts the row maximum, so exp never overflows.
// Float32 forward rows run in AVX2 where the CPU has it (kernels/cpu/vector_math.h): attention's
// softmax over [batch, heads, T, T] scores is all exp.
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

template <typename T>
void backward_row(bool log, int64_t cols, T* grad_in, const T* grad_out, const T* out) {
  using Acc = acc_t<T>;
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

void softmax_forward(bool log, DType dtype, int64_t rows, int64_t cols, void* out, const void* in) {
  for_each_row("softmax_forward", dtype, rows, cols, [&](auto tag, int64_t offset) {
    using T = decltype(tag);
    forward_row<T>(log, cols, static_cast<T*>(out) + offset, static_cast<const T*>(in) + offset);
  });
}

void softmax_backward(bool log, DType dtype, int64_t rows, int64_t cols, void* grad_in,
                      const void* grad_out, const void* out) {
  for_each_row("softmax_backward", dtype, rows, cols, [&](auto tag, int64_t offset) {
    using T = decltype(tag);
    backward_row<T>(log, cols, static_cast<T*>(grad_in) + offset,
                    static_cast<const T*>(grad_out) + offset, static_cast<const T*>(out) + offset);
  });
}

}  // namespace mpigrad::kernels::cpu
