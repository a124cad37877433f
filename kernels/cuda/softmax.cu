// CUDA softmax and log_softmax, forward and backward, row by row.
//
// Layout: dense [rows, cols]; each row is independent. Both directions write with `=`.
// Thread mapping: one warp per row for rows of up to kWarpRowMax columns (kRowsPerBlock rows per
// block), one block of kRowThreads threads per longer row (see row_reduce.cuh).
// Forward is the online formulation: one read of the row gives its maximum m and the sum s of
// exp(x - m) together; then exp(x - m) / s or x - m - log(s) is written. A warp keeps its row in
// registers, so the row is read once; a block reads its (long) row a second time, which mostly
// hits L1/L2, so a row costs close to one read and one write of DRAM either way.
// Precision: Float64 accumulates in double; Float32, Float16 and BFloat16 in float, as on the CPU.
// out may alias in: every element is read before it is written, by the same thread. Forward may
// read scale * in + mask (kernels/softmax.h, SoftmaxScaleMask), and backward then multiplies by
// the scale.
#include <type_traits>

#include "mpigrad/kernels/cuda/common.cuh"
#include "mpigrad/kernels/cuda/row_reduce.cuh"
#include "mpigrad/kernels/softmax.h"

namespace mpigrad::kernels::cuda {
namespace {

using detail::as_stream;

template <bool kWarpPerRow, typename T>
__global__ void softmax_forward_kernel(bool log, int64_t rows, int64_t cols, T* out, const T* in,
                                       SoftmaxScaleMask input) {
  using Acc = acc_t<T>;
  const detail::RowGroup group = detail::row_group<kWarpPerRow>(blockIdx.x);
  const bool valid = group.row < rows;
  const T* x = in + (valid ? group.row : 0) * cols;
  T* y = out + (valid ? group.row : 0) * cols;
  // scale * x + mask, rounded to T after each op as the separate mul and add round.
  const T* mask = nullptr;
  if (input.mask != nullptr) {
    const int64_t row = valid ? group.row : 0, inner = input.mask_inner;
    mask = static_cast<const T*>(input.mask) +
           (row / (inner * input.mask_repeat) * inner + row % inner) * cols;
  }
  const Acc scale = Acc(T(Acc(input.scale)));
  const bool scaled = input.scale != 1.0;
  auto load = [&](int64_t j) -> Acc {
    Acc v = scaled ? Acc(T(Acc(x[j]) * scale)) : Acc(x[j]);
    return mask != nullptr ? Acc(T(v + Acc(mask[j]))) : v;
  };

  detail::MaxSum<Acc> ms = detail::online_init<Acc>();
  if constexpr (kWarpPerRow) {
    // The whole row fits in the warp's registers (32 values a thread): every load is issued
    // before any arithmetic, and the row is read from memory once.
    constexpr int kPerThread = detail::kWarpRowMax / 32;
    Acc cache[kPerThread];
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int64_t j = group.lane + 32 * k;
      cache[k] = valid && j < cols ? load(j) : Acc(0);
    }
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      if (valid && group.lane + 32 * k < cols) detail::online_add(ms, cache[k]);
    }
    ms = detail::warp_merge(ms);
    if (!valid) return;
    const Acc shift = log ? ms.max + detail::m_log(ms.sum) : ms.max;
    const Acc inverse = Acc(1) / ms.sum;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int64_t j = group.lane + 32 * k;
      if (j < cols) {
        y[j] = log ? T(cache[k] - shift) : T(detail::m_exp(cache[k] - shift) * inverse);
      }
    }
    return;
  }
  if (valid) {
    for (int64_t j = group.lane; j < cols; j += group.threads) detail::online_add(ms, load(j));
  }
  ms = detail::group_merge<kWarpPerRow>(ms);
  if (!valid) return;
  if (log) {
    const Acc shift = ms.max + detail::m_log(ms.sum);
    for (int64_t j = group.lane; j < cols; j += group.threads) y[j] = T(load(j) - shift);
  } else {
    const Acc inverse = Acc(1) / ms.sum;
    for (int64_t j = group.lane; j < cols; j += group.threads) {
      y[j] = T(detail::m_exp(load(j) - ms.max) * inverse);
    }
  }
}

