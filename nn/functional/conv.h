// 2-d convolution of NCHW input with an [out_channels, in_channels/groups, kh, kw] weight, with
// stride, zero padding, dilation and groups (torch.nn.functional.conv2d). The device's backend
// runs it (core/backend.h: oneDNN, direct depthwise loops or im2col + GEMM on the CPU, as
// kernels/conv.h's rule picks; cuDNN on CUDA); the bias is a broadcast
// add, and its gradient a sum, in core ops. Under autocast (core/autocast.h) x and w are read in
// 16 bits and the result is float32.
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
core::Tensor conv2d(const core::Tensor& input, const core::Tensor& weight, const core::Tensor& bias,
                    const Conv2dOptions& options = {});

}  // namespace mpigrad::nn::functional
