#include "mpigrad/launch/train/hooks/ema_hook.h"

namespace mpigrad::launch {

void EMAHook::on(HookStage stage, TrainingContext& context) {
  if (stage == HookStage::BeforeTraining && ema_->num_updates() == 0) {
    // Start from the weights training starts from: after a resume without EMA state, and after
    // DDP's broadcast of rank 0's weights.
    ema_ = std::make_unique<nn::ModelEMA>(context.model(), ema_->decay());
  } else if (stage == HookStage::AfterOptimizerStep) {
    ema_->update(context.model());
  }
}

nn::Module* EMAHook::evaluation_model(TrainingContext&) {
  if (evaluation_copy_ == nullptr) return nullptr;
  ema_->copy_to(*evaluation_copy_);
  return evaluation_copy_.get();
}

}  // namespace mpigrad::launch
