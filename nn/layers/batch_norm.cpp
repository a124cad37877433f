#include "mpigrad/nn/layers/batch_norm.h"

#include <sstream>
#include <typeinfo>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/nn/functional/normalization.h"

namespace mpigrad::nn {

BatchNorm::BatchNorm(const BatchNormConfig& config, std::string type_name, int min_dims,
                     int max_dims)
    : config_(config), type_name_(std::move(type_name)), min_dims_(min_dims), max_dims_(max_dims) {
  const int64_t c = config_.num_features;
  MPIGRAD_CHECK(c >= 1, type_name_, ": num_features must be >= 1, got ", c);
  if (config_.affine) {
    weight_ = &register_parameter("weight", core::ones({c}));
    bias_ = &register_parameter("bias", core::zeros({c}));
  } else {
    weight_ = bias_ = &none_;
  }
  if (config_.track_running_stats) {
    running_mean_ = &register_buffer("running_mean", core::zeros({c}));
    running_var_ = &register_buffer("running_var", core::ones({c}));
    num_batches_tracked_ = &register_buffer("num_batches_tracked", core::zeros({}, core::kInt64));
  } else {
    running_mean_ = running_var_ = num_batches_tracked_ = &none_;
  }
}

void BatchNorm::reset_running_stats() {
  if (!config_.track_running_stats) return;
  core::NoGradGuard no_grad;
  running_mean_->zero_();
  running_var_->fill_(1.0);
  num_batches_tracked_->zero_();
}

Tensor BatchNorm::forward(const Tensor& input) {
  return normalize(input, /*relu=*/false);
}

Tensor BatchNorm::forward_relu(const Tensor& input) {
  return normalize(input, /*relu=*/true);
}

Tensor BatchNorm::forward_relu_max_pool(const Tensor& input,
                                        const functional::Pool2dOptions& pool) {
  return normalize(input, /*relu=*/true, &pool);
}

bool is_plain_batch_norm(const Module& module) {
  const std::type_info& type = typeid(module);
  return type == typeid(BatchNorm) || type == typeid(BatchNorm1d) || type == typeid(BatchNorm2d);
}

Tensor batch_norm_then_relu(Module& module, const Tensor& input) {
  if (is_plain_batch_norm(module)) return static_cast<BatchNorm&>(module).forward_relu(input);
  return core::relu(module(input));
}

Tensor BatchNorm::normalize(const Tensor& input, bool relu, const functional::Pool2dOptions* pool) {
  MPIGRAD_CHECK(input.dim() >= min_dims_ && input.dim() <= max_dims_, type_name_, ": expected ",
                min_dims_ == max_dims_
                    ? std::to_string(min_dims_)
                    : std::to_string(min_dims_) + "-d or " + std::to_string(max_dims_),
                "-d input, got shape ", input.shape());
  MPIGRAD_CHECK(input.shape()[1] == config_.num_features, type_name_, ": input has ",
                input.shape()[1], " channels, expected ", config_.num_features);
  const bool use_batch_stats = is_training() || !config_.track_running_stats;
  double factor = 0.0;
  if (is_training() && config_.track_running_stats) {
    core::NoGradGuard no_grad;
    num_batches_tracked_->add_(1.0);
    factor =
        config_.momentum ? *config_.momentum : 1.0 / double(num_batches_tracked_->item<int64_t>());
  }
  // Running stats are only read or updated when tracked and (in training) wanted.
  const bool pass_running = config_.track_running_stats;
  if (pool != nullptr) {
    return functional::batch_norm_relu_max_pool2d(
        input, pass_running ? *running_mean_ : Tensor(), pass_running ? *running_var_ : Tensor(),
        *weight_, *bias_, use_batch_stats, factor, config_.eps, *pool);
  }
  const auto op = relu ? functional::batch_norm_relu : functional::batch_norm;
  return op(input, pass_running ? *running_mean_ : Tensor(),
            pass_running ? *running_var_ : Tensor(), *weight_, *bias_, use_batch_stats, factor,
            config_.eps);
}

std::string batch_norm_repr(const BatchNormConfig& config) {
  std::ostringstream out;
  out << config.num_features << ", eps=" << config.eps << ", momentum=";
  if (config.momentum) {
    out << *config.momentum;
  } else {
    out << "None";
  }
  out << ", affine=" << (config.affine ? "True" : "False")
      << ", track_running_stats=" << (config.track_running_stats ? "True" : "False");
  return out.str();
}

std::string BatchNorm::extra_repr() const {
  return batch_norm_repr(config_);
}

namespace {
BatchNormConfig make_config(int64_t n, double eps, std::optional<double> momentum, bool affine,
                            bool track) {
  BatchNormConfig c;
  c.num_features = n;
  c.eps = eps;
  c.momentum = momentum;
  c.affine = affine;
  c.track_running_stats = track;
  return c;
}
}  // namespace

BatchNorm1d::BatchNorm1d(int64_t num_features, double eps, std::optional<double> momentum,
                         bool affine, bool track_running_stats)
    : BatchNorm(make_config(num_features, eps, momentum, affine, track_running_stats),
                "BatchNorm1d", 2, 3) {}

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, std::optional<double> momentum,
                         bool affine, bool track_running_stats)
    : BatchNorm(make_config(num_features, eps, momentum, affine, track_running_stats),
                "BatchNorm2d", 4, 4) {}

}  // namespace mpigrad::nn
