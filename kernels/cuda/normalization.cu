// CUDA layer norm, forward and backward (batch norm on CUDA is cuDNN's: core/cuda/cudnn_*).
//
// Layout: dense [rows, cols] x, y, grad_y, grad_x; weight, bias, grad_weight, grad_bias are
// [cols]; mean and rstd are [rows]. Every output is written with `=` (nothing accumulates).
// Thread mapping, forward and grad_x: one warp per row for rows of up to kWarpRowMax columns
// (kRowsPerBlock rows per block), else one block of kRowThreads threads per row (row_reduce.cuh).
// Each row is read twice for the statistics (sum, then the centred sum of squares, which is
// exact where E[x^2] - E[x]^2 cancels) and once more for the output; the re-reads hit L1/L2.
// grad_weight / grad_bias are column sums over rows: a separate kernel gives each block a tile
// of 32 columns, its 32 x 8 threads walk the rows 8 at a time (reads coalesced along the row)
// and the 8 partial sums of a column are added in shared memory.
// Precision: float accumulators for Float32, double for Float64 (the CPU uses double for both,
// so Float32 results agree to rounding, not bitwise).
#include <type_traits>

#include "mpigrad/kernels/cuda/common.cuh"
#include "mpigrad/kernels/cuda/row_reduce.cuh"
#include "mpigrad/kernels/normalization.h"

namespace mpigrad::kernels::cuda {
namespace {

using detail::as_stream;

template <bool kWarpPerRow, typename T>
__global__ void layer_norm_forward_kernel(int64_t rows, int64_t cols, acc_t<T> eps, const T* x,
                                          const T* weight, const T* bias, T* y, T* mean, T* rstd) {
  using Acc = acc_t<T>;
  const detail::RowGroup group = detail::row_group<kWarpPerRow>(blockIdx.x);
  const bool valid = group.row < rows;
  const T* xr = x + (valid ? group.row : 0) * cols;
  // Spare warps of the last block run the reductions with no columns (see RowGroup).
  const int64_t end = valid ? cols : 0;
  Acc sum = Acc(0);
  for (int64_t j = group.lane; j < end; j += group.threads) sum += Acc(xr[j]);
  const Acc mu = detail::group_sum<kWarpPerRow>(sum) / Acc(cols);
  Acc squares = Acc(0);
  for (int64_t j = group.lane; j < end; j += group.threads) {
    const Acc d = Acc(xr[j]) - mu;
    squares += d * d;
  }
  const Acc variance = detail::group_sum<kWarpPerRow>(squares) / Acc(cols);
  const Acc r = Acc(1) / detail::m_sqrt(variance + eps);
  if (!valid) return;
  if (group.lane == 0) {
    mean[group.row] = T(mu);
    rstd[group.row] = T(r);
  }
  T* yr = y + group.row * cols;
  for (int64_t j = group.lane; j < cols; j += group.threads) {
    Acc v = (Acc(xr[j]) - mu) * r;
    if (weight != nullptr) v *= Acc(weight[j]);
    if (bias != nullptr) v += Acc(bias[j]);
    yr[j] = T(v);
  }
}

// grad_x = rstd * (g - mean(g) - xhat * mean(g * xhat)), with g = grad_y * weight.
template <bool kWarpPerRow, typename T>
__global__ void layer_norm_grad_input_kernel(int64_t rows, int64_t cols, const T* x,
                                             const T* grad_y, const T* mean, const T* rstd,
                                             const T* weight, T* grad_x) {
  using Acc = acc_t<T>;
  const detail::RowGroup group = detail::row_group<kWarpPerRow>(blockIdx.x);
  const bool valid = group.row < rows;
  const int64_t offset = (valid ? group.row : 0) * cols;
  const T* xr = x + offset;
  const T* gr = grad_y + offset;
  const Acc mu = valid ? Acc(mean[group.row]) : Acc(0);
  const Acc r = valid ? Acc(rstd[group.row]) : Acc(0);
  const int64_t end = valid ? cols : 0;
  Acc sum_g = Acc(0), sum_gx = Acc(0);
  for (int64_t j = group.lane; j < end; j += group.threads) {
    const Acc g = Acc(gr[j]) * (weight != nullptr ? Acc(weight[j]) : Acc(1));
    sum_g += g;
    sum_gx += g * (Acc(xr[j]) - mu) * r;
  }
  const Acc mean_g = detail::group_sum<kWarpPerRow>(sum_g) / Acc(cols);
  const Acc mean_gx = detail::group_sum<kWarpPerRow>(sum_gx) / Acc(cols);
  if (!valid) return;
  T* out = grad_x + offset;
  for (int64_t j = group.lane; j < cols; j += group.threads) {
    const Acc g = Acc(gr[j]) * (weight != nullptr ? Acc(weight[j]) : Acc(1));
    const Acc xhat = (Acc(xr[j]) - mu) * r;
    out[j] = T(r * (g - mean_g - xhat * mean_gx));
  }
}

constexpr int kColumnTile = 32;  // columns per block (threadIdx.x)
constexpr int kRowLanes = 8;     // rows walked in parallel per block (threadIdx.y)

// grad_weight[j] = sum_r grad_y[r, j] * xhat[r, j]; grad_bias[j] = sum_r grad_y[r, j].
template <typename T>
__global__ void layer_norm_grad_params_kernel(int64_t rows, int64_t cols, const T* x,
                                              const T* grad_y, const T* mean, const T* rstd,
                                              T* grad_weight, T* grad_bias) {
  using Acc = acc_t<T>;
  __shared__ Acc partial_w[kRowLanes][kColumnTile];
  __shared__ Acc partial_b[kRowLanes][kColumnTile];
  const int64_t j = int64_t(blockIdx.x) * kColumnTile + threadIdx.x;
  Acc sum_w = Acc(0), sum_b = Acc(0);
  if (j < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += kRowLanes) {
      const Acc g = Acc(grad_y[r * cols + j]);
      sum_b += g;
      sum_w += g * (Acc(x[r * cols + j]) - Acc(mean[r])) * Acc(rstd[r]);
    }
  }
  partial_w[threadIdx.y][threadIdx.x] = sum_w;
  partial_b[threadIdx.y][threadIdx.x] = sum_b;
  __syncthreads();
  if (threadIdx.y != 0 || j >= cols) return;
  for (int k = 1; k < kRowLanes; ++k) {
    sum_w += partial_w[k][threadIdx.x];
    sum_b += partial_b[k][threadIdx.x];
  }
  if (grad_weight != nullptr) grad_weight[j] = T(sum_w);
  if (grad_bias != nullptr) grad_bias[j] = T(sum_b);
}

template <typename T>
void forward_typed(int64_t rows, int64_t cols, double eps, const void* x, const void* weight,
                   const void* bias, void* y, void* mean, void* rstd, void* stream) {
  const bool warp = cols <= detail::kWarpRowMax;
  const unsigned blocks = unsigned(detail::row_blocks(warp, rows));
  const auto args = [&](auto kernel, int threads) {
    kernel<<<blocks, threads, 0, as_stream(stream)>>>(
        rows, cols, acc_t<T>(eps), static_cast<const T*>(x), static_cast<const T*>(weight),
        static_cast<const T*>(bias), static_cast<T*>(y), static_cast<T*>(mean),
        static_cast<T*>(rstd));
  };
  if (warp) {
    args(layer_norm_forward_kernel<true, T>, 32 * detail::kRowsPerBlock);
  } else {
    args(layer_norm_forward_kernel<false, T>, detail::kRowThreads);
  }
}

template <typename T>
void backward_typed(int64_t rows, int64_t cols, const void* x, const void* grad_y, const void* mean,
                    const void* rstd, const void* weight, void* grad_x, void* grad_weight,
                    void* grad_bias, void* stream) {
  const T* xt = static_cast<const T*>(x);
  const T* gt = static_cast<const T*>(grad_y);
  const T* mt = static_cast<const T*>(mean);
  const T* rt = static_cast<const T*>(rstd);
  if (grad_x != nullptr && rows > 0) {
    const bool warp = cols <= detail::kWarpRowMax;
    const unsigned blocks = unsigned(detail::row_blocks(warp, rows));
    if (warp) {
      layer_norm_grad_input_kernel<true, T>
          <<<blocks, 32 * detail::kRowsPerBlock, 0, as_stream(stream)>>>(
              rows, cols, xt, gt, mt, rt, static_cast<const T*>(weight), static_cast<T*>(grad_x));
    } else {
      layer_norm_grad_input_kernel<false, T><<<blocks, detail::kRowThreads, 0, as_stream(stream)>>>(
          rows, cols, xt, gt, mt, rt, static_cast<const T*>(weight), static_cast<T*>(grad_x));
    }
  }
  if (grad_weight != nullptr || grad_bias != nullptr) {
    const unsigned blocks = unsigned((cols + kColumnTile - 1) / kColumnTile);
    layer_norm_grad_params_kernel<T>
        <<<blocks, dim3(kColumnTile, kRowLanes), 0, as_stream(stream)>>>(
            rows, cols, xt, gt, mt, rt, static_cast<T*>(grad_weight), static_cast<T*>(grad_bias));
  }
}

}  // namespace

