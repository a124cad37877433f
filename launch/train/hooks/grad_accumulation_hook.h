// GradAccumulationHook: k micro-batches per optimizer step ([train] grad_accum_steps). It sets
// context.accumulation_steps, which the strategy steps by, and divides each micro-batch's
// backward loss by k, so the summed gradients are those of the mean loss. DDPHook keeps the
// gradients of every micro-batch but the last local (no_sync), so a step waits for one
// all-reduce.
#pragma once

#include <cstdint>
#include <string>

#include "mpigrad/launch/train/hook.h"

namespace mpigrad::launch {

class GradAccumulationHook final : public Hook {
 public:
  static constexpr int kOrder = 600;
  explicit GradAccumulationHook(int64_t steps);
  std::string name() const override { return "grad_accumulation"; }
  HookStages stages() const override { return {HookStage::Setup, HookStage::BeforeBackward}; }
  // Divides before the loss scaler multiplies (PyTorch's order: scaler.scale(loss / k)).
  HookPlace place() const override { return {kOrder, {}, {"loss_scaler"}}; }
  void on(HookStage stage, TrainingContext& context) override;

 private:
  int64_t steps_;
};

}  // namespace mpigrad::launch
