// CPU layer norm, forward and backward, on dense [rows, cols], each row normalized.
// Threading: rows spread over threads for the forward and grad_x, blocks of columns for
// grad_weight/grad_bias; no result depends on the thread count. Sums are accumulated in double.
// (Batch norm is normalization.cpp's.)
#include <algorithm>
#include <array>
#include <cmath>

#include "mpigrad/kernels/cpu/normalization_lanes.h"
#include "mpigrad/kernels/cpu/parallel.h"
#include "mpigrad/kernels/cpu/scalar.h"
#include "mpigrad/kernels/normalization.h"

namespace mpigrad::kernels::cpu {
namespace {

// x[i] scaled and shifted per column: out[j] = T(v(j) * weight[j] + bias[j]) with either
// affine vector possibly absent, each case its own loop so that it vectorizes.
template <typename T, typename Value>
void affine_row(int64_t cols, const T* weight, const T* bias, T* out, Value v) {
  if (weight && bias) {
    for (int64_t j = 0; j < cols; ++j) out[j] = T(v(j) * double(weight[j]) + double(bias[j]));
  } else if (weight) {
    for (int64_t j = 0; j < cols; ++j) out[j] = T(v(j) * double(weight[j]));
  } else if (bias) {
    for (int64_t j = 0; j < cols; ++j) out[j] = T(v(j) + double(bias[j]));
  } else {
    for (int64_t j = 0; j < cols; ++j) out[j] = T(v(j));
  }
}

// Each row's sums in kLanes lanes (add_lanes), as batch norm's: a transformer's rows of 768
// columns were one dependent chain of double additions each.
template <typename T>
void ln_forward(int64_t rows, int64_t cols, double eps, const T* x, const T* weight, const T* bias,
                T* y, T* mean, T* rstd) {
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols));
  parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* in = x + r * cols;
      LaneSums total[1];
      add_lanes(cols, total, [in](int64_t j) { return std::array<double, 1>{double(in[j])}; });
      const double m = total[0].total() / double(cols);
      LaneSums squares[1];
      add_lanes(cols, squares, [in, m](int64_t j) {
        const double d = double(in[j]) - m;
        return std::array<double, 1>{d * d};
      });
      const double s = 1.0 / std::sqrt(squares[0].total() / double(cols) + eps);
      affine_row(cols, weight, bias, y + r * cols,
                 [in, m, s](int64_t j) { return (double(in[j]) - m) * s; });
      mean[r] = T(m);
      rstd[r] = T(s);
    }
  });
}

// Columns per block of the weight and bias gradients: each block walks the rows in order, a
// contiguous run of each row at a time, instead of one column down all the rows (a stride of a
// whole row per element).
constexpr int64_t kLayerNormColumnBlock = 64;

template <typename T>
void ln_backward(int64_t rows, int64_t cols, const T* x, const T* grad_y, const T* mean,
                 const T* rstd, const T* weight, T* grad_x, T* grad_weight, T* grad_bias) {
  if (grad_x) {
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols));
    parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* in = x + r * cols;
        const T* dy = grad_y + r * cols;
        const double m = double(mean[r]), s = double(rstd[r]);
        LaneSums sums[2];
        add_lanes(cols, sums, [in, dy, weight, m, s](int64_t j) {
          const double g = double(dy[j]) * (weight ? double(weight[j]) : 1.0);
          return std::array<double, 2>{g, g * (double(in[j]) - m) * s};
        });
        const double mean_g = sums[0].total() / double(cols);
        const double mean_g_xhat = sums[1].total() / double(cols);
        // dx = s (g - mean_g - xhat mean_g_xhat), g = dy w, xhat = (x - m) s: per row
        // dx = s w dy + b x + k, with b = -s^2 mean_g_xhat and k = -s mean_g - b m.
        const double b = -s * s * mean_g_xhat, k = -s * mean_g - b * m;
        T* dx = grad_x + r * cols;
        if (weight) {
          for (int64_t j = 0; j < cols; ++j) {
            dx[j] = T(s * double(weight[j]) * double(dy[j]) + b * double(in[j]) + k);
          }
        } else {
          for (int64_t j = 0; j < cols; ++j) dx[j] = T(s * double(dy[j]) + b * double(in[j]) + k);
        }
      }
    });
  }
  if (grad_weight || grad_bias) {
    // Each column's sums run over the rows in order, whatever the blocks and threads.
    const int64_t blocks = (cols + kLayerNormColumnBlock - 1) / kLayerNormColumnBlock;
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, rows * 64));
    parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
      for (int64_t block = begin; block < end; ++block) {
        const int64_t first = block * kLayerNormColumnBlock;
        const int64_t width = std::min(kLayerNormColumnBlock, cols - first);
        double sum_w[kLayerNormColumnBlock] = {}, sum_b[kLayerNormColumnBlock] = {};
        for (int64_t r = 0; r < rows; ++r) {
          const T* dy = grad_y + r * cols + first;
          const T* in = x + r * cols + first;
          const double m = double(mean[r]), s = double(rstd[r]);
          for (int64_t j = 0; j < width; ++j) {
            sum_w[j] += double(dy[j]) * ((double(in[j]) - m) * s);
            sum_b[j] += double(dy[j]);
          }
        }
        for (int64_t j = 0; j < width; ++j) {
          if (grad_weight) grad_weight[first + j] = T(sum_w[j]);
          if (grad_bias) grad_bias[first + j] = T(sum_b[j]);
        }
      }
    });
  }
}

}  // namespace

void layer_norm_forward(DType dtype, int64_t rows, int64_t cols, double eps, const void* x,
                        const void* weight, const void* bias, void* y, void* mean, void* rstd) {
  MPIGRAD_NORM_DISPATCH(
      "layer_norm_forward",
      ln_forward(rows, cols, eps, static_cast<const T*>(x), static_cast<const T*>(weight),
                 static_cast<const T*>(bias), static_cast<T*>(y), static_cast<T*>(mean),
                 static_cast<T*>(rstd)))
}

void layer_norm_backward(DType dtype, int64_t rows, int64_t cols, const void* x, const void* grad_y,
                         const void* mean, const void* rstd, const void* weight, void* grad_x,
                         void* grad_weight, void* grad_bias) {
  MPIGRAD_NORM_DISPATCH(
      "layer_norm_backward",
      ln_backward(rows, cols, static_cast<const T*>(x), static_cast<const T*>(grad_y),
                  static_cast<const T*>(mean), static_cast<const T*>(rstd),
                  static_cast<const T*>(weight), static_cast<T*>(grad_x),
                  static_cast<T*>(grad_weight), static_cast<T*>(grad_bias)))
}

}  // namespace mpigrad::kernels::cpu
