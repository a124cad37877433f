#include "mpigrad/launch/train/hooks/lr_finder_hook.h"

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/launch/job/distributed_manager.h"

namespace mpigrad::launch {

void LRFinderHook::on(HookStage stage, TrainingContext& context) {
  switch (stage) {
    case HookStage::BeforeBatch: {
      const double lr = finder_.lr(context.step);
      for (nn::Optimizer* optimizer : context.optimizers) {
        for (nn::ParamGroup& group : optimizer->param_groups()) group.lr = lr;
      }
      break;
    }
    case HookStage::AfterLoss: {
      core::NoGradGuard no_grad;
      core::Tensor loss = context.loss.detach().reshape({}).to(core::kFloat64);
      loss_sum_ = loss_sum_.defined() ? loss_sum_ + loss : loss;
      ++loss_count_;
      break;
    }
    case HookStage::AfterOptimizerStep: {
      // Every rank records the same number: the mean over ranks of their mean losses.
      const double local = loss_count_ > 0 ? loss_sum_.item<double>() / double(loss_count_) : 0.0;
      core::Tensor total = core::Tensor::from_vector<double>({local}, {1});
      context.manager->world().all_reduce(total, ReduceOp::Sum);
      const double loss = total.item<double>() / double(context.manager->world_size());
      loss_sum_ = core::Tensor();
      loss_count_ = 0;
      if (!finder_.record(loss)) context.stop = true;
      break;
    }
    default:
      break;
  }
}

}  // namespace mpigrad::launch
