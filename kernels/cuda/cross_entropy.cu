// CUDA fused cross-entropy: log-softmax, NLL and the gradient in one kernel, row by row.
//
// Layout: dense [rows, cols] logits, Int64 targets [rows]; losses [rows] (float, double for
// Float64 logits) and grad [rows, cols] are written with `=`.
// Thread mapping: one warp per row up to kWarpRowMax columns, else one block per row (see
// row_reduce.cuh). One read of the row gives the online maximum and exp-sum; a second read
// (mostly from L1/L2) writes the gradient, so the logits cross DRAM about once and the
// log-probabilities are never stored.
// Targets are checked by the kernel itself, so nothing waits for the stream: a row with a bad
// target writes NaN (loss and gradient, so a step that goes on with it cannot pass for a good
// one) and lowers the caller's bad_target code with one atomicMin, read back later.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "mpigrad/kernels/cross_entropy.h"
#include "mpigrad/kernels/cuda/common.cuh"
#include "mpigrad/kernels/cuda/row_reduce.cuh"

namespace mpigrad::kernels::cuda {
namespace {

using detail::as_stream;

template <bool kWarpPerRow, typename T>
__global__ void cross_entropy_kernel(int64_t rows, int64_t cols, const T* logits,
                                     const int64_t* targets, int64_t ignore_index, acc_t<T> scale,
                                     acc_t<T>* losses, T* grad, unsigned long long* bad_target) {
  using Acc = acc_t<T>;
  const detail::RowGroup group = detail::row_group<kWarpPerRow>(blockIdx.x);
  const bool valid = group.row < rows;
  const int64_t target = valid ? targets[group.row] : ignore_index;
  const bool ignored = target == ignore_index;
  const bool bad = !ignored && (target < 0 || target >= cols);
  const T* x = logits + (valid ? group.row : 0) * cols;

  detail::MaxSum<Acc> ms = detail::online_init<Acc>();
  if (valid && !ignored && !bad) {
    for (int64_t j = group.lane; j < cols; j += group.threads) detail::online_add(ms, Acc(x[j]));
  }
  // Every thread of the group takes part: in block mode the merge synchronizes the block.
  ms = detail::group_merge<kWarpPerRow>(ms);
  if (!valid) return;
  T* g = grad == nullptr ? nullptr : grad + group.row * cols;
  if (ignored || bad) {
    const Acc fill = bad ? Acc(NAN) : Acc(0);
    if (group.lane == 0) {
      losses[group.row] = fill;
      if (bad) atomicMin(bad_target, (unsigned long long)encode_bad_target(group.row, target));
    }
    if (g != nullptr) {
      for (int64_t j = group.lane; j < cols; j += group.threads) g[j] = T(fill);
    }
    return;
  }
  if (group.lane == 0) losses[group.row] = ms.max + detail::m_log(ms.sum) - Acc(x[target]);
  if (g == nullptr) return;
  const Acc inverse = Acc(1) / ms.sum;
  for (int64_t j = group.lane; j < cols; j += group.threads) {
    const Acc p = detail::m_exp(Acc(x[j]) - ms.max) * inverse;
    g[j] = T(scale * (p - (j == target ? Acc(1) : Acc(0))));
  }
}

}  // namespace

void cross_entropy(DType dtype, int64_t rows, int64_t cols, const void* logits,
                   const int64_t* targets, int64_t ignore_index, double grad_scale, void* losses,
                   void* grad, uint64_t* bad_target, void* stream) {
  static_assert(sizeof(unsigned long long) == sizeof(uint64_t));
  if (rows < 0 || cols < 0) detail::throw_invalid("cross_entropy", "negative size");
  if (!(dtype == DType::Float32 || dtype == DType::Float64 || dtype == DType::BFloat16 ||
        dtype == DType::Float16)) {
    detail::throw_unsupported("cross_entropy", "", dtype);
  }
  if (bad_target == nullptr) detail::throw_invalid("cross_entropy", "no bad_target code");
  if (rows == 0) return;
  if (rows > int64_t(INT32_MAX)) detail::throw_invalid("cross_entropy", "too many rows");
  const bool warp_per_row = cols <= detail::kWarpRowMax;
  if (detail::row_blocks(warp_per_row, rows) > int64_t(0x7fffffff)) {
    detail::throw_invalid("cross_entropy", "too many rows for one launch");
  }
  cudaStream_t s = as_stream(stream);
  auto* code = reinterpret_cast<unsigned long long*>(bad_target);
  detail::visit(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (is_floating_v<T>) {
      using Acc = acc_t<T>;
      const auto* x = static_cast<const T*>(logits);
      auto* loss = static_cast<Acc*>(losses);
      auto* g = static_cast<T*>(grad);
      if (warp_per_row) {
        cross_entropy_kernel<true, T>
            <<<unsigned(detail::row_blocks(true, rows)), 32 * detail::kRowsPerBlock, 0, s>>>(
                rows, cols, x, targets, ignore_index, Acc(grad_scale), loss, g, code);
      } else {
        cross_entropy_kernel<false, T><<<unsigned(rows), detail::kRowThreads, 0, s>>>(
            rows, cols, x, targets, ignore_index, Acc(grad_scale), loss, g, code);
      }
    }
  });
  detail::check_launch("cross_entropy", stream);
}

}  // namespace mpigrad::kernels::cuda
