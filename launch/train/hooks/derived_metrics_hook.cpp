#include "mpigrad/launch/train/hooks/derived_metrics_hook.h"

#include <cmath>
#include <set>

#include "mpigrad/core/error.h"

namespace mpigrad::launch {

void DerivedMetricsHook::on(HookStage stage, TrainingContext& context) {
  if (stage != HookStage::AfterValidation || context.metrics.empty()) return;
  std::map<std::string, double>& metrics = context.metrics;
  const auto value = [&](const std::string& name) {
    auto found = metrics.find("val_" + name);
    MPIGRAD_CHECK(found != metrics.end(), "DerivedMetricsHook: validation gave no metric '", name,
                  "'");
    return found->second;
  };
  std::set<std::string> parts;
  for (const DerivedMetric& metric : metrics_) {
    double result = value(metric.numerator);
    parts.insert(metric.numerator);
    if (!metric.denominator.empty()) {
      const double denominator = value(metric.denominator);
      result = denominator > 0 ? result / denominator : 0.0;
      parts.insert(metric.denominator);
    }
    if (metric.root) result = std::sqrt(std::max(result, 0.0));
    metrics["val_" + metric.name] = result;
  }
  for (const std::string& part : parts) metrics.erase("val_" + part);
}

}  // namespace mpigrad::launch
