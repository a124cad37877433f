// SWAHook: stochastic weight averaging in training ([train] swa_start, swa_lr), in 1-based epochs
// as ckpt-epoch<N>.h5 counts them: from epoch swa_start on, every optimizer step runs at the
// constant swa_lr (0 keeps the schedule's lr), and the weights at the end of each of those
// epochs join an equal-weight running average, kept in checkpoints (/hooks/swa/). The rest of
// SWA (recomputing BatchNorm statistics, averaging saved checkpoints) is in launch/train/swa.h.
#pragma once

#include <cstdint>
#include <string>

#include "mpigrad/launch/train/hook.h"
#include "mpigrad/nn/weight_averaging.h"

namespace mpigrad::launch {

struct SWASettings {
  int64_t start_epoch = 0;  // 1-based; 0: off
  double lr = 0.0;          // 0: the schedule's lr is kept
};

class SWAHook final : public Hook {
 public:
  static constexpr int kOrder = 1000;
  explicit SWAHook(SWASettings settings);
  std::string name() const override { return "swa"; }
  HookStages stages() const override {
    return {HookStage::BeforeBatch, HookStage::AfterOptimizerStep, HookStage::AfterBatch};
  }
  // Its lr wins over the schedule's: it sets it after the scheduler's step.
  HookPlace place() const override { return {kOrder, {"lr_scheduler"}}; }
  void on(HookStage stage, TrainingContext& context) override;
  nn::StateDict state_dict() const override { return averager_.state_dict(); }
  void load_state_dict(const nn::StateDict& state) override { averager_.load_state_dict(state); }
  const nn::SWAAverager& averager() const { return averager_; }
  const SWASettings& settings() const { return settings_; }

 private:
  bool averaging(int64_t epoch) const { return epoch + 1 >= settings_.start_epoch; }
  void set_lr(TrainingContext& context) const;

  SWASettings settings_;
  nn::SWAAverager averager_;
};

}  // namespace mpigrad::launch
