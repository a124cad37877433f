// defines: the CUDA paths of the nn layers (LayerNorm and the fused optimizers on the hand-written
//          kernels of kernels/cuda, Conv2d, BatchNorm and pooling on cuDNN)
//
// Internal to nn: nn/functional and nn/optim call these for CUDA tensors; they exist only in a
// build with the CUDA backend (MPIGRAD_WITH_CUDA), so every caller guards its call with
// `#if defined(MPIGRAD_WITH_CUDA)`. Each function makes the tensors' device current, queues its
// work on that device's current stream (core/stream.h), and reports any failure as core::Error
// naming the call. Tensors are dense (contiguous) and on one CUDA device; outputs are allocated
// by the caller and written with `=`. No CUDA or cuDNN header is included here.
#pragma once

#include <cstdint>
#include <vector>

#include "mpigrad/core/tensor.h"
#include "mpigrad/kernels/conv.h"
#include "mpigrad/kernels/optimizer.h"
#include "mpigrad/kernels/pooling.h"

namespace mpigrad::nn::cuda_ops {

// ---- LayerNorm (kernels/cuda/normalization.cu) -------------------------------------------------

// x, y: [rows, cols]; weight, bias: [cols] or undefined; mean, rstd: [rows].
void layer_norm_forward(int64_t rows, int64_t cols, double eps, const core::Tensor& x,
                        const core::Tensor& weight, const core::Tensor& bias, core::Tensor& y,
                        core::Tensor& mean, core::Tensor& rstd);
// Any of grad_x, grad_weight, grad_bias may be undefined (not wanted).
void layer_norm_backward(int64_t rows, int64_t cols, const core::Tensor& x,
                         const core::Tensor& grad_y, const core::Tensor& mean,
                         const core::Tensor& rstd, const core::Tensor& weight,
                         core::Tensor& grad_x, core::Tensor& grad_weight,
                         core::Tensor& grad_bias);

// ---- Fused optimizer updates (kernels/cuda/optimizer.cu) ----------------------------------------

// One launch for every slot (all on `device`, all of `dtype`).
void sgd_step_multi(core::Device device, core::DType dtype,
                    const std::vector<kernels::cuda::SgdSlot>& slots);
void adam_step_multi(core::Device device, core::DType dtype,
                     const std::vector<kernels::cuda::AdamSlot>& slots);

// ---- Conv2d (nn/cuda/cudnn_conv.cpp) ------------------------------------------------------------

struct ConvShape {
  kernels::Conv2dGeometry geometry;  // of one whole image (all input channels)
  int64_t batch = 0, out_channels = 0, groups = 1;
};

// y [N, out, oh, ow] = conv(x [N, C, H, W], w [out, C/groups, kh, kw]); no bias.
void conv2d_forward(const ConvShape& shape, const core::Tensor& x, const core::Tensor& w,
                    core::Tensor& y);
void conv2d_backward_data(const ConvShape& shape, const core::Tensor& grad_y,
                          const core::Tensor& w, core::Tensor& grad_x);
void conv2d_backward_filter(const ConvShape& shape, const core::Tensor& x,
                            const core::Tensor& grad_y, core::Tensor& grad_w);

// How the convolutions chose their algorithms so far (nn/cuda/cudnn_conv.cpp): one plan, and one
// cuDNN heuristics query, per shape and direction, never one per call; `fallbacks` counts
// algorithms left behind after a failed call. All zero in a build without cuDNN.
struct ConvAlgorithmStats {
  int64_t plans = 0;
  int64_t heuristic_queries = 0;
  int64_t fallbacks = 0;
};
ConvAlgorithmStats cudnn_conv_algorithm_stats();

// ---- BatchNorm (nn/cuda/cudnn_batch_norm.cpp) ---------------------------------------------------

// x, y: [batch, channels, inner]. weight and bias: [channels] (cuDNN always applies them: pass
// ones and zeros when the layer has none). Training: normalizes with the batch statistics, writes
// save_mean and save_invstd ([channels]) and, when running_mean/running_var are defined (dense,
// of the data's dtype), blends them with `factor` (unbiased variance), as torch does.
void batch_norm_forward_training(int64_t batch, int64_t channels, int64_t inner,
                                 const core::Tensor& x, const core::Tensor& weight,
                                 const core::Tensor& bias, core::Tensor& running_mean,
                                 core::Tensor& running_var, double factor, double eps,
                                 core::Tensor& y, core::Tensor& save_mean,
                                 core::Tensor& save_invstd);
// Eval mode: normalizes with the running statistics.
void batch_norm_forward_inference(int64_t batch, int64_t channels, int64_t inner,
                                  const core::Tensor& x, const core::Tensor& weight,
                                  const core::Tensor& bias, const core::Tensor& running_mean,
                                  const core::Tensor& running_var, double eps, core::Tensor& y);
// Backward of the training forward (save_mean/save_invstd are its outputs). grad_x, grad_weight
// and grad_bias are all written.
void batch_norm_backward(int64_t batch, int64_t channels, int64_t inner, const core::Tensor& x,
                         const core::Tensor& grad_y, const core::Tensor& weight,
                         const core::Tensor& save_mean, const core::Tensor& save_invstd,
                         double eps, core::Tensor& grad_x, core::Tensor& grad_weight,
                         core::Tensor& grad_bias);

// ---- Pooling (nn/cuda/cudnn_pooling.cpp) --------------------------------------------------------

enum class PoolMode { Max, AvgIncludePad, AvgExcludePad };

// x [planes, H, W] -> y [planes, oh, ow] (planes = N*C); no dilation (cuDNN has none).
void pool2d_forward(PoolMode mode, const kernels::Pool2dGeometry& geometry,
                    const core::Tensor& x, core::Tensor& y);
// Max pooling reads x and y to find the winners; average pooling ignores them.
void pool2d_backward(PoolMode mode, const kernels::Pool2dGeometry& geometry,
                     const core::Tensor& x, const core::Tensor& y, const core::Tensor& grad_y,
                     core::Tensor& grad_x);

}  // namespace mpigrad::nn::cuda_ops
