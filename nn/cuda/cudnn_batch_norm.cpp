// BatchNorm on CUDA with cuDNN (spatial mode: one mean and variance per channel over the batch
// and the trailing dims): training forward with the running-statistics update, inference
// forward, and the training backward.
//
// The data is described as [batch, channels, inner, 1] NCHW, which covers BatchNorm1d's [N, C]
// and [N, C, L] and BatchNorm2d's [N, C, H, W] alike. cuDNN's per-channel tensors (weight, bias,
// running and saved statistics) have the data's dtype here (float for float32, double for
// float64, which is what cudnnDeriveBNTensorDescriptor asks for). Like torch, the running
// variance is blended with the unbiased batch variance and save_invstd is 1/sqrt(var + eps).
#include "mpigrad/nn/cuda/cuda_ops.h"
#include "mpigrad/nn/cuda/cudnn_support.cuh"

namespace mpigrad::nn::cuda_ops {

using core::Tensor;

namespace {

constexpr const char* kOp = "batch_norm (cuDNN)";
constexpr cudnnBatchNormMode_t kMode = CUDNN_BATCHNORM_SPATIAL;

struct BatchNormDescriptors {
  detail::TensorDescriptor data, params;
  BatchNormDescriptors(int64_t batch, int64_t channels, int64_t inner, core::DType dtype,
                       int device)
      : data(device), params(device) {
    detail::set_nchw(data, dtype, batch, channels, inner, 1, kOp, device);
    MPIGRAD_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(params.get(), data.get(), kMode), device);
  }
};

void check_eps(double eps) {
  MPIGRAD_CHECK(eps >= CUDNN_BN_MIN_EPSILON, kOp, ": eps ", eps, " is below cuDNN's minimum ",
                CUDNN_BN_MIN_EPSILON);
}

void* ptr_or_null(Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

}  // namespace

void batch_norm_forward_training(int64_t batch, int64_t channels, int64_t inner, const Tensor& x,
                                 const Tensor& weight, const Tensor& bias, Tensor& running_mean,
                                 Tensor& running_var, double factor, double eps, Tensor& y,
                                 Tensor& save_mean, Tensor& save_invstd) {
  check_eps(eps);
  MPIGRAD_CHECK(running_mean.defined() == running_var.defined(), kOp,
                ": running_mean and running_var must both be given or both be absent");
  detail::on_device(x.device(), [&] {
    detail::HandleLease handle(x.device());
    BatchNormDescriptors d(batch, channels, inner, x.dtype(), handle.device());
    const auto one = detail::scale(1.0), zero = detail::scale(0.0);
    MPIGRAD_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
                            handle.get(), kMode, one.get(x.dtype()), zero.get(x.dtype()),
                            d.data.get(), x.data_ptr(), d.data.get(), y.data_ptr(),
                            d.params.get(), weight.data_ptr(), bias.data_ptr(), factor,
                            ptr_or_null(running_mean), ptr_or_null(running_var), eps,
                            save_mean.data_ptr(), save_invstd.data_ptr()),
                        handle.device());
  });
}

void batch_norm_forward_inference(int64_t batch, int64_t channels, int64_t inner,
                                  const Tensor& x, const Tensor& weight, const Tensor& bias,
                                  const Tensor& running_mean, const Tensor& running_var,
                                  double eps, Tensor& y) {
  check_eps(eps);
  detail::on_device(x.device(), [&] {
    detail::HandleLease handle(x.device());
    BatchNormDescriptors d(batch, channels, inner, x.dtype(), handle.device());
    const auto one = detail::scale(1.0), zero = detail::scale(0.0);
    MPIGRAD_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
                            handle.get(), kMode, one.get(x.dtype()), zero.get(x.dtype()),
                            d.data.get(), x.data_ptr(), d.data.get(), y.data_ptr(),
                            d.params.get(), weight.data_ptr(), bias.data_ptr(),
                            running_mean.data_ptr(), running_var.data_ptr(), eps),
                        handle.device());
  });
}

void batch_norm_backward(int64_t batch, int64_t channels, int64_t inner, const Tensor& x,
                         const Tensor& grad_y, const Tensor& weight, const Tensor& save_mean,
                         const Tensor& save_invstd, double eps, Tensor& grad_x,
                         Tensor& grad_weight, Tensor& grad_bias) {
  check_eps(eps);
  detail::on_device(x.device(), [&] {
    detail::HandleLease handle(x.device());
    BatchNormDescriptors d(batch, channels, inner, x.dtype(), handle.device());
    const auto one = detail::scale(1.0), zero = detail::scale(0.0);
    MPIGRAD_CUDNN_CHECK(cudnnBatchNormalizationBackward(
                            handle.get(), kMode, one.get(x.dtype()), zero.get(x.dtype()),
                            one.get(x.dtype()), zero.get(x.dtype()), d.data.get(), x.data_ptr(),
                            d.data.get(), grad_y.data_ptr(), d.data.get(), grad_x.data_ptr(),
                            d.params.get(), weight.data_ptr(), grad_weight.data_ptr(),
                            grad_bias.data_ptr(), eps, save_mean.data_ptr(),
                            save_invstd.data_ptr()),
                        handle.device());
  });
}

}  // namespace mpigrad::nn::cuda_ops
