// The CUDA paths of LayerNorm and the fused optimizers: argument checks, the device and stream,
// then the hand-written kernels of kernels/cuda (normalization.cu, optimizer.cu).
#include "mpigrad/nn/cuda/cuda_ops.h"

#include "mpigrad/kernels/normalization.h"
#include "mpigrad/nn/cuda/cuda_support.cuh"

namespace mpigrad::nn::cuda_ops {

using core::Tensor;

namespace {

const void* ptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
void* out_or_null(Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

}  // namespace

void layer_norm_forward(int64_t rows, int64_t cols, double eps, const Tensor& x,
                        const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean,
                        Tensor& rstd) {
  detail::on_device(x.device(), [&] {
    kernels::cuda::layer_norm_forward(x.dtype(), rows, cols, eps, x.data_ptr(),
                                      ptr_or_null(weight), ptr_or_null(bias), y.data_ptr(),
                                      mean.data_ptr(), rstd.data_ptr(),
                                      detail::current_stream_of(x.device()));
  });
}

void layer_norm_backward(int64_t rows, int64_t cols, const Tensor& x, const Tensor& grad_y,
                         const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                         Tensor& grad_x, Tensor& grad_weight, Tensor& grad_bias) {
  detail::on_device(x.device(), [&] {
    kernels::cuda::layer_norm_backward(x.dtype(), rows, cols, x.data_ptr(), grad_y.data_ptr(),
                                       mean.data_ptr(), rstd.data_ptr(), ptr_or_null(weight),
                                       out_or_null(grad_x), out_or_null(grad_weight),
                                       out_or_null(grad_bias),
                                       detail::current_stream_of(x.device()));
  });
}

void sgd_step_multi(core::Device device, core::DType dtype,
                    const std::vector<kernels::cuda::SgdSlot>& slots) {
  if (slots.empty()) return;
  detail::on_device(device, [&] {
    // The slot array lives in stream-ordered scratch: freed after this call, reused only by
    // work queued after the kernel on the same stream.
    Tensor scratch = detail::workspace(device, kernels::cuda::sgd_slots_bytes(int64_t(slots.size())));
    kernels::cuda::sgd_step_multi(dtype, int64_t(slots.size()), slots.data(), scratch.data_ptr(),
                                  detail::current_stream_of(device));
  });
}

void adam_step_multi(core::Device device, core::DType dtype,
                     const std::vector<kernels::cuda::AdamSlot>& slots) {
  if (slots.empty()) return;
  detail::on_device(device, [&] {
    Tensor scratch =
        detail::workspace(device, kernels::cuda::adam_slots_bytes(int64_t(slots.size())));
    kernels::cuda::adam_step_multi(dtype, int64_t(slots.size()), slots.data(), scratch.data_ptr(),
                                   detail::current_stream_of(device));
  });
}

}  // namespace mpigrad::nn::cuda_ops
