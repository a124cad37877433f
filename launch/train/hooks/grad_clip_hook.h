// GradClipHook: clips the global gradient norm to [train] clip_grad_norm before each optimizer
// step. Under ZeRO-1 each rank's averaged gradients are its shards, and the norm is taken over
// all of them (launch/ddp/zero_redundancy.h).
#pragma once

#include <string>

#include "mpigrad/launch/train/hook.h"

namespace mpigrad::launch {

class GradClipHook final : public Hook {
 public:
  static constexpr int kOrder = 800;
  explicit GradClipHook(double max_norm) : max_norm_(max_norm) {}
  std::string name() const override { return "grad_clip"; }
  HookStages stages() const override { return {HookStage::BeforeOptimizerStep}; }
  // Clipping must see true gradients: after the loss scaler has unscaled them.
  HookPlace place() const override { return {kOrder, {"loss_scaler"}}; }
  void on(HookStage stage, TrainingContext& context) override;
  double last_norm() const { return last_norm_; }

 private:
  double max_norm_;
  double last_norm_ = 0;
};

}  // namespace mpigrad::launch
