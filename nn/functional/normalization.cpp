#include "mpigrad/nn/functional/normalization.h"

#include <cmath>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/op_support.h"
#include "mpigrad/kernels/normalization.h"

namespace mpigrad::nn::functional {

using core::Tensor;

namespace {

void check_input(const char* name, const Tensor& input) {
  MPIGRAD_CHECK(input.defined(), name, ": undefined input");
  MPIGRAD_CHECK(!input.device().is_cuda(), name, ": CUDA path not built yet");
  MPIGRAD_CHECK(input.dtype() == core::kFloat32 || input.dtype() == core::kFloat64, name,
                ": input must be float32 or float64, got ", input.dtype());
}

// The per-channel parameter `t` as a dense tensor of `dtype`, or an undefined tensor.
Tensor dense_vector(const char* name, const char* what, const Tensor& t, int64_t n,
                    core::DType dtype) {
  if (!t.defined()) return t;
  MPIGRAD_CHECK(t.numel() == n, name, ": ", what, " has ", t.numel(), " elements, expected ", n);
  core::NoGradGuard no_grad;
  return t.detach().to(dtype).contiguous().reshape({n});
}

const void* ptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

struct BatchNormBackward final : core::Node {
  core::SavedTensor input, mean, invstd, weight;
  bool training = true, has_weight = false;
  int64_t batch = 0, channels = 0, inner = 0;
  const char* name() const override { return "BatchNormBackward"; }
  void apply(const Tensor& grad_output, std::vector<Tensor>& grads) override {
    const Tensor& x = input.get(*this);
    Tensor g = grad_output.contiguous();
    Tensor w = has_weight ? weight.get(*this) : Tensor();
    Tensor grad_x = next[0] ? core::detail::empty_on(x.shape(), x.dtype(), x.device()) : Tensor();
    Tensor grad_w = next[1] ? core::detail::empty_on({channels}, x.dtype(), x.device()) : Tensor();
    Tensor grad_b = next[2] ? core::detail::empty_on({channels}, x.dtype(), x.device()) : Tensor();
    kernels::cpu::batch_norm_backward(x.dtype(), batch, channels, inner, training, x.data_ptr(),
                                      g.data_ptr(), mean.get(*this).data_ptr(),
                                      invstd.get(*this).data_ptr(), ptr_or_null(w),
                                      grad_x.defined() ? grad_x.data_ptr() : nullptr,
                                      grad_w.defined() ? grad_w.data_ptr() : nullptr,
                                      grad_b.defined() ? grad_b.data_ptr() : nullptr);
    grads[0] = grad_x;
    grads[1] = grad_w;
    grads[2] = grad_b;
  }
  void release_saved() override {
    input.release();
    mean.release();
    invstd.release();
    weight.release();
  }
};

struct LayerNormBackward final : core::Node {
  core::SavedTensor input, mean, rstd, weight;
  bool has_weight = false;
  int64_t rows = 0, cols = 0;
  core::Shape param_shape;
  const char* name() const override { return "LayerNormBackward"; }
  void apply(const Tensor& grad_output, std::vector<Tensor>& grads) override {
    const Tensor& x = input.get(*this);
    Tensor g = grad_output.contiguous();
    Tensor w = has_weight ? weight.get(*this) : Tensor();
    Tensor grad_x = next[0] ? core::detail::empty_on(x.shape(), x.dtype(), x.device()) : Tensor();
    Tensor grad_w = next[1] ? core::detail::empty_on(param_shape, x.dtype(), x.device()) : Tensor();
    Tensor grad_b = next[2] ? core::detail::empty_on(param_shape, x.dtype(), x.device()) : Tensor();
    kernels::cpu::layer_norm_backward(x.dtype(), rows, cols, x.data_ptr(), g.data_ptr(),
                                      mean.get(*this).data_ptr(), rstd.get(*this).data_ptr(),
                                      ptr_or_null(w),
                                      grad_x.defined() ? grad_x.data_ptr() : nullptr,
                                      grad_w.defined() ? grad_w.data_ptr() : nullptr,
                                      grad_b.defined() ? grad_b.data_ptr() : nullptr);
    grads[0] = grad_x;
    grads[1] = grad_w;
    grads[2] = grad_b;
  }
  void release_saved() override {
    input.release();
    mean.release();
    rstd.release();
    weight.release();
  }
};

}  // namespace

Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double factor,
                  double eps) {
  const char* name = "batch_norm";
  check_input(name, input);
  MPIGRAD_CHECK(input.dim() >= 2, name, ": input must be [N, C, *], got shape ", input.shape());
  const int64_t batch = input.shape()[0], channels = input.shape()[1];
  const int64_t inner = batch * channels == 0 ? 0 : input.numel() / (batch * channels);
  const bool have_running = running_mean.defined() && running_var.defined();
  MPIGRAD_CHECK(training || have_running, name,
                ": eval mode needs running statistics (track_running_stats)");
  if (training) {
    MPIGRAD_CHECK(batch * inner > 1, name, ": expected more than 1 value per channel when "
                  "training, got input of shape ", input.shape());
  }
  const core::DType dtype = input.dtype();
  Tensor x, w, b;
  {
    core::NoGradGuard no_grad;
    x = input.contiguous();
  }
  w = dense_vector(name, "weight", weight, channels, dtype);
  b = dense_vector(name, "bias", bias, channels, dtype);
  Tensor mean = core::detail::empty_on({channels}, dtype, input.device());
  Tensor invstd;
  {
    core::NoGradGuard no_grad;
    if (training) {
      Tensor variance = core::detail::empty_on({channels}, dtype, input.device());
      kernels::cpu::batch_norm_statistics(dtype, batch, channels, inner, x.data_ptr(),
                                          mean.data_ptr(), variance.data_ptr());
      invstd = core::rsqrt(variance + eps);
      if (have_running) {
        MPIGRAD_CHECK(running_mean.numel() == channels && running_var.numel() == channels, name,
                      ": running statistics have ", running_mean.numel(), " elements, expected ",
                      channels);
        const double n = double(batch * inner);
        Tensor unbiased = variance * (n / (n - 1.0));
        Tensor rm = running_mean, rv = running_var;
        rm.mul_(1.0 - factor).add_(mean.to(rm.dtype()), factor);
        rv.mul_(1.0 - factor).add_(unbiased.to(rv.dtype()), factor);
      }
    } else {
      mean = dense_vector(name, "running_mean", running_mean, channels, dtype).clone();
      invstd = core::rsqrt(dense_vector(name, "running_var", running_var, channels, dtype) + eps);
    }
  }
  Tensor out = core::detail::empty_on(input.shape(), dtype, input.device());
  kernels::cpu::batch_norm_forward(dtype, batch, channels, inner, x.data_ptr(), mean.data_ptr(),
                                   invstd.data_ptr(), ptr_or_null(w), ptr_or_null(b),
                                   out.data_ptr());
  if (auto node = core::detail::record<BatchNormBackward>(out, {&input, &weight, &bias})) {
    node->input = core::SavedTensor(x);
    node->mean = core::SavedTensor(mean);
    node->invstd = core::SavedTensor(invstd);
    if (w.defined()) node->weight = core::SavedTensor(w);
    node->has_weight = w.defined();
    node->training = training;
    node->batch = batch;
    node->channels = channels;
    node->inner = inner;
  }
  return out;
}

