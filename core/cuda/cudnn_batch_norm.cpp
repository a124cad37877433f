// BatchNorm on CUDA with cuDNN (spatial mode: one mean and variance per channel over the batch
// and the trailing dims): training forward with the running-statistics update, inference
// forward, and the training backward.
//
// The data is described as [batch, channels, inner, 1] NCHW, which covers BatchNorm1d's [N, C]
// and [N, C, L] and BatchNorm2d's [N, C, H, W] alike. cuDNN's per-channel tensors (weight, bias,
// running and saved statistics) have the data's dtype here (float for float32, double for
// float64, which is what cudnnDeriveBNTensorDescriptor asks for). Like torch, the running
// variance is blended with the unbiased batch variance and save_invstd is 1/sqrt(var + eps).
#include "mpigrad/core/cuda/cudnn_backend.cuh"

namespace mpigrad::core::cuda_detail {

namespace {

constexpr const char* kOp = "batch_norm (cuDNN)";
constexpr cudnnBatchNormMode_t kMode = CUDNN_BATCHNORM_SPATIAL;

struct BatchNormDescriptors {
  TensorDescriptor data, params;
  BatchNormDescriptors(int64_t batch, int64_t channels, int64_t inner, DType dtype, int device)
      : data(device), params(device) {
    set_nchw(data, dtype, batch, channels, inner, 1, kOp, device);
    MPIGRAD_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(params.get(), data.get(), kMode), device);
  }
};

void check_eps(double eps) {
  MPIGRAD_CHECK(eps >= CUDNN_BN_MIN_EPSILON, kOp, ": eps ", eps, " is below cuDNN's minimum ",
                CUDNN_BN_MIN_EPSILON);
}

}  // namespace

// cuDNN always applies a scale and shift: a missing weight or bias becomes a [channels] scratch
// vector of ones or zeros, as does an unwanted gradient. cuDNN also rejects empty tensors, and
// an empty input has nothing to write.

void CudnnBackend::batch_norm_forward_training(DType dtype, int64_t batch, int64_t channels,
                                               int64_t inner, double factor, double eps,
                                               const void* x, const void* weight, const void* bias,
                                               void* running_mean, void* running_var, void* y,
                                               void* mean, void* invstd) {
  check_eps(eps);
  MPIGRAD_CHECK((running_mean == nullptr) == (running_var == nullptr), kOp,
                ": running_mean and running_var must both be given or both be absent");
  if (batch * channels * inner == 0) return;
  const size_t vector_bytes = size_t(channels) * size_t(element_size(dtype));
  Scratch ones(caching_allocator(), weight == nullptr ? vector_bytes : 0);
  Scratch zeros(caching_allocator(), bias == nullptr ? vector_bytes : 0);
  if (weight == nullptr) fill(dtype, channels, ones.get(), 1.0);
  if (bias == nullptr) fill(dtype, channels, zeros.get(), 0.0);
  launch(device(), [&] {
    HandleLease handle(*this);
    BatchNormDescriptors d(batch, channels, inner, dtype, device());
    const auto one = scale(1.0), zero = scale(0.0);
    MPIGRAD_CUDNN_CHECK(
        cudnnBatchNormalizationForwardTraining(handle.get(), kMode, one.get(dtype), zero.get(dtype),
                                               d.data.get(), x, d.data.get(), y, d.params.get(),
                                               weight != nullptr ? weight : ones.get(),
                                               bias != nullptr ? bias : zeros.get(), factor,
                                               running_mean, running_var, eps, mean, invstd),
        device());
  });
}

void CudnnBackend::batch_norm_forward_inference(DType dtype, int64_t batch, int64_t channels,
                                                int64_t inner, double eps, const void* x,
                                                const void* weight, const void* bias,
                                                const void* mean, const void* variance,
                                                const void* /*invstd*/, void* y) {
  check_eps(eps);
  if (batch * channels * inner == 0) return;
  const size_t vector_bytes = size_t(channels) * size_t(element_size(dtype));
  Scratch ones(caching_allocator(), weight == nullptr ? vector_bytes : 0);
  Scratch zeros(caching_allocator(), bias == nullptr ? vector_bytes : 0);
  if (weight == nullptr) fill(dtype, channels, ones.get(), 1.0);
  if (bias == nullptr) fill(dtype, channels, zeros.get(), 0.0);
  launch(device(), [&] {
    HandleLease handle(*this);
    BatchNormDescriptors d(batch, channels, inner, dtype, device());
    const auto one = scale(1.0), zero = scale(0.0);
    MPIGRAD_CUDNN_CHECK(
        cudnnBatchNormalizationForwardInference(
            handle.get(), kMode, one.get(dtype), zero.get(dtype), d.data.get(), x, d.data.get(), y,
            d.params.get(), weight != nullptr ? weight : ones.get(),
            bias != nullptr ? bias : zeros.get(), mean, variance, eps),
        device());
  });
}

// Training mode is cuDNN's backward (it always writes all three gradients); eval mode, where
// mean and invstd are constants, is CudaBackend's.
void CudnnBackend::batch_norm_backward(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                                       bool training, double eps, const void* x, const void* grad_y,
                                       const void* mean, const void* invstd, const void* weight,
                                       void* grad_x, void* grad_weight, void* grad_bias) {
  if (!training) {
    batch_norm_backward_eval(dtype, batch, channels, inner, x, grad_y, mean, invstd, weight, grad_x,
                             grad_weight, grad_bias);
    return;
  }
  check_eps(eps);
  if (batch * channels * inner == 0) return;
  const size_t element = size_t(element_size(dtype));
  const size_t vector_bytes = size_t(channels) * element;
  Scratch ones(caching_allocator(), weight == nullptr ? vector_bytes : 0);
  Scratch unwanted_x(caching_allocator(),
                     grad_x == nullptr ? size_t(batch * channels * inner) * element : 0);
  Scratch unwanted_weight(caching_allocator(), grad_weight == nullptr ? vector_bytes : 0);
  Scratch unwanted_bias(caching_allocator(), grad_bias == nullptr ? vector_bytes : 0);
  if (weight == nullptr) fill(dtype, channels, ones.get(), 1.0);
  launch(device(), [&] {
    HandleLease handle(*this);
    BatchNormDescriptors d(batch, channels, inner, dtype, device());
    const auto one = scale(1.0), zero = scale(0.0);
    MPIGRAD_CUDNN_CHECK(
        cudnnBatchNormalizationBackward(
            handle.get(), kMode, one.get(dtype), zero.get(dtype), one.get(dtype), zero.get(dtype),
            d.data.get(), x, d.data.get(), grad_y, d.data.get(),
            grad_x != nullptr ? grad_x : unwanted_x.get(), d.params.get(),
            weight != nullptr ? weight : ones.get(),
            grad_weight != nullptr ? grad_weight : unwanted_weight.get(),
            grad_bias != nullptr ? grad_bias : unwanted_bias.get(), eps, mean, invstd),
        device());
  });
}

}  // namespace mpigrad::core::cuda_detail
