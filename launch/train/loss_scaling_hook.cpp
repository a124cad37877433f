#include "mpigrad/launch/train/loss_scaling_hook.h"

#include <cstdio>
#include <vector>

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
  if (stage == HookStage::BeforeTraining && context.manager->is_main_process()) {
    // After CheckpointHook's Setup: a resumed run shows the scale it continues from.
    std::printf(
        "mpigrad train: fp16 loss scale %g (%lld clean steps toward growth, %lld skipped)\n",
        scaler_.get_scale(), static_cast<long long>(scaler_.growth_tracker()),
        static_cast<long long>(scaler_.skipped_steps()));
  } else if (stage == HookStage::BeforeBackward) {
    context.loss = scaler_.scale(context.loss);
  } else if (stage == HookStage::BeforeOptimizerStep) {
    scaler_.unscale_(parameters_of(context));
  }
}

void LossScalingHook::optimizer_step(TrainingContext& context) {
  for (nn::Optimizer* optimizer : context.optimizers) {
    scaler_.step(*optimizer);
    optimizer->zero_grad();
  }
  scaler_.update();
}

}  // namespace mpigrad::launch
