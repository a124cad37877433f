#include "mpigrad/launch/train/hooks/cuda_graph_hook.h"

#include <vector>

namespace mpigrad::launch {

core::Tensor CudaGraphHook::forward_backward(TrainingContext& context,
                                             const std::function<core::Tensor()>& compute) {
  std::vector<core::Tensor> arrays;
  for (const auto& field : context.batch->fields) arrays.push_back(field.second);
  return captured_.run(arrays, arrays_in_place_, compute, [&](CapturedStep::GradientReset reset) {
    context.model().zero_grad(reset == CapturedStep::GradientReset::Drop);
  });
}

void CudaGraphHook::optimizer_step(TrainingContext& context) {
  for (nn::Optimizer* optimizer : context.optimizers) {
    optimizer->step();
    // A graph's gradients are rewritten by every replay; dropping them would orphan its buffers.
    if (!captured_.captured()) optimizer->zero_grad();
  }
}

}  // namespace mpigrad::launch
