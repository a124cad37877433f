// defines: Conv2dOptions, conv2d
//
// 2-d convolution of NCHW input with an [out_channels, in_channels/groups, kh, kw] weight, with
// stride, zero padding, dilation and groups (torch.nn.functional.conv2d). On the CPU each image
// is unrolled by im2col (kernels/conv.h) and multiplied by the weight with one batched GEMM over
// the groups; 1x1 stride-1 convolutions skip im2col. Backward recomputes the columns instead of
// saving them, so memory stays at one image's worth of columns.
#pragma once

#include <array>
#include <cstdint>

#include "mpigrad/core/tensor.h"

namespace mpigrad::nn::functional {

struct Conv2dOptions {
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
};

// bias may be undefined. Differentiable in input, weight and bias.
core::Tensor conv2d(const core::Tensor& input, const core::Tensor& weight,
                    const core::Tensor& bias, const Conv2dOptions& options = {});

}  // namespace mpigrad::nn::functional
