// 2-d convolution of NCHW input with an [out_channels, in_channels/groups, kh, kw] weight, with
// stride, zero padding, dilation and groups (torch.nn.functional.conv2d). The device's backend
// runs it (core/backend.h: oneDNN, direct depthwise loops or im2col + GEMM on the CPU, as
// kernels/conv.h's rule picks; cuDNN on CUDA), which adds the bias in the same pass. Under autocast
// (core/autocast.h) x and w are read in 16 bits and the result is float32.
//
// Kernel rows and columns that fall on the padding at every output position multiply only zeros:
// a 3x3 kernel with padding 1 on a 1x1 image (the last stage of a ResNet fed 32x32 images) uses
// its centre tap alone. conv2d drops them before the backend sees the weight (a narrowed view of
// it, so their gradient is zeros through the view's backward) and shrinks the padding to match;
// the result is the same convolution, with 1/9 of such a layer's weights moved and multiplied.
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

// The kernel taps along one spatial axis that read the image (not only its padding) at some
// output position: [first, first + count). `padding` is what the axis keeps once the taps before
// `first` are dropped. count == kernel (first 0) where every tap is used, or where dropping the
// others would not keep the same output positions with symmetric padding.
struct UsedTaps {
  int64_t first = 0, count = 0, padding = 0;
};
UsedTaps used_taps(int64_t size, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation);

// Whether conv2d drops the taps that see only padding (on unless switched off); returns the old
// setting. For tests and benchmarks that drive the backend's kernels on such shapes themselves.
bool set_conv2d_drop_padding_taps(bool drop);

// bias may be undefined. Differentiable in input, weight and bias.
core::Tensor conv2d(const core::Tensor& input, const core::Tensor& weight, const core::Tensor& bias,
                    const Conv2dOptions& options = {});

}  // namespace mpigrad::nn::functional
