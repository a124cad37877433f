#include "mpigrad/launch/train/hooks/swa_hook.h"

#include "mpigrad/core/error.h"

namespace mpigrad::launch {

SWAHook::SWAHook(SWASettings settings) : settings_(settings) {
  MPIGRAD_CHECK(settings.start_epoch >= 1, "SWAHook: start_epoch must be at least 1, got ",
                settings.start_epoch);
}

void SWAHook::set_lr(TrainingContext& context) const {
  if (settings_.lr <= 0 || !averaging(context.epoch)) return;
  for (nn::Optimizer* optimizer : context.optimizers) {
    for (nn::ParamGroup& group : optimizer->param_groups()) group.lr = settings_.lr;
  }
}

void SWAHook::on(HookStage stage, TrainingContext& context) {
  switch (stage) {
    // Before the first step of an epoch, and after every step (after the scheduler's own
    // update: see place()), so logs show the lr in use.
    case HookStage::BeforeBatch:
    case HookStage::AfterOptimizerStep:
      set_lr(context);
      break;
    case HookStage::AfterBatch: {
      // The epoch's last batch: averaged here, before AfterEpoch, so the epoch's checkpoint
      // already holds the average that includes it.
      const int64_t batches = context.train_loader ? context.train_loader->size() : 0;
      if (averaging(context.epoch) && context.batch_in_epoch + 1 == batches) {
        averager_.update(context.model());
      }
      break;
    }
    default:
      break;
  }
}

}  // namespace mpigrad::launch
