// Forces the CPU convolution's path (im2col + GEMM, oneDNN, direct loops) for a scope and puts
// the previous choice back: the tests of each path share it.
#pragma once

#include "mpigrad/kernels/conv.h"

namespace mpigrad::test {

class PathGuard {
 public:
  explicit PathGuard(kernels::cpu::ConvPath path)
      : previous_(kernels::cpu::set_conv2d_path_override(path)) {}
  ~PathGuard() { kernels::cpu::set_conv2d_path_override(previous_); }
  PathGuard(const PathGuard&) = delete;
  PathGuard& operator=(const PathGuard&) = delete;

 private:
  kernels::cpu::ConvPath previous_;
};

}  // namespace mpigrad::test