Tensor layer_norm(const Tensor& input, const std::vector<int64_t>& normalized_shape,
                  const Tensor& weight, const Tensor& bias, double eps) {
  const char* name = "layer_norm";
  check_input(name, input);
  const int k = int(normalized_shape.size());
  MPIGRAD_CHECK(k >= 1 && input.dim() >= k, name, ": normalized shape of ", k,
                " dims does not fit input of shape ", input.shape());
  int64_t cols = 1;
  for (int i = 0; i < k; ++i) {
    MPIGRAD_CHECK(input.shape()[input.dim() - k + i] == normalized_shape[size_t(i)], name,
                  ": input of shape ", input.shape(), " does not end in the normalized shape ",
                  core::Shape(normalized_shape));
    cols *= normalized_shape[size_t(i)];
  }
  const int64_t rows = cols == 0 ? 0 : input.numel() / cols;
  const core::DType dtype = input.dtype();
  Tensor x;
  {
    core::NoGradGuard no_grad;
    x = input.contiguous();
  }
  Tensor w = dense_vector(name, "weight", weight, cols, dtype);
  Tensor b = dense_vector(name, "bias", bias, cols, dtype);
  Tensor out = core::detail::empty_on(input.shape(), dtype, input.device());
  Tensor mean = core::detail::empty_on({rows}, dtype, input.device());
  Tensor rstd = core::detail::empty_on({rows}, dtype, input.device());
  kernels::cpu::layer_norm_forward(dtype, rows, cols, eps, x.data_ptr(), ptr_or_null(w),
                                   ptr_or_null(b), out.data_ptr(), mean.data_ptr(),
                                   rstd.data_ptr());
  if (auto node = core::detail::record<LayerNormBackward>(out, {&input, &weight, &bias})) {
    node->input = core::SavedTensor(x);
    node->mean = core::SavedTensor(mean);
    node->rstd = core::SavedTensor(rstd);
    if (w.defined()) node->weight = core::SavedTensor(w);
    node->has_weight = w.defined();
    node->rows = rows;
    node->cols = cols;
    node->param_shape = core::Shape(normalized_shape);
  }
  return out;
}

}  // namespace mpigrad::nn::functional
