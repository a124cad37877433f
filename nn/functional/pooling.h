// 2-d pooling of [N, C, H, W] (or [C, H, W]) input, with torch.nn.functional's defaults
// (stride = kernel size, no padding, floor rounding of the output size, count_include_pad).
// The device's backend runs them (core/backend.h: kernels/pooling.h on the CPU, cuDNN on CUDA,
// which has no dilation and pools adaptively only when the output size divides the input's).
// Max pooling's backward reads what the backend recorded; the average pools need only shapes.
#pragma once

#include <array>
#include <cstdint>

#include "mpigrad/core/tensor.h"

namespace mpigrad::nn::functional {

struct Pool2dOptions {
  std::array<int64_t, 2> kernel_size{1, 1};
  std::array<int64_t, 2> stride{0, 0};  // 0: same as kernel_size
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};  // max pooling only
  bool count_include_pad = true;          // average pooling only
};

core::Tensor max_pool2d(const core::Tensor& input, const Pool2dOptions& options);
core::Tensor avg_pool2d(const core::Tensor& input, const Pool2dOptions& options);
core::Tensor adaptive_avg_pool2d(const core::Tensor& input, std::array<int64_t, 2> output_size);

}  // namespace mpigrad::nn::functional