template <bool kWarpPerRow, typename T>
__global__ void softmax_backward_kernel(bool log, int64_t rows, int64_t cols, T* grad_in,
                                        const T* grad_out, const T* out, double scale) {
  using Acc = acc_t<T>;
  const detail::RowGroup group = detail::row_group<kWarpPerRow>(blockIdx.x);
  const bool valid = group.row < rows;
  const int64_t base = (valid ? group.row : 0) * cols;
  const T* g = grad_out + base;
  const T* y = out + base;
  T* gi = grad_in + base;

  Acc total = 0;
  if (valid) {
    for (int64_t j = group.lane; j < cols; j += group.threads) {
      total += log ? Acc(g[j]) : Acc(g[j]) * Acc(y[j]);
    }
  }
  total = detail::group_sum<kWarpPerRow>(total);
  if (!valid) return;
  const Acc factor = Acc(T(Acc(scale)));
  for (int64_t j = group.lane; j < cols; j += group.threads) {
    const T value =
        log ? T(Acc(g[j]) - detail::m_exp(Acc(y[j])) * total) : T(Acc(y[j]) * (Acc(g[j]) - total));
    gi[j] = scale != 1.0 ? T(Acc(value) * factor) : value;  // the scale's mul, after rounding
  }
}

bool check(const char* kernel, DType dtype, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) detail::throw_invalid(kernel, "negative size");
  if (dtype != DType::Float32 && dtype != DType::Float64 && dtype != DType::BFloat16 &&
      dtype != DType::Float16) {
    detail::throw_unsupported(kernel, "", dtype);
  }
  if (detail::row_blocks(cols <= detail::kWarpRowMax, rows) > int64_t(0x7fffffff)) {
    detail::throw_invalid(kernel, "too many rows for one launch");
  }
  return rows > 0 && cols > 0;
}

template <typename Launch>
void dispatch_float(DType dtype, Launch launch) {
  detail::visit(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (is_floating_v<T>) launch(tag);
  });
}

}  // namespace

void softmax_forward(bool log, DType dtype, int64_t rows, int64_t cols, void* out, const void* in,
                     const SoftmaxScaleMask& input, void* stream) {
  if (!check("softmax_forward", dtype, rows, cols)) return;
  cudaStream_t s = as_stream(stream);
  dispatch_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (cols <= detail::kWarpRowMax) {
      const unsigned grid = unsigned(detail::row_blocks(true, rows));
      softmax_forward_kernel<true, T><<<grid, 32 * detail::kRowsPerBlock, 0, s>>>(
          log, rows, cols, static_cast<T*>(out), static_cast<const T*>(in), input);
    } else {
      softmax_forward_kernel<false, T><<<unsigned(rows), detail::kRowThreads, 0, s>>>(
          log, rows, cols, static_cast<T*>(out), static_cast<const T*>(in), input);
    }
  });
  detail::check_launch("softmax_forward", stream);
}

void softmax_backward(bool log, DType dtype, int64_t rows, int64_t cols, void* grad_in,
                      const void* grad_out, const void* out, double scale, void* stream) {
  if (!check("softmax_backward", dtype, rows, cols)) return;
  cudaStream_t s = as_stream(stream);
  dispatch_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (cols <= detail::kWarpRowMax) {
      const unsigned grid = unsigned(detail::row_blocks(true, rows));
      softmax_backward_kernel<true, T><<<grid, 32 * detail::kRowsPerBlock, 0, s>>>(
          log, rows, cols, static_cast<T*>(grad_in), static_cast<const T*>(grad_out),
          static_cast<const T*>(out), scale);
    } else {
      softmax_backward_kernel<false, T><<<unsigned(rows), detail::kRowThreads, 0, s>>>(
          log, rows, cols, static_cast<T*>(grad_in), static_cast<const T*>(grad_out),
          static_cast<const T*>(out), scale);
    }
  });
  detail::check_launch("softmax_backward", stream);
}

}  // namespace mpigrad::kernels::cuda
