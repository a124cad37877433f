// LossScalingHook: fp16 training's dynamic loss scaling (nn/optim/grad_scaler.h). It multiplies
// the backward loss by the scale (context.backward_loss; the logged context.loss stays true),
// unscales the averaged gradients before clipping sees them, and claims the optimizer step to
// skip it, on every rank alike, when the gradients overflowed. With gradient accumulation the
// scale stays fixed over a step's micro-batches. Its state (scale, growth tracker, skipped
// steps) goes into checkpoints under /hooks/loss_scaler. Under ZeRO-1 (context.zero) it unscales
// and checks the rank's gradient shards and skips the sharded step.
#pragma once

#include <string>

#include "mpigrad/launch/train/hook.h"
#include "mpigrad/nn/optim/grad_scaler.h"

namespace mpigrad::launch {

class LossScalingHook final : public Hook {
 public:
  static constexpr int kOrder = 700;
  explicit LossScalingHook(nn::GradScalerOptions options = {}) : scaler_(options) {}
  std::string name() const override { return "loss_scaler"; }
  HookStages stages() const override {
    return {HookStage::BeforeTraining, HookStage::BeforeBackward, HookStage::BeforeOptimizerStep};
  }
  // Unscales before clipping.
  HookPlace place() const override { return {kOrder, {}, {"grad_clip"}}; }
  void on(HookStage stage, TrainingContext& context) override;
  bool replaces_optimizer_step() const override { return true; }
  void optimizer_step(TrainingContext& context) override;
  nn::StateDict state_dict() const override { return scaler_.state_dict(); }
  void load_state_dict(const nn::StateDict& state) override { scaler_.load_state_dict(state); }
  const nn::GradScaler& scaler() const { return scaler_; }

 private:
  // Unscales this step's gradients (once) and returns whether they overflowed.
  bool unscale(TrainingContext& context);

  nn::GradScaler scaler_;
};

}  // namespace mpigrad::launch
