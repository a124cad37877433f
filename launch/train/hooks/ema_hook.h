// EMAHook: keeps an exponential moving average of the weights ([train] ema_decay), updated
// after every optimizer step, and offers it to validation when given a model to hold it. The
// average is hook state: checkpoints keep it under /hooks/ema/.
#pragma once

#include <memory>
#include <string>

#include "mpigrad/launch/train/hook.h"
#include "mpigrad/nn/weight_averaging.h"

namespace mpigrad::launch {

class EMAHook final : public Hook {
 public:
  static constexpr int kOrder = 900;
  // Averages `model` after every optimizer step. With `evaluation_copy` (a model of the same
  // architecture, on the same device) validation evaluates the averaged weights, loaded into it.
  EMAHook(const nn::Module& model, double decay = 0.999,
          std::shared_ptr<nn::Module> evaluation_copy = nullptr)
      : ema_(std::make_unique<nn::ModelEMA>(model, decay)),
        evaluation_copy_(std::move(evaluation_copy)) {}
  std::string name() const override { return "ema"; }
  HookStages stages() const override {
    return {HookStage::BeforeTraining, HookStage::AfterOptimizerStep};
  }
  HookPlace place() const override { return {kOrder}; }
  void on(HookStage stage, TrainingContext& context) override;
  nn::ModelEMA& ema() { return *ema_; }
  nn::StateDict state_dict() const override { return ema_->state_dict(); }
  void load_state_dict(const nn::StateDict& state) override { ema_->load_state_dict(state); }
  nn::Module* evaluation_model(TrainingContext& context) override;

 private:
  std::unique_ptr<nn::ModelEMA> ema_;
  std::shared_ptr<nn::Module> evaluation_copy_;
};

}  // namespace mpigrad::launch
