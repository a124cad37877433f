// Conv2d on CUDA with cuDNN: forward, backward data and backward filter (NCHW, groups, stride,
// padding, dilation; cross-correlation, as torch).
//
// Algorithms come from cuDNN's heuristics (the _v7 queries, which run nothing): the first
// suggestion whose workspace size query succeeds is used, with its workspace from the caching
// allocator. The math mode is CUDNN_FMA_MATH, so float32 convolutions do not drop to TF32 and
// agree with the CPU path to float rounding (torch's allow_tf32 would trade that for speed).
#include <vector>

#include "mpigrad/nn/cuda/cuda_ops.h"
#include "mpigrad/nn/cuda/cudnn_support.cuh"

namespace mpigrad::nn::cuda_ops {

using core::Tensor;

namespace {

constexpr const char* kOp = "conv2d (cuDNN)";

// The descriptors of one convolution.
struct ConvDescriptors {
  detail::TensorDescriptor x, y;
  detail::FilterDescriptor w;
  detail::ConvolutionDescriptor conv;

  ConvDescriptors(const ConvShape& s, core::DType dtype, int device)
      : x(device), y(device), w(device), conv(device) {
    const auto& g = s.geometry;
    const cudnnDataType_t type = detail::cudnn_dtype(dtype, kOp);
    detail::set_nchw(x, dtype, s.batch, g.channels, g.height, g.width, kOp, device);
    detail::set_nchw(y, dtype, s.batch, s.out_channels, g.out_h, g.out_w, kOp, device);
    MPIGRAD_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w.get(), type, CUDNN_TENSOR_NCHW,
                                                   int(s.out_channels),
                                                   int(g.channels / s.groups), int(g.kernel_h),
                                                   int(g.kernel_w)),
                        device);
    MPIGRAD_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
                            conv.get(), int(g.pad_h), int(g.pad_w), int(g.stride_h),
                            int(g.stride_w), int(g.dilation_h), int(g.dilation_w),
                            CUDNN_CROSS_CORRELATION, type),
                        device);
    MPIGRAD_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv.get(), int(s.groups)), device);
    MPIGRAD_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.get(), CUDNN_FMA_MATH), device);
  }
};

// The first heuristic suggestion whose workspace can be sized. Query(perf, &count) asks for
// suggestions; Size(algo, &bytes) sizes one.
template <typename Perf, typename Algo, typename Query, typename Size>
Algo pick_algorithm(const char* what, int device, Query query, Size size, size_t& workspace) {
  constexpr int kRequested = 8;
  Perf perf[kRequested];
  int returned = 0;
  query(kRequested, &returned, perf);
  for (int i = 0; i < returned; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    size_t bytes = 0;
    if (size(perf[i].algo, &bytes) == CUDNN_STATUS_SUCCESS) {
      workspace = bytes;
      return perf[i].algo;
    }
  }
  core::fail(kOp, ": cuDNN suggested no usable ", what, " algorithm on cuda:", device);
}

void check_tensors(const char* what, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    MPIGRAD_CHECK(t->defined() && t->device().is_cuda() && t->is_contiguous(), kOp, ": ", what,
                  " needs dense CUDA tensors");
  }
}

}  // namespace

void conv2d_forward(const ConvShape& shape, const Tensor& x, const Tensor& w, Tensor& y) {
  check_tensors("forward", {&x, &w, &y});
  detail::on_device(x.device(), [&] {
    detail::HandleLease handle(x.device());
    const int device = handle.device();
    ConvDescriptors d(shape, x.dtype(), device);
    size_t bytes = 0;
    const auto algo = pick_algorithm<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(
        "forward", device,
        [&](int requested, int* returned, cudnnConvolutionFwdAlgoPerf_t* perf) {
          MPIGRAD_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
                                  handle.get(), d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
                                  requested, returned, perf),
                              device);
        },
        [&](cudnnConvolutionFwdAlgo_t a, size_t* size) {
          return cudnnGetConvolutionForwardWorkspaceSize(handle.get(), d.x.get(), d.w.get(),
                                                         d.conv.get(), d.y.get(), a, size);
        },
        bytes);
    Tensor workspace = detail::workspace(x.device(), bytes);
    const auto one = detail::scale(1.0), zero = detail::scale(0.0);
    MPIGRAD_CUDNN_CHECK(cudnnConvolutionForward(handle.get(), one.get(x.dtype()), d.x.get(),
                                                x.data_ptr(), d.w.get(), w.data_ptr(),
                                                d.conv.get(), algo, workspace.data_ptr(), bytes,
                                                zero.get(x.dtype()), d.y.get(), y.data_ptr()),
                        device);
  });
}

