// Batch norm works on a dense [batch, channels, inner] buffer (inner = H*W for NCHW, 1 for
// [N, C]) and normalizes each channel over batch and inner. Layer norm works on a dense
// [rows, cols] buffer and normalizes each row. Statistics are accumulated in double whatever the
// storage type. Per-channel / per-row vectors (mean, invstd, weight, bias) have the data's dtype.
// Everything writes with `=`; weight and bias may be null (no affine transform), and so may any
// gradient output that is not wanted.
#pragma once

#include <cstdint>

#include "mpigrad/kernels/dtype.h"
#include "mpigrad/kernels/pooling.h"

namespace mpigrad::kernels {
namespace cpu {

// mean[c] and the biased (population) variance[c] over batch and inner.
void batch_norm_statistics(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                           const void* x, void* mean, void* variance);

// y = (x - mean[c]) * invstd[c] * weight[c] + bias[c].
void batch_norm_forward(DType dtype, int64_t batch, int64_t channels, int64_t inner, const void* x,
                        const void* mean, const void* invstd, const void* weight, const void* bias,
                        void* y);

// Training forward in one call: each channel's mean and invstd (1 / sqrt(variance + eps)), the
// running statistics blended in place when running_mean is not null (running * (1 - factor) +
// stat * factor, with the unbiased variance), then y as batch_norm_forward writes it, while the
// channel is still in cache. Bitwise the same as batch_norm_statistics, that arithmetic in T, and
// batch_norm_forward in turn.
void batch_norm_forward_training(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                                 double factor, double eps, const void* x, const void* weight,
                                 const void* bias, void* running_mean, void* running_var, void* y,
                                 void* mean, void* invstd);

// batch_norm_forward_training followed by a ReLU in the same pass: y = max(0, batch norm), NaN
// and -0 passing as the ReLU kernel lets them (kernels/cpu/elementwise.cpp). Every output is
// bitwise what batch_norm_forward_training and then the ReLU write; y is written once.
void batch_norm_relu_forward_training(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                                      double factor, double eps, const void* x, const void* weight,
                                      const void* bias, void* running_mean, void* running_var,
                                      void* y, void* mean, void* invstd);

// The training backward of y = relu(batch norm(x)), y the output batch_norm_relu_forward_training
// wrote from these x, mean, invstd, weight and bias: grad_y passes where y > 0 and is +0
// elsewhere (the ReLU's backward) inside batch norm's reductions and its grad_x pass, so the
// results are bitwise the ReLU's backward followed by batch_norm_backward, without the
// intermediate gradient buffer. The Float32 AVX2 path finds where y > 0 from x and the forward's
// arithmetic instead of reading y. grad_x may be grad_y: each element of grad_y is read before
// that of grad_x is written.
void batch_norm_relu_backward(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                              const void* x, const void* y, const void* grad_y, const void* mean,
                              const void* invstd, const void* weight, const void* bias,
                              void* grad_x, void* grad_weight, void* grad_bias);

// batch_norm_relu_forward_training followed by a 2x2 max pooling of stride 2 without padding
// (`pool`, planes = batch * channels; out_h = height / 2, out_w = width / 2, an odd last row or
// column left out): writes only the pooled output and its taps (max_pool2d_forward's one-byte
// taps), bitwise what the two ops write in turn; the full-size ReLU output is never written.
// Supported where batch_norm_relu_max_pool_supported says so (Float32 with AVX2, planes of 8
// elements or more); otherwise these throw and callers compose the two ops.
bool batch_norm_relu_max_pool_supported(DType dtype, const Pool2dGeometry& pool);
void batch_norm_relu_max_pool_forward_training(DType dtype, const Pool2dGeometry& pool,
                                               int64_t batch, int64_t channels, double factor,
                                               double eps, const void* x, const void* weight,
                                               const void* bias, void* running_mean,
                                               void* running_var, void* out, void* taps, void* mean,
                                               void* invstd);
// Its backward from the pooled gradient grad_out and the forward's taps, x, mean, invstd,
// weight and bias: bitwise max_pool2d_backward followed by batch_norm_relu_backward, without the
// full-size gradient between them (each plane's is built in a scratch plane in L1, once for the
// sums and once for grad_x). Unwanted gradients may be null.
void batch_norm_relu_max_pool_backward(DType dtype, const Pool2dGeometry& pool, int64_t batch,
                                       int64_t channels, const void* x, const void* grad_out,
                                       const void* taps, const void* mean, const void* invstd,
                                       const void* weight, const void* bias, void* grad_x,
                                       void* grad_weight, void* grad_bias);

// With `training`, mean and invstd are the batch's own statistics and grad_x includes their
// dependence on x; otherwise they are constants (running statistics in eval mode).
void batch_norm_backward(DType dtype, int64_t batch, int64_t channels, int64_t inner, bool training,
                         const void* x, const void* grad_y, const void* mean, const void* invstd,
                         const void* weight, void* grad_x, void* grad_weight, void* grad_bias);

// y = (x - mean[r]) * rstd[r] * weight[col] + bias[col]; also writes mean[r] and rstd[r].
void layer_norm_forward(DType dtype, int64_t rows, int64_t cols, double eps, const void* x,
                        const void* weight, const void* bias, void* y, void* mean, void* rstd);

void layer_norm_backward(DType dtype, int64_t rows, int64_t cols, const void* x, const void* grad_y,
                         const void* mean, const void* rstd, const void* weight, void* grad_x,
                         void* grad_weight, void* grad_bias);

}  // namespace cpu

// The layer-norm pair on a CUDA device (kernels/cuda/normalization.cu), queued on `stream` (a
// cudaStream_t) of the current device. Same layout and `=` contract as the CPU versions;
// Float32 and Float64 only. Statistics accumulate in float for Float32 (double for Float64).
// Batch norm on CUDA is cuDNN's (core/cuda/cudnn_batch_norm.cpp), so it has no hand-written
// kernel here.
namespace cuda {

void layer_norm_forward(DType dtype, int64_t rows, int64_t cols, double eps, const void* x,
                        const void* weight, const void* bias, void* y, void* mean, void* rstd,
                        void* stream);

void layer_norm_backward(DType dtype, int64_t rows, int64_t cols, const void* x, const void* grad_y,
                         const void* mean, const void* rstd, const void* weight, void* grad_x,
                         void* grad_weight, void* grad_bias, void* stream);

}  // namespace cuda
}  // namespace mpigrad::kernels
