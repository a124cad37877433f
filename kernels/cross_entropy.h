// One pass over each row of dense [rows, cols] logits with Int64 class targets [rows]:
//   loss[r]    = logsumexp(logits[r, :]) - logits[r, target[r]]
//   grad[r, j] = grad_scale * (softmax(logits[r, :])[j] - (j == target[r] ? 1 : 0))
// which is what log_softmax followed by nll_loss and their backward compute, without writing
// the [rows, cols] log-probabilities in between. grad_scale carries the loss reduction (1 for a
// sum, 1 / number of counted rows for a mean) and the incoming gradient.
// Rows whose target equals ignore_index get loss 0 and a zero gradient row.
// Outputs: `losses`, dense [rows] in Float32 (Float64 when the logits are Float64), and `grad`
// (may be null for a forward-only call) in the logits' dtype and shape; both written with `=`.
// Logits may be Float32, Float64, BFloat16 or Float16; the math runs in float (double for
// Float64), like softmax.
// The CPU kernel returns the position of the first target outside [0, cols) that is not
// ignore_index, or -1; with a bad target nothing is written. The CUDA kernel cannot return it
// without making the host wait, so it reports it through device memory instead (below).
#pragma once

#include <cstdint>

#include "mpigrad/kernels/dtype.h"

namespace mpigrad::kernels {
namespace cpu {

int64_t cross_entropy(DType dtype, int64_t rows, int64_t cols, const void* logits,
                      const int64_t* targets, int64_t ignore_index, double grad_scale, void* losses,
                      void* grad);

}  // namespace cpu

// The same on a CUDA device, queued on `stream`, and never waiting for it: the targets are
// checked inside the kernel. A row whose target is bad gets a NaN loss and a NaN gradient row,
// and lowers *bad_target (device memory that the caller set to kNoBadTarget before the launch)
// atomically to encode_bad_target(row, target), so that after the kernel it holds the first bad
// row and its target, to be copied back whenever the caller chooses (core/device_checks.h).
namespace cuda {

inline constexpr uint64_t kNoBadTarget = ~uint64_t(0);  // all bytes 0xff: one cudaMemsetAsync

// The row in the high 32 bits (so the smallest code is the first row), the target in the low 32,
// clamped to the int32 range (a target that far out is reported at the bound).
MPIGRAD_HOST_DEVICE constexpr uint64_t encode_bad_target(int64_t row, int64_t target) {
  const int64_t clamped = target < INT32_MIN ? INT32_MIN : target > INT32_MAX ? INT32_MAX : target;
  return (uint64_t(row) << 32) | uint64_t(uint32_t(int32_t(clamped)));
}
constexpr int64_t bad_target_row(uint64_t code) {
  return int64_t(code >> 32);
}
constexpr int64_t bad_target_value(uint64_t code) {
  return int64_t(int32_t(uint32_t(code & 0xffffffffu)));
}

void cross_entropy(DType dtype, int64_t rows, int64_t cols, const void* logits,
                   const int64_t* targets, int64_t ignore_index, double grad_scale, void* losses,
                   void* grad, uint64_t* bad_target, void* stream);

}  // namespace cuda
}  // namespace mpigrad::kernels