void conv2d_backward_data(const ConvShape& shape, const Tensor& grad_y, const Tensor& w,
                          Tensor& grad_x) {
  check_tensors("backward data", {&grad_y, &w, &grad_x});
  detail::on_device(grad_y.device(), [&] {
    detail::HandleLease handle(grad_y.device());
    const int device = handle.device();
    ConvDescriptors d(shape, grad_y.dtype(), device);
    size_t bytes = 0;
    const auto algo =
        pick_algorithm<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
            "backward data", device,
            [&](int requested, int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
              MPIGRAD_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                                      handle.get(), d.w.get(), d.y.get(), d.conv.get(),
                                      d.x.get(), requested, returned, perf),
                                  device);
            },
            [&](cudnnConvolutionBwdDataAlgo_t a, size_t* size) {
              return cudnnGetConvolutionBackwardDataWorkspaceSize(
                  handle.get(), d.w.get(), d.y.get(), d.conv.get(), d.x.get(), a, size);
            },
            bytes);
    Tensor workspace = detail::workspace(grad_y.device(), bytes);
    const auto one = detail::scale(1.0), zero = detail::scale(0.0);
    MPIGRAD_CUDNN_CHECK(
        cudnnConvolutionBackwardData(handle.get(), one.get(grad_y.dtype()), d.w.get(),
                                     w.data_ptr(), d.y.get(), grad_y.data_ptr(), d.conv.get(),
                                     algo, workspace.data_ptr(), bytes,
                                     zero.get(grad_y.dtype()), d.x.get(), grad_x.data_ptr()),
        device);
  });
}

void conv2d_backward_filter(const ConvShape& shape, const Tensor& x, const Tensor& grad_y,
                            Tensor& grad_w) {
  check_tensors("backward filter", {&x, &grad_y, &grad_w});
  detail::on_device(x.device(), [&] {
    detail::HandleLease handle(x.device());
    const int device = handle.device();
    ConvDescriptors d(shape, x.dtype(), device);
    size_t bytes = 0;
    const auto algo =
        pick_algorithm<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
            "backward filter", device,
            [&](int requested, int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
              MPIGRAD_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                                      handle.get(), d.x.get(), d.y.get(), d.conv.get(),
                                      d.w.get(), requested, returned, perf),
                                  device);
            },
            [&](cudnnConvolutionBwdFilterAlgo_t a, size_t* size) {
              return cudnnGetConvolutionBackwardFilterWorkspaceSize(
                  handle.get(), d.x.get(), d.y.get(), d.conv.get(), d.w.get(), a, size);
            },
            bytes);
    Tensor workspace = detail::workspace(x.device(), bytes);
    const auto one = detail::scale(1.0), zero = detail::scale(0.0);
    MPIGRAD_CUDNN_CHECK(
        cudnnConvolutionBackwardFilter(handle.get(), one.get(x.dtype()), d.x.get(), x.data_ptr(),
                                       d.y.get(), grad_y.data_ptr(), d.conv.get(), algo,
                                       workspace.data_ptr(), bytes, zero.get(x.dtype()),
                                       d.w.get(), grad_w.data_ptr()),
        device);
  });
}

}  // namespace mpigrad::nn::cuda_ops
