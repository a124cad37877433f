#include "mpigrad/launch/train/hooks/loss_scaling_hook.h"

#include <cstdio>
#include <vector>

#include "mpigrad/launch/ddp/zero_redundancy.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/nn/optim/optimizer.h"

namespace mpigrad::launch {
namespace {

std::vector<core::Tensor> parameters_of(const TrainingContext& context) {
  std::vector<core::Tensor> parameters;
  for (nn::Optimizer* optimizer : context.optimizers) {
    for (const nn::ParamGroup& group : optimizer->param_groups()) {
      parameters.insert(parameters.end(), group.params.begin(), group.params.end());
    }
  }
  return parameters;
}

}  // namespace

void LossScalingHook::on(HookStage stage, TrainingContext& context) {
  if (stage == HookStage::BeforeTraining) {
    if (!context.reports()) return;
    std::printf(
        "mpigrad train: fp16 loss scale %g (%lld clean steps toward growth, %lld skipped)\n",
        scaler_.get_scale(), static_cast<long long>(scaler_.growth_tracker()),
        static_cast<long long>(scaler_.skipped_steps()));
  } else if (stage == HookStage::BeforeBackward) {
    context.backward_loss = scaler_.scale(context.backward_loss);
  } else if (stage == HookStage::BeforeOptimizerStep) {
    unscale(context);
  }
}

bool LossScalingHook::unscale(TrainingContext& context) {
  // Under ZeRO-1 a rank's averaged gradients are its shards; the verdict is the same on every
  // rank (launch/ddp/zero_redundancy.h). Once per step: a second call returns the first's.
  if (context.zero != nullptr) return context.zero->unscale_(scaler_);
  return scaler_.unscale_(parameters_of(context));
}

void LossScalingHook::optimizer_step(TrainingContext& context) {
  if (context.zero != nullptr) {
    if (unscale(context)) {
      context.zero->skip_step();  // on every rank alike; resets the gradients as step() does
    } else {
      context.zero->step();
    }
  } else {
    for (nn::Optimizer* optimizer : context.optimizers) {
      scaler_.step(*optimizer);  // skipped, on every rank alike, when the gradients overflowed
      optimizer->zero_grad();
    }
  }
  scaler_.update();
}

}  // namespace mpigrad::launch
