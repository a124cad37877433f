// Max, average and adaptive average 2-d pooling on CUDA with cuDNN, forward and backward.
//
// The input [planes, H, W] (planes = N*C of an NCHW tensor) is described to cuDNN as
// [planes, 1, H, W]. Max pooling is CUDNN_POOLING_MAX_DETERMINISTIC with NaN propagation (as
// torch); its backward finds the winners again from x and y instead of keeping indices.
// Average pooling with count_include_pad divides by the whole window (the CPU's divisor, since
// padding is at most half the window and the window never leaves the padded input), without it
// by the window's part inside the image. cuDNN pooling has no dilation.
#include "mpigrad/core/cuda/cudnn_backend.cuh"

namespace mpigrad::core::cuda_detail {

namespace {

constexpr const char* kOp = "pool2d (cuDNN)";

cudnnPoolingMode_t cudnn_mode(Pool2dMode mode) {
  switch (mode) {
    case Pool2dMode::Max:
      return CUDNN_POOLING_MAX_DETERMINISTIC;
    case Pool2dMode::AvgExcludePad:
      return CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
    default:
      return CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING;
  }
}

// Adaptive average pooling is cuDNN's plain average pooling, which it equals when the output size
// divides the input size (the common 1x1 global pooling included); every other mode is a window
// pooling already.
Pool2dGeometry window_of(Pool2dMode mode, const Pool2dGeometry& g) {
  if (mode != Pool2dMode::AdaptiveAvg) return g;
  MPIGRAD_CHECK(g.height % g.out_h == 0 && g.width % g.out_w == 0,
                "adaptive_avg_pool2d: on CUDA the input size must be a multiple of the output "
                "size, got input ",
                g.height, "x", g.width, " and output ", g.out_h, "x", g.out_w);
  Pool2dGeometry window = g;
  window.kernel_h = window.stride_h = g.height / g.out_h;
  window.kernel_w = window.stride_w = g.width / g.out_w;
  window.pad_h = window.pad_w = 0;
  window.dilation_h = window.dilation_w = 1;
  return window;
}

struct PoolDescriptors {
  TensorDescriptor x, y;
  PoolingDescriptor pool;
  PoolDescriptors(Pool2dMode mode, const Pool2dGeometry& g, DType dtype, int device)
      : x(device), y(device), pool(device) {
    MPIGRAD_CHECK(g.dilation_h == 1 && g.dilation_w == 1, kOp,
                  ": dilation is not supported on CUDA (cuDNN pooling has none), got ",
                  g.dilation_h, "x", g.dilation_w);
    set_nchw(x, dtype, g.planes, 1, g.height, g.width, kOp, device);
    set_nchw(y, dtype, g.planes, 1, g.out_h, g.out_w, kOp, device);
    MPIGRAD_CUDNN_CHECK(
        cudnnSetPooling2dDescriptor(pool.get(), cudnn_mode(mode), CUDNN_PROPAGATE_NAN,
                                    int(g.kernel_h), int(g.kernel_w), int(g.pad_h), int(g.pad_w),
                                    int(g.stride_h), int(g.stride_w)),
        device);
  }
};

}  // namespace

void CudnnBackend::pool2d_forward(Pool2dMode mode, DType dtype, const Pool2dGeometry& geometry,
                                  const void* x, void* y, void* /*indices*/) {
  const Pool2dGeometry window = window_of(mode, geometry);
  if (window.planes == 0) return;
  launch(device(), [&] {
    HandleLease handle(*this);
    PoolDescriptors d(mode, window, dtype, device());
    const auto one = scale(1.0), zero = scale(0.0);
    MPIGRAD_CUDNN_CHECK(cudnnPoolingForward(handle.get(), d.pool.get(), one.get(dtype), d.x.get(),
                                            x, zero.get(dtype), d.y.get(), y),
                        device());
  });
}

void CudnnBackend::pool2d_backward(Pool2dMode mode, DType dtype, const Pool2dGeometry& geometry,
                                   const void* x, const void* y, const void* /*indices*/,
                                   const void* grad_y, void* grad_x) {
  const Pool2dGeometry window = window_of(mode, geometry);
  if (window.planes == 0) return;
  launch(device(), [&] {
    HandleLease handle(*this);
    PoolDescriptors d(mode, window, dtype, device());
    const auto one = scale(1.0), zero = scale(0.0);
    // Average pooling reads neither x nor y; cuDNN still wants valid pointers.
    const void* xp = x != nullptr ? x : grad_x;
    const void* yp = y != nullptr ? y : grad_y;
    MPIGRAD_CUDNN_CHECK(
        cudnnPoolingBackward(handle.get(), d.pool.get(), one.get(dtype), d.y.get(), yp, d.y.get(),
                             grad_y, d.x.get(), xp, zero.get(dtype), d.x.get(), grad_x),
        device());
  });
}

}  // namespace mpigrad::core::cuda_detail
