#include "mpigrad/nn/optim/adam.h"

#include <utility>
#include <vector>

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
  step_batched<core::AdamSlot>(
      [&](const Update& u) {
        ParamState& s = u.state;
        if (s.tensors.empty()) {
          s.tensors.emplace_back("exp_avg", core::zeros_like(u.param).detach());
          s.tensors.emplace_back("exp_avg_sq", core::zeros_like(u.param).detach());
        }
        Tensor* exp_avg = s.find("exp_avg");
        Tensor* exp_avg_sq = s.find("exp_avg_sq");
        MPIGRAD_CHECK(exp_avg && exp_avg_sq, type_name(), ": state of parameter ", u.index,
                      " lacks exp_avg / exp_avg_sq");
        ++s.step;
        kernels::AdamHyper hyper;
        hyper.lr = u.group.lr;
        hyper.beta1 = u.group.momentum;
        hyper.beta2 = options_.beta2;
        hyper.eps = options_.eps;
        hyper.weight_decay = u.group.weight_decay;
        hyper.decoupled_weight_decay = decoupled_;
        hyper.step = s.step;
        core::AdamSlot slot;
        slot.param = u.param.data_ptr();
        slot.grad = u.grad.data_ptr();
        slot.exp_avg = exp_avg->data_ptr();
        slot.exp_avg_sq = exp_avg_sq->data_ptr();
        slot.numel = u.param.numel();
        slot.hyper = hyper;
        return slot;
      },
      [](core::Device device, core::DType dtype, std::vector<core::AdamSlot>& slots) {
        core::backend_for(device).adam_step(dtype, int64_t(slots.size()), slots.data());
      });
}

}  // namespace mpigrad::nn
