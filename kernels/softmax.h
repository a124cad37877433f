// Row-wise over a dense [rows, cols] buffer: core/ moves the softmax axis last first. Forward is
// numerically stable (the row maximum is subtracted). Both write with `=`.
#pragma once

#include <cstdint>

#include "mpigrad/kernels/dtype.h"

namespace mpigrad::kernels {

// What forward reads in place of `in`: scale * in + mask, each rounded to the dtype as separate
// ops would round them (attention's scaled, masked scores, fused so that they are never written
// out). `mask` (null: none) is a dense [mask rows, cols] buffer of the input's dtype; row r of
// the input reads mask row r / (inner * repeat) * inner + r % inner: [T, T] causal masks (inner
// T, repeat all), [B, 1, T, T] ones over [B, H, T, T] scores (inner T, repeat H), [B, 1, 1, T]
// padding masks (inner 1, repeat H * T). The default is the input itself.
struct SoftmaxScaleMask {
  double scale = 1.0;
  const void* mask = nullptr;
  int64_t mask_inner = 1;
  int64_t mask_repeat = 1;
  bool identity() const { return scale == 1.0 && mask == nullptr; }
};

namespace cpu {

// out = softmax(x) or log_softmax(x) along each row, x = scale * in + mask. Float types only.
void softmax_forward(bool log, DType dtype, int64_t rows, int64_t cols, void* out, const void* in,
                     const SoftmaxScaleMask& input);

// grad_in from grad_out and the forward result `out`, times the forward's `scale` (1: none):
//   softmax:     grad_in = out * (grad_out - sum(grad_out * out))
//   log_softmax: grad_in = grad_out - exp(out) * sum(grad_out)
void softmax_backward(bool log, DType dtype, int64_t rows, int64_t cols, void* grad_in,
                      const void* grad_out, const void* out, double scale);

}  // namespace cpu

// The same on a CUDA device, queued on `stream`: one warp per row up to 1024 columns, one block
// per longer row, with the online (running max and sum) formulation.
namespace cuda {

void softmax_forward(bool log, DType dtype, int64_t rows, int64_t cols, void* out, const void* in,
                     const SoftmaxScaleMask& input, void* stream);
void softmax_backward(bool log, DType dtype, int64_t rows, int64_t cols, void* grad_in,
                      const void* grad_out, const void* out, double scale, void* stream);

}  // namespace cuda
}  // namespace mpigrad::kernels
