// LRSchedulerHook: steps the run's scheduler (context.scheduler) after every optimizer step. The
// scheduler's state lives in checkpoints' /scheduler, not in this hook.
#pragma once

#include <string>

#include "mpigrad/launch/train/hook.h"

namespace mpigrad::launch {

class LRSchedulerHook final : public Hook {
 public:
  static constexpr int kOrder = 500;
  std::string name() const override { return "lr_scheduler"; }
  HookStages stages() const override { return {HookStage::AfterOptimizerStep}; }
  HookPlace place() const override { return {kOrder}; }
  void on(HookStage stage, TrainingContext& context) override;
};

}  // namespace mpigrad::launch
