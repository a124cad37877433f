// LRFinderHook: drives a TrainingStrategy through the learning-rate range test
// (launch/train/lr_finder.h). It sets every group's lr before each micro-batch, and after each
// optimizer step all-reduces the step's mean loss over the ranks, so every rank records the same
// curve and stops at the same step.
#pragma once

#include <cstdint>
#include <string>

#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/train/hook.h"
#include "mpigrad/launch/train/lr_finder.h"

namespace mpigrad::launch {

class LRFinderHook final : public Hook {
 public:
  static constexpr int kOrder = 400;
  explicit LRFinderHook(LRFinderSettings settings) : finder_(settings) {}
  std::string name() const override { return "lr_finder"; }
  HookStages stages() const override {
    return {HookStage::BeforeBatch, HookStage::AfterLoss, HookStage::AfterOptimizerStep};
  }
  HookPlace place() const override { return {kOrder}; }
  void on(HookStage stage, TrainingContext& context) override;
  const LRFinder& finder() const { return finder_; }

 private:
  LRFinder finder_;
  core::Tensor loss_sum_;  // this step's micro-batch losses, on the model's device
  int64_t loss_count_ = 0;
};

}  // namespace mpigrad::launch