void layer_norm_forward(DType dtype, int64_t rows, int64_t cols, double eps, const void* x,
                        const void* weight, const void* bias, void* y, void* mean, void* rstd,
                        void* stream) {
  if (rows <= 0 || cols <= 0) return;
  switch (dtype) {
    case DType::Float32:
      forward_typed<float>(rows, cols, eps, x, weight, bias, y, mean, rstd, stream);
      break;
    case DType::Float64:
      forward_typed<double>(rows, cols, eps, x, weight, bias, y, mean, rstd, stream);
      break;
    default:
      detail::throw_unsupported("layer_norm_forward", "", dtype);
  }
  detail::check_launch("layer_norm_forward", stream);
}

void layer_norm_backward(DType dtype, int64_t rows, int64_t cols, const void* x, const void* grad_y,
                         const void* mean, const void* rstd, const void* weight, void* grad_x,
                         void* grad_weight, void* grad_bias, void* stream) {
  // With no rows the parameter gradients are still written (as zeros) by the column kernel.
  if (rows < 0 || cols <= 0) return;
  switch (dtype) {
    case DType::Float32:
      backward_typed<float>(rows, cols, x, grad_y, mean, rstd, weight, grad_x, grad_weight,
                            grad_bias, stream);
      break;
    case DType::Float64:
      backward_typed<double>(rows, cols, x, grad_y, mean, rstd, weight, grad_x, grad_weight,
                             grad_bias, stream);
      break;
    default:
      detail::throw_unsupported("layer_norm_backward", "", dtype);
  }
  detail::check_launch("layer_norm_backward", stream);
}

}  // namespace mpigrad::kernels::cuda
