#include "mpigrad/launch/train/hooks/grad_accumulation_hook.h"

#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"

namespace mpigrad::launch {

GradAccumulationHook::GradAccumulationHook(int64_t steps) : steps_(steps) {
  MPIGRAD_CHECK(steps >= 1, "GradAccumulationHook: steps must be at least 1, got ", steps);
}

void GradAccumulationHook::on(HookStage stage, TrainingContext& context) {
  if (stage == HookStage::Setup) {
    context.accumulation_steps = steps_;
  } else if (stage == HookStage::BeforeBackward && steps_ > 1) {
    context.backward_loss = context.backward_loss / double(steps_);
  }
}

}  // namespace mpigrad::launch
