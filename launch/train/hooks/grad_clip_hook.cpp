#include "mpigrad/launch/train/hooks/grad_clip_hook.h"

#include "mpigrad/launch/ddp/zero_redundancy.h"
#include "mpigrad/nn/optim/clip_grad.h"

namespace mpigrad::launch {

void GradClipHook::on(HookStage, TrainingContext& context) {
  last_norm_ = context.zero != nullptr
                   ? context.zero->clip_grad_norm(max_norm_)
                   : nn::clip_grad_norm_(context.model().parameters(), max_norm_);
}

}  // namespace mpigrad::launch
