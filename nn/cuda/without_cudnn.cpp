// The cuDNN-backed entry points of cuda_ops.h in a CUDA build that found no cuDNN: each throws.
#include "mpigrad/core/error.h"
#include "mpigrad/nn/cuda/cuda_ops.h"

namespace mpigrad::nn::cuda_ops {

using core::Tensor;

namespace {
[[noreturn]] void no_cudnn(const char* op) {
  core::fail(op, ": this libmpigrad was built without cuDNN, which CUDA tensors need here");
}
}  // namespace

void conv2d_forward(const ConvShape&, const Tensor&, const Tensor&, Tensor&) {
  no_cudnn("conv2d");
}
void conv2d_backward_data(const ConvShape&, const Tensor&, const Tensor&, Tensor&) {
  no_cudnn("conv2d backward");
}
void conv2d_backward_filter(const ConvShape&, const Tensor&, const Tensor&, Tensor&) {
  no_cudnn("conv2d backward");
}
ConvAlgorithmStats cudnn_conv_algorithm_stats() { return {}; }
void batch_norm_forward_training(int64_t, int64_t, int64_t, const Tensor&, const Tensor&,
                                 const Tensor&, Tensor&, Tensor&, double, double, Tensor&,
                                 Tensor&, Tensor&) {
  no_cudnn("batch_norm");
}
void batch_norm_forward_inference(int64_t, int64_t, int64_t, const Tensor&, const Tensor&,
                                  const Tensor&, const Tensor&, const Tensor&, double, Tensor&) {
  no_cudnn("batch_norm");
}
void batch_norm_backward(int64_t, int64_t, int64_t, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, double, Tensor&, Tensor&, Tensor&) {
  no_cudnn("batch_norm backward");
}
void pool2d_forward(PoolMode, const kernels::Pool2dGeometry&, const Tensor&, Tensor&) {
  no_cudnn("pool2d");
}
void pool2d_backward(PoolMode, const kernels::Pool2dGeometry&, const Tensor&, const Tensor&,
                     const Tensor&, Tensor&) {
  no_cudnn("pool2d backward");
}

}  // namespace mpigrad::nn::cuda_ops
