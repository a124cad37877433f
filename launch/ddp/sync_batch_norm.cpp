#include "mpigrad/launch/ddp/sync_batch_norm.h"

#include <utility>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/join.h"
#include "mpigrad/core/ops/op_support.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/nn/functional/normalization.h"

namespace mpigrad::launch {

using core::Tensor;

namespace {

// [C] -> [1, C, 1], to broadcast over a [N, C, inner] view.
Tensor per_channel(const Tensor& vector) {
  return vector.reshape({1, vector.numel(), 1});
}

// The gradient of the global batch with respect to this rank's input, given the global
// statistics. With g = dL/dy and xhat = (x - mean) * invstd over the whole batch of `total`
// elements per channel:
//   dL/dx = weight * invstd * (g - sum(g) / total - xhat * sum(g * xhat) / total)
// where both sums run over every rank's batch: the one all-reduce of the backward.
struct SyncBatchNormBackward final : core::Node {
  core::SavedTensor input, mean, invstd, weight;  // input as dense [N, C, inner]
  bool has_weight = false;
  double total = 0;  // elements per channel over all ranks
  core::Shape input_shape;
  Communicator* communicator = nullptr;

  const char* name() const override { return "SyncBatchNormBackward"; }
  void apply(const Tensor& grad_output, std::vector<Tensor>& grads) override {
    const Tensor& x = input.get(*this);
    const int64_t channels = x.shape()[1];
    Tensor g = grad_output.contiguous().reshape(x.shape());
    Tensor xhat = (x - per_channel(mean.get(*this))) * per_channel(invstd.get(*this));
    Tensor sum_dy = core::sum(g, {0, 2});
    Tensor sum_dy_xhat = core::sum(g * xhat, {0, 2});
    grads[1] = next[1] ? sum_dy_xhat : Tensor();
    grads[2] = next[2] ? sum_dy : Tensor();
    grads[0] = Tensor();
    if (!next[0]) return;
    // One fused all-reduce of [2C]: both sums for every channel. Every rank's graph has the same
    // shape, so every rank gets here in the same order.
    Tensor global = core::cat({sum_dy, sum_dy_xhat});
    communicator->all_reduce(global, ReduceOp::Sum);
    Tensor mean_dy = global.narrow(0, 0, channels) / total;
    Tensor mean_dy_xhat = global.narrow(0, channels, channels) / total;
    Tensor scale = has_weight ? invstd.get(*this) * weight.get(*this) : invstd.get(*this);
    Tensor grad_x =
        (g - per_channel(mean_dy) - xhat * per_channel(mean_dy_xhat)) * per_channel(scale);
    grads[0] = grad_x.reshape(input_shape);
  }
  void release_saved() override {
    input.release();
    mean.release();
    invstd.release();
    weight.release();
  }
};

}  // namespace

SyncBatchNorm::SyncBatchNorm(const nn::BatchNormConfig& config, Communicator& communicator)
    : SyncBatchNorm(config, communicator, nullptr) {}

SyncBatchNorm::SyncBatchNorm(const nn::BatchNormConfig& config, Communicator& communicator,
                             nn::BatchNorm* source)
    : config_(config), communicator_(communicator) {
  const int64_t c = config_.num_features;
  MPIGRAD_CHECK(c >= 1, "SyncBatchNorm: num_features must be >= 1, got ", c);
  // From a BatchNorm: the very same parameter tensors (an optimizer holding them still works)
  // and buffers sharing its storage.
  auto take = [&](const char* name, bool parameter, Tensor fresh) {
    if (source == nullptr) return fresh;
    return parameter ? source->parameter(name) : source->buffer(name);
  };
  if (config_.affine) {
    weight_ = &register_parameter("weight", take("weight", true, core::ones({c})));
    bias_ = &register_parameter("bias", take("bias", true, core::zeros({c})));
  } else {
    weight_ = bias_ = &none_;
  }
  if (config_.track_running_stats) {
    running_mean_ = &register_buffer("running_mean", take("running_mean", false, core::zeros({c})));
    running_var_ = &register_buffer("running_var", take("running_var", false, core::ones({c})));
    num_batches_tracked_ = &register_buffer(
        "num_batches_tracked", take("num_batches_tracked", false, core::zeros({}, core::kInt64)));
  } else {
    running_mean_ = running_var_ = num_batches_tracked_ = &none_;
  }
  if (source != nullptr) train(source->is_training());
}

std::shared_ptr<SyncBatchNorm> SyncBatchNorm::from_batch_norm(nn::BatchNorm& batch_norm,
                                                              Communicator& communicator) {
  return std::shared_ptr<SyncBatchNorm>(
      new SyncBatchNorm(batch_norm.config(), communicator, &batch_norm));
}

Tensor SyncBatchNorm::forward(const Tensor& input) {
  MPIGRAD_CHECK(input.defined() && input.dim() >= 2,
                "SyncBatchNorm: expected input of shape [N, C, *], got ",
                input.defined() ? input.shape() : core::Shape{});
  MPIGRAD_CHECK(input.shape()[1] == config_.num_features, "SyncBatchNorm: input has ",
                input.shape()[1], " channels, expected ", config_.num_features);
  MPIGRAD_CHECK(input.dtype() == core::kFloat32 || input.dtype() == core::kFloat64,
                "SyncBatchNorm: input must be float32 or float64, got ", input.dtype());
  const bool track = config_.track_running_stats;
  if (!is_training()) {
    // Eval: running statistics, no communication; without them, the local batch's (PyTorch
    // synchronizes only in training mode).
    return nn::functional::batch_norm(input, track ? *running_mean_ : Tensor(),
                                      track ? *running_var_ : Tensor(), *weight_, *bias_,
                                      /*training=*/!track, 0.0, config_.eps);
  }
  double factor = 0.0;
  if (track) {
    core::NoGradGuard no_grad;
    num_batches_tracked_->add_(1.0);
    factor =
        config_.momentum ? *config_.momentum : 1.0 / double(num_batches_tracked_->item<int64_t>());
  }
  return forward_global_statistics(input, factor);
}

Tensor SyncBatchNorm::forward_global_statistics(const Tensor& input, double factor) {
  const int64_t batch = input.shape()[0], channels = input.shape()[1];
  const int64_t inner = batch * channels == 0 ? 0 : input.numel() / (batch * channels);
  const core::DType dtype = input.dtype();
  Tensor x, mean, invstd, weight, output;
  double total = 0;
  {
    core::NoGradGuard no_grad;
    x = input.detach().contiguous().reshape({batch, channels, inner});
    // Sums in float64 whatever the data type: the variance comes out of sum of squares minus
    // squared sum, which float32 would cancel badly.
    const core::TensorOptions float64 = core::TensorOptions(core::kFloat64).device(input.device());
    Tensor sums = core::zeros({channels}, float64);
    Tensor squares = core::zeros({channels}, float64);
    if (batch * inner > 0) {
      Tensor x64 = x.to(core::kFloat64);
      sums = core::sum(x64, {0, 2});
      squares = core::sum(x64 * x64, {0, 2});
    }
    Tensor count = core::full({1}, double(batch * inner), float64);
    Tensor statistics = core::cat({sums, squares, count});
    communicator_.all_reduce(statistics, ReduceOp::Sum);
    total = statistics.narrow(0, 2 * channels, 1).item<double>();
    MPIGRAD_CHECK(total > 1, "SyncBatchNorm: expected more than 1 value per channel over all ",
                  communicator_.size(), " ranks of communicator '", communicator_.name(),
                  "' when training, got ", total, " (local input of shape ", input.shape(), ")");
    Tensor mean64 = statistics.narrow(0, 0, channels) / total;
    Tensor variance64 =
        core::clamp(statistics.narrow(0, channels, channels) / total - mean64 * mean64, 0.0, 1e300);
    mean = mean64.to(dtype);
    invstd = core::rsqrt(variance64 + config_.eps).to(dtype);
    if (config_.track_running_stats) {
      Tensor unbiased = variance64 * (total / (total - 1.0));
      running_mean_->mul_(1.0 - factor).add_(mean64.to(running_mean_->dtype()), factor);
      running_var_->mul_(1.0 - factor).add_(unbiased.to(running_var_->dtype()), factor);
    }
    if (weight_->defined()) weight = weight_->detach().to(dtype).contiguous().reshape({channels});
    Tensor scale = weight.defined() ? invstd * weight : invstd;
    output = (x - per_channel(mean)) * per_channel(scale);
    if (bias_->defined()) output = output + per_channel(bias_->detach().to(dtype));
    output = output.reshape(input.shape());
  }
  if (auto node = core::detail::record<SyncBatchNormBackward>(output, {&input, weight_, bias_})) {
    node->input = core::SavedTensor(x);
    node->mean = core::SavedTensor(mean);
    node->invstd = core::SavedTensor(invstd);
    if (weight.defined()) node->weight = core::SavedTensor(weight);
    node->has_weight = weight.defined();
    node->total = total;
    node->input_shape = input.shape();
    node->communicator = &communicator_;
  }
  return output;
}

std::string SyncBatchNorm::extra_repr() const {
  return nn::batch_norm_repr(config_);
}

int convert_sync_batchnorm(nn::Module& module, Communicator& communicator) {
  int replaced = 0;
  // Iterative walk over (parent, child name, child): deep trees do not recurse.
  std::vector<nn::Module*> parents{&module};
  while (!parents.empty()) {
    nn::Module* parent = parents.back();
    parents.pop_back();
    for (auto& [name, child] : parent->named_children()) {
      auto* batch_norm = dynamic_cast<nn::BatchNorm*>(child.get());
      if (batch_norm != nullptr) {
        parent->replace_child(name, SyncBatchNorm::from_batch_norm(*batch_norm, communicator));
        ++replaced;
      } else {
        parents.push_back(child.get());
      }
    }
  }
  return replaced;
}

}  // namespace mpigrad::launch
