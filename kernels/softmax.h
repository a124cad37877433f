// Row-wise over a dense [rows, cols] buffer: core/ moves the softmax axis last first. Forward is
// numerically stable (the row maximum is subtracted). Both write with `=`.
#pragma once

#include <cstdint>

#include "mpigrad/kernels/dtype.h"

namespace mpigrad::kernels {
namespace cpu {

// out = softmax(in) or log_softmax(in) along each row. Float types only.
void softmax_forward(bool log, DType dtype, int64_t rows, int64_t cols, void* out, const void* in);

// grad_in from grad_out and the forward result `out`:
//   softmax:     grad_in = out * (grad_out - sum(grad_out * out))
//   log_softmax: grad_in = grad_out - exp(out) * sum(grad_out)
void softmax_backward(bool log, DType dtype, int64_t rows, int64_t cols, void* grad_in,
                      const void* grad_out, const void* out);

}  // namespace cpu

// The same on a CUDA device, queued on `stream`: one warp per row up to 1024 columns, one block
// per longer row, with the online (running max and sum) formulation.
namespace cuda {

void softmax_forward(bool log, DType dtype, int64_t rows, int64_t cols, void* out, const void* in,
                     void* stream);
void softmax_backward(bool log, DType dtype, int64_t rows, int64_t cols, void* grad_in,
                      const void* grad_out, const void* out, void* stream);

}  // namespace cuda
}  // namespace mpigrad::kernels
