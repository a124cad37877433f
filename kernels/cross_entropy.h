// defines: cross_entropy (fused log-softmax, negative log-likelihood and its gradient)
//
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
// Returns the position of the first target outside [0, cols) that is not ignore_index, or -1;
// with a bad target nothing is written.
#pragma once

#include <cstdint>

#include "mpigrad/kernels/dtype.h"
#include "mpigrad/kernels/index.h"

namespace mpigrad::kernels {
namespace cpu {

int64_t cross_entropy(DType dtype, int64_t rows, int64_t cols, const void* logits,
                      const int64_t* targets, int64_t ignore_index, double grad_scale,
                      void* losses, void* grad);

}  // namespace cpu

// The same on a CUDA device, queued on `stream`. Checking the targets needs a device scratch of
// cuda::kIndexCheckBytes (`workspace`) and waits for the stream, so the bad position can be
// returned before anything is written.
namespace cuda {

int64_t cross_entropy(DType dtype, int64_t rows, int64_t cols, const void* logits,
                      const int64_t* targets, int64_t ignore_index, double grad_scale,
                      void* losses, void* grad, void* workspace, void* stream);

}  // namespace cuda
}  // namespace mpigrad::kernels
