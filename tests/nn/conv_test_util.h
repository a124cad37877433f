// What the CPU convolution's tests share: a guard that forces the path (im2col + GEMM, oneDNN,
// direct loops) for a scope, and the kernel's shape of a table row of test cases. The guard also
// keeps conv2d from dropping the taps that see only padding (nn/functional/conv.h), so the path
// runs on the case's own kernel.
#pragma once

#include "mpigrad/core/backend.h"
#include "mpigrad/kernels/conv.h"
#include "mpigrad/nn/functional/conv.h"

namespace mpigrad::test {

class PathGuard {
 public:
  explicit PathGuard(kernels::cpu::ConvPath path)
      : previous_(kernels::cpu::set_conv2d_path_override(path)),
        dropped_(nn::functional::set_conv2d_drop_padding_taps(false)) {}
  ~PathGuard() {
    kernels::cpu::set_conv2d_path_override(previous_);
    nn::functional::set_conv2d_drop_padding_taps(dropped_);
  }
  PathGuard(const PathGuard&) = delete;
  PathGuard& operator=(const PathGuard&) = delete;

 private:
  kernels::cpu::ConvPath previous_;
  bool dropped_;
};

// The Conv2dShape of a case with batch, channels, height, width, out_channels and the kernel's
// size, stride, padding and dilation in both directions (and groups, where the case has them).
template <typename Case>
core::Conv2dShape conv_shape_of(const Case& c) {
  core::Conv2dShape s;
  s.batch = c.batch;
  s.out_channels = c.out_channels;
  if constexpr (requires { c.groups; }) s.groups = c.groups;
  auto& g = s.geometry;
  g.channels = c.channels;
  g.height = c.height;
  g.width = c.width;
  g.kernel_h = c.kernel_h;
  g.kernel_w = c.kernel_w;
  g.stride_h = c.stride_h;
  g.stride_w = c.stride_w;
  g.pad_h = c.pad_h;
  g.pad_w = c.pad_w;
  g.dilation_h = c.dilation_h;
  g.dilation_w = c.dilation_w;
  g.out_h = (c.height + 2 * c.pad_h - c.dilation_h * (c.kernel_h - 1) - 1) / c.stride_h + 1;
  g.out_w = (c.width + 2 * c.pad_w - c.dilation_w * (c.kernel_w - 1) - 1) / c.stride_w + 1;
  return s;
}

}  // namespace mpigrad::test
