// Max and average 2-d pooling on CUDA with cuDNN, forward and backward.
//
// The input [planes, H, W] (planes = N*C of an NCHW tensor) is described to cuDNN as
// [planes, 1, H, W]. Max pooling is CUDNN_POOLING_MAX_DETERMINISTIC with NaN propagation (as
// torch); its backward finds the winners again from x and y instead of keeping indices.
// Average pooling with count_include_pad divides by the whole window (the CPU's divisor, since
// padding is at most half the window and the window never leaves the padded input), without it
// by the window's part inside the image. cuDNN pooling has no dilation.
#include "mpigrad/nn/cuda/cuda_ops.h"
#include "mpigrad/nn/cuda/cudnn_support.cuh"

namespace mpigrad::nn::cuda_ops {

using core::Tensor;

namespace {

constexpr const char* kOp = "pool2d (cuDNN)";

cudnnPoolingMode_t cudnn_mode(PoolMode mode) {
  switch (mode) {
    case PoolMode::Max: return CUDNN_POOLING_MAX_DETERMINISTIC;
    case PoolMode::AvgIncludePad: return CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING;
    case PoolMode::AvgExcludePad: return CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
  }
  return CUDNN_POOLING_MAX_DETERMINISTIC;
}

struct PoolDescriptors {
  detail::TensorDescriptor x, y;
  detail::PoolingDescriptor pool;
  PoolDescriptors(PoolMode mode, const kernels::Pool2dGeometry& g, core::DType dtype, int device)
      : x(device), y(device), pool(device) {
    MPIGRAD_CHECK(g.dilation_h == 1 && g.dilation_w == 1, kOp,
                  ": dilation is not supported on CUDA (cuDNN pooling has none), got ",
                  g.dilation_h, "x", g.dilation_w);
    detail::set_nchw(x, dtype, g.planes, 1, g.height, g.width, kOp, device);
    detail::set_nchw(y, dtype, g.planes, 1, g.out_h, g.out_w, kOp, device);
    MPIGRAD_CUDNN_CHECK(cudnnSetPooling2dDescriptor(pool.get(), cudnn_mode(mode),
                                                    CUDNN_PROPAGATE_NAN, int(g.kernel_h),
                                                    int(g.kernel_w), int(g.pad_h), int(g.pad_w),
                                                    int(g.stride_h), int(g.stride_w)),
                        device);
  }
};

}  // namespace

void pool2d_forward(PoolMode mode, const kernels::Pool2dGeometry& geometry, const Tensor& x,
                    Tensor& y) {
  if (geometry.planes == 0) return;
  detail::on_device(x.device(), [&] {
    detail::HandleLease handle(x.device());
    PoolDescriptors d(mode, geometry, x.dtype(), handle.device());
    const auto one = detail::scale(1.0), zero = detail::scale(0.0);
    MPIGRAD_CUDNN_CHECK(cudnnPoolingForward(handle.get(), d.pool.get(), one.get(x.dtype()),
                                            d.x.get(), x.data_ptr(), zero.get(x.dtype()),
                                            d.y.get(), y.data_ptr()),
                        handle.device());
  });
}

void pool2d_backward(PoolMode mode, const kernels::Pool2dGeometry& geometry, const Tensor& x,
                     const Tensor& y, const Tensor& grad_y, Tensor& grad_x) {
  if (geometry.planes == 0) return;
  detail::on_device(grad_y.device(), [&] {
    detail::HandleLease handle(grad_y.device());
    PoolDescriptors d(mode, geometry, grad_y.dtype(), handle.device());
    const auto one = detail::scale(1.0), zero = detail::scale(0.0);
    // Average pooling reads neither x nor y; cuDNN still wants valid pointers.
    const void* xp = x.defined() ? x.data_ptr() : grad_x.data_ptr();
    const void* yp = y.defined() ? y.data_ptr() : grad_y.data_ptr();
    MPIGRAD_CUDNN_CHECK(cudnnPoolingBackward(handle.get(), d.pool.get(),
                                             one.get(grad_y.dtype()), d.y.get(), yp, d.y.get(),
                                             grad_y.data_ptr(), d.x.get(), xp,
                                             zero.get(grad_y.dtype()), d.x.get(),
                                             grad_x.data_ptr()),
                        handle.device());
  });
}

}  // namespace mpigrad::nn::cuda_ops
