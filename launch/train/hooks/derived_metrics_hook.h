// DerivedMetricsHook: validation figures that are not a mean of per-sample values, made exact.
// The strategy's validation averages each metric of the evaluation function over the samples of
// the whole set (every rank's sums all-reduced). A figure such as the force MAE over all atoms of
// all structures is a ratio of two such sums, and an RMSE is the root of one; so the evaluation
// function returns the per-sample numerator and denominator, and at after_validation this hook
// sets val_<name> = val_<numerator> / val_<denominator> (optionally its square root) and drops
// the two parts. The ratio of the two global means is the ratio of the two global sums: exact on
// any number of ranks. It runs before logging, which writes the results.
#pragma once

#include <string>
#include <vector>

#include "mpigrad/launch/train/hook.h"

namespace mpigrad::launch {

// val_<name> = val_<numerator> / val_<denominator> (no denominator: val_<numerator>), its square
// root when `root`.
struct DerivedMetric {
  std::string name, numerator, denominator;
  bool root = false;
};

class DerivedMetricsHook final : public Hook {
 public:
  static constexpr int kOrder = 1150;
  explicit DerivedMetricsHook(std::vector<DerivedMetric> metrics) : metrics_(std::move(metrics)) {}
  std::string name() const override { return "derived_metrics"; }
  HookStages stages() const override { return {HookStage::AfterValidation}; }
  HookPlace place() const override { return {kOrder, {}, {"logging"}}; }
  void on(HookStage stage, TrainingContext& context) override;
  const std::vector<DerivedMetric>& metrics() const { return metrics_; }

 private:
  std::vector<DerivedMetric> metrics_;
};

}  // namespace mpigrad::launch
