// CPU fused cross-entropy: log-softmax, NLL and the gradient, row by row.
//
// Layout: dense [rows, cols] logits, Int64 targets [rows]; losses [rows] (Float32, or Float64
// for Float64 logits) and grad [rows, cols] are written with `=`.
// Threading: rows are spread over OpenMP threads; a row is always handled by one thread, so the
// results do not depend on the thread count.
// Precision: float for Float32, Float16 and BFloat16 (double for Float64), as in softmax.cpp.
// Float32 rows run in AVX2 where the CPU has it (kernels/cpu/vector_math.h): one pass for the
// maximum, one that writes exp(x - max) into the gradient row while summing it, one that scales
// it; a row of GPT-2's 50,257 logits is 200 KB, so the three passes stay in L2.
#include "mpigrad/kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include "mpigrad/kernels/cpu/parallel.h"
#include "mpigrad/kernels/cpu/scalar.h"
#include "mpigrad/kernels/cpu/vector_math.h"

namespace mpigrad::kernels::cpu {
namespace {

constexpr int64_t kCrossEntropyGrain = 8192;

template <typename T>
void cross_entropy_row(int64_t cols, const T* x, int64_t target, int64_t ignore_index,
                       acc_t<T> scale, acc_t<T>* loss, T* grad) {
  using Acc = acc_t<T>;
  if (target == ignore_index) {
    *loss = Acc(0);
    if (grad != nullptr) std::fill(grad, grad + cols, T(Acc(0)));
    return;
  }
  Acc row_max = -std::numeric_limits<Acc>::infinity();
  for (int64_t j = 0; j < cols; ++j) row_max = std::max(row_max, Acc(x[j]));
  Acc sum = 0;
  for (int64_t j = 0; j < cols; ++j) sum += std::exp(Acc(x[j]) - row_max);
  *loss = row_max + std::log(sum) - Acc(x[target]);
  if (grad == nullptr) return;
  const Acc inverse = Acc(1) / sum;
  for (int64_t j = 0; j < cols; ++j) {
    const Acc p = std::exp(Acc(x[j]) - row_max) * inverse;
    grad[j] = T(scale * (p - (j == target ? Acc(1) : Acc(0))));
  }
}

#if defined(MPIGRAD_HAS_AVX2_MATH)
// The Float32 row of cross_entropy_row in vector code: the same formulas, exp in exp8.
MPIGRAD_AVX2 void cross_entropy_row_avx2(int64_t cols, const float* x, int64_t target,
                                         int64_t ignore_index, float scale, float* loss,
                                         float* grad) {
  if (target == ignore_index) {
    *loss = 0.0f;
    if (grad != nullptr) std::fill(grad, grad + cols, 0.0f);
    return;
  }
  const float row_max = vector_math::row_max(cols, x);
  const float sum = vector_math::exp_sum(cols, x, 1.0f, row_max, grad);
  *loss = row_max + std::log(sum) - x[target];
  if (grad == nullptr) return;
  vector_math::scale_row(cols, grad, scale / sum);
  grad[target] -= scale;
}
#endif

}  // namespace

int64_t cross_entropy(DType dtype, int64_t rows, int64_t cols, const void* logits,
                      const int64_t* targets, int64_t ignore_index, double grad_scale, void* losses,
                      void* grad) {
  if (rows < 0 || cols < 0) throw_invalid("cross_entropy", "negative size");
  if (!(dtype == DType::Float32 || dtype == DType::Float64 || dtype == DType::BFloat16 ||
        dtype == DType::Float16)) {
    throw_unsupported("cross_entropy", "", dtype);
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] != ignore_index && uint64_t(targets[r]) >= uint64_t(cols)) return r;
  }
  if (rows == 0) return -1;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (is_floating_v<T>) {
      using Acc = acc_t<T>;
      const T* x = static_cast<const T*>(logits);
      Acc* loss = static_cast<Acc*>(losses);
      T* g = static_cast<T*>(grad);
      const int64_t grain = std::max<int64_t>(1, kCrossEntropyGrain / std::max<int64_t>(cols, 1));
#if defined(MPIGRAD_HAS_AVX2_MATH)
      if constexpr (std::is_same_v<T, float>) {
        if (has_avx2_fma()) {
          parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
            for (int64_t r = begin; r < end; ++r) {
              cross_entropy_row_avx2(cols, x + r * cols, targets[r], ignore_index,
                                     float(grad_scale), loss + r,
                                     g == nullptr ? nullptr : g + r * cols);
            }
          });
          return;
        }
      }
#endif
      parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          cross_entropy_row<T>(cols, x + r * cols, targets[r], ignore_index, Acc(grad_scale),
                               loss + r, g == nullptr ? nullptr : g + r * cols);
        }
      });
    }
  });
  return -1;
}

}  // namespace mpigrad::kernels::cpu
