#include "mpigrad/launch/train/hooks/lr_scheduler_hook.h"

namespace mpigrad::launch {

void LRSchedulerHook::on(HookStage, TrainingContext& context) {
  if (context.scheduler != nullptr) context.scheduler->step();
}

}  // namespace mpigrad::launch
