#include "mpigrad/nn/optim/grad_scaler.h"

#include <cmath>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"

namespace mpigrad::nn {

GradScaler::GradScaler(GradScalerOptions options) : options_(options), scale_(options.init_scale) {
  MPIGRAD_CHECK(std::isfinite(options.init_scale) && options.init_scale > 0,
                "GradScaler: ", "init_scale must be positive and finite, got ", options.init_scale);
  MPIGRAD_CHECK(options.growth_factor > 1, "GradScaler: growth_factor must be > 1, got ",
                options.growth_factor);
  MPIGRAD_CHECK(options.backoff_factor > 0 && options.backoff_factor < 1,
                "GradScaler: backoff_factor must be in (0, 1), got ", options.backoff_factor);
  MPIGRAD_CHECK(options.growth_interval >= 1, "GradScaler: growth_interval must be >= 1, got ",
                options.growth_interval);
}

core::Tensor GradScaler::scale(const core::Tensor& loss) const {
  return loss * scale_;
}

bool GradScaler::unscale_(const std::vector<core::Tensor>& parameters) {
  std::vector<core::Tensor> gradients;
  for (const core::Tensor& p : parameters) {
    core::Tensor grad = p.grad();
    if (grad.defined()) gradients.push_back(std::move(grad));
  }
  return unscale_gradients_(gradients);
}

bool GradScaler::unscale_gradients_(const std::vector<core::Tensor>& gradients) {
  if (unscaled_) return found_inf_;
  core::NoGradGuard no_grad;
  const double inverse = 1.0 / scale_;
  // One sum of grad * 0 per gradient, added up on the device and read once: 0, or NaN iff some
  // element is inf or NaN (zeros cannot overflow, so no wider copy of the gradient is needed).
  core::Tensor total;
  for (core::Tensor grad : gradients) {
    grad.mul_(inverse);
    core::Tensor partial = core::sum(grad * 0.0);
    total = total.defined() ? total + partial : partial;
  }
  found_inf_ = total.defined() && !std::isfinite(total.item<double>());
  unscaled_ = true;
  return found_inf_;
}

bool GradScaler::step(Optimizer& optimizer) {
  if (!unscaled_) {
    std::vector<core::Tensor> parameters;
    for (const ParamGroup& group : optimizer.param_groups()) {
      parameters.insert(parameters.end(), group.params.begin(), group.params.end());
    }
    unscale_(parameters);
  }
  if (found_inf_) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (found_inf_) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    ++skipped_steps_;
  } else if (++growth_tracker_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
  unscaled_ = false;
  found_inf_ = false;
}

StateDict GradScaler::state_dict() const {
  StateDict state;
  state.set_scalar("scale", scale_);
  state.set_scalar("growth_tracker", double(growth_tracker_));
  state.set_scalar("skipped_steps", double(skipped_steps_));
  return state;
}

void GradScaler::load_state_dict(const StateDict& state) {
  const double scale = state.scalar("scale", "GradScaler.load_state_dict");
  MPIGRAD_CHECK(std::isfinite(scale) && scale > 0,
                "GradScaler.load_state_dict: 'scale' must be positive and finite, got ", scale);
  scale_ = scale;
  growth_tracker_ = int64_t(state.scalar("growth_tracker", "GradScaler.load_state_dict"));
  const double* skipped = state.find_scalar("skipped_steps");
  skipped_steps_ = skipped ? int64_t(*skipped) : 0;
  unscaled_ = false;
  found_inf_ = false;
}

}  // namespace mpigrad::nn
