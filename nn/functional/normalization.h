// Batch normalization over [N, C, *] input (per channel, over the batch and the trailing dims)
// and layer normalization over the trailing `normalized_shape` dims, with torch's formulas.
// In training, batch_norm normalizes with the batch's biased variance and updates the running
// statistics in place with the unbiased one: running = (1 - factor) * running + factor * batch.
// The device's backend runs both (core/backend.h: kernels/normalization.h on the CPU; cuDNN's
// batch norm and the hand-written layer norm kernels on CUDA).
#pragma once

#include <cstdint>
#include <vector>

#include "mpigrad/core/tensor.h"
#include "mpigrad/nn/functional/pooling.h"

namespace mpigrad::nn::functional {

// running_mean / running_var: may be undefined (then training must be true: batch statistics
// only). weight and bias may be undefined. `factor` is the exponential average factor of the
// running-stat update (BatchNorm's momentum, or 1/num_batches for a cumulative average).
core::Tensor batch_norm(const core::Tensor& input, const core::Tensor& running_mean,
                        const core::Tensor& running_var, const core::Tensor& weight,
                        const core::Tensor& bias, bool training, double factor, double eps);

// relu(batch_norm(...)) with the same arguments. In training on a backend that fuses the pair
// (core::Backend::supports_batch_norm_relu: the CPU in Float32), one op writes the output once and
// its backward applies ReLU's mask inside batch norm's; every value, gradient and running statistic
// is bitwise the composition's. Elsewhere (eval, other dtypes, CUDA) it is the composition.
core::Tensor batch_norm_relu(const core::Tensor& input, const core::Tensor& running_mean,
                             const core::Tensor& running_var, const core::Tensor& weight,
                             const core::Tensor& bias, bool training, double factor, double eps);

// Normalizes over the last normalized_shape.size() dims, which must equal normalized_shape.
// weight and bias (shape normalized_shape) may be undefined.
core::Tensor layer_norm(const core::Tensor& input, const std::vector<int64_t>& normalized_shape,
                        const core::Tensor& weight, const core::Tensor& bias, double eps = 1e-5);

// max_pool2d(batch_norm_relu(...), pool). In training, with 2x2 windows of stride 2 and no
// padding or dilation over an [N, C, H, W] input with H, W >= 2, on a backend that supports the
// fusion (core::Backend::supports_batch_norm_relu_max_pool: the CPU in Float32 with AVX2), one
// op that writes only the pooled output and its taps, never the full-size ReLU output: bitwise
// the composition's output, running statistics and gradients, first and second order.
// Elsewhere that composition.
// Whether `pool` has the windows batch_norm_relu_max_pool2d fuses: 2x2, stride 2 (or the
// default, the kernel), no padding, no dilation.
bool fused_max_pool_window(const Pool2dOptions& pool);

core::Tensor batch_norm_relu_max_pool2d(const core::Tensor& input, const core::Tensor& running_mean,
                                        const core::Tensor& running_var, const core::Tensor& weight,
                                        const core::Tensor& bias, bool training, double factor,
                                        double eps, const Pool2dOptions& pool);

}  // namespace mpigrad::nn::functional
