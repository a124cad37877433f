#include "mpigrad/nn/optim/adam.h"

#include <map>
#include <utility>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/backend.h"

namespace mpigrad::nn {

Adam::Adam(std::vector<ParamGroupSpec> groups, const AdamOptions& options,
           bool decoupled_weight_decay)
    : Optimizer(std::move(groups), options.lr, options.weight_decay, options.beta1),
      options_(options),
      decoupled_(decoupled_weight_decay) {
  MPIGRAD_CHECK(options.eps >= 0.0, type_name(), ": invalid epsilon ", options.eps);
  MPIGRAD_CHECK(options.beta2 >= 0.0 && options.beta2 < 1.0, type_name(), ": invalid beta2 ",
                options.beta2);
  for (const ParamGroup& group : param_groups()) {
    MPIGRAD_CHECK(group.momentum >= 0.0 && group.momentum < 1.0, type_name(), ": invalid beta1 ",
                  group.momentum);
  }
}

void Adam::step() {
  core::NoGradGuard no_grad;
  // One backend call per (device, dtype), as in SGD::step.
  std::map<SlotKey, std::vector<core::AdamSlot>> slots;
  std::vector<Tensor> keep;
  size_t index = 0;
  for (ParamGroup& group : param_groups()) {
    for (Tensor& p : group.params) {
      ParamState& s = state(index++);
      if (!p.grad().defined()) continue;
      Tensor grad = checked_grad(p);
      if (s.tensors.empty()) {
        s.tensors.emplace_back("exp_avg", core::zeros_like(p).detach());
        s.tensors.emplace_back("exp_avg_sq", core::zeros_like(p).detach());
      }
      Tensor* exp_avg = s.find("exp_avg");
      Tensor* exp_avg_sq = s.find("exp_avg_sq");
      MPIGRAD_CHECK(exp_avg && exp_avg_sq, type_name(), ": state of parameter ", index - 1,
                    " lacks exp_avg / exp_avg_sq");
      ++s.step;
      kernels::AdamHyper hyper;
      hyper.lr = group.lr;
      hyper.beta1 = group.momentum;
      hyper.beta2 = options_.beta2;
      hyper.eps = options_.eps;
      hyper.weight_decay = group.weight_decay;
      hyper.decoupled_weight_decay = decoupled_;
      hyper.step = s.step;
      core::AdamSlot slot;
      slot.param = p.data_ptr();
      slot.grad = grad.data_ptr();
      slot.exp_avg = exp_avg->data_ptr();
      slot.exp_avg_sq = exp_avg_sq->data_ptr();
      slot.numel = p.numel();
      slot.hyper = hyper;
      slots[slot_key(p)].push_back(slot);
      keep.push_back(grad);
      p.storage()->bump_version();
    }
  }
  for (const auto& [key, group] : slots) {
    core::backend_for(slot_device(key))
        .adam_step(std::get<2>(key), int64_t(group.size()), group.data());
  }
}

}  // namespace mpigrad::nn
