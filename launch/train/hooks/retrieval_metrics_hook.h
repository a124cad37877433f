// RetrievalMetricsHook: stage-1 (SupCon) validation. At after_validation it embeds the validation
// loader with the encoder of the model (an nn::EncoderWithHead; launch/train/embeddings.h) and
// sets val_precision_at_1 and val_map_at_r (and val_samples), which LoggingHook writes to
// metrics.jsonl as test_precision_at_1 and test_map_at_r like every other test metric.
#pragma once

#include <string>

#include "mpigrad/launch/train/hook.h"

namespace mpigrad::launch {

class RetrievalMetricsHook final : public Hook {
 public:
  static constexpr int kOrder = 1100;
  RetrievalMetricsHook(std::string input, std::string label)
      : input_(std::move(input)), label_(std::move(label)) {}
  std::string name() const override { return "retrieval_metrics"; }
  HookStages stages() const override { return {HookStage::AfterValidation}; }
  // Its metrics are set before they are logged.
  HookPlace place() const override { return {kOrder, {}, {"logging"}}; }
  void on(HookStage stage, TrainingContext& context) override;

 private:
  std::string input_, label_;
};

}  // namespace mpigrad::launch
