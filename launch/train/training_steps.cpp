#include "mpigrad/launch/train/training_steps.h"

#include "mpigrad/core/autocast.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"

namespace mpigrad::launch {

namespace {
// One integer label per sample, as int64 [batch] (the file may store any integer dtype, or
// [batch, 1]).
core::Tensor labels_of(const data::Batch& batch, const std::string& label) {
  const core::Tensor& stored = batch[label];
  MPIGRAD_CHECK(!core::is_floating(stored.dtype()), "label field '", label, "' is ", stored.dtype(),
                "; class labels must be integers");
  MPIGRAD_CHECK(stored.numel() == batch.size(), "label field '", label, "' has shape ",
                stored.shape(), "; expected one label per sample");
  return stored.reshape({batch.size()}).to(core::kInt64);
}

// The labels for `logits`: [batch] for [batch, C]; for dense predictions [batch, C, d1, ...],
// int64 [batch, d1, ...] (a segmentation map, a sequence's next tokens).
core::Tensor labels_for(const data::Batch& batch, const std::string& label,
                        const core::Tensor& logits) {
  if (logits.dim() <= 2) return labels_of(batch, label);
  const core::Tensor& stored = batch[label];
  MPIGRAD_CHECK(!core::is_floating(stored.dtype()), "label field '", label, "' is ", stored.dtype(),
                "; class labels must be integers");
  core::Shape expected = logits.shape();
  expected.erase(1);
  MPIGRAD_CHECK(stored.numel() == expected.numel(), "label field '", label, "' has shape ",
                stored.shape(), " but the model's logits ", logits.shape(), " need labels ",
                expected, " (logits [batch, classes, d1, ...], labels [batch, d1, ...])");
  return stored.reshape(expected).to(core::kInt64);
}

// The prediction and the target, both [batch, values per sample], the target in the
// prediction's dtype.
std::pair<core::Tensor, core::Tensor> flat_pair(const core::Tensor& prediction,
                                                const data::Batch& batch,
                                                const std::string& target) {
  const core::Tensor& stored = batch[target];
  const int64_t n = batch.size();
  MPIGRAD_CHECK(
      prediction.dim() >= 1 && prediction.size(0) == n && stored.numel() == prediction.numel(),
      "target field '", target, "' has shape ", stored.shape(), " but the model predicts ",
      prediction.shape(), "; they must hold the same number of values per sample");
  return {prediction.reshape({n, -1}), stored.reshape({n, -1}).to(prediction.dtype())};
}

// Names the label field in the error about a bad label (checked on the device on a GPU).
nn::CrossEntropyOptions options_for(const std::string& label, nn::Reduction reduction) {
  nn::CrossEntropyOptions options;
  options.reduction = reduction;
  options.labels_name = "label field '" + label + "'";
  return options;
}
}  // namespace

StepFunction classification_step(std::string input, std::string label) {
  return [input, label](nn::Module& model, const data::Batch& batch) {
    core::Tensor logits = model(batch[input]);
    return nn::cross_entropy(logits, labels_for(batch, label, logits),
                             options_for(label, nn::Reduction::Mean));
  };
}

EvalFunction classification_metrics(std::string input, std::string label) {
  return [input, label](nn::Module& model, const data::Batch& batch) {
    core::Tensor logits = model(batch[input]);
    core::Tensor labels = labels_for(batch, label, logits);
    std::map<std::string, core::Tensor> metrics;
    metrics["loss"] = nn::cross_entropy(logits, labels, options_for(label, nn::Reduction::None));
    metrics["accuracy"] = core::eq(core::argmax(logits, 1), labels).to(core::kFloat64);
    if (logits.dim() > 2) {
      // Dense predictions: each sample's mean over its positions.
      const int64_t n = logits.size(0);
      metrics["loss"] = core::mean(metrics["loss"].reshape({n, -1}), {1});
      metrics["accuracy"] = core::mean(metrics["accuracy"].reshape({n, -1}), {1});
    }
    return metrics;
  };
}

StepFunction regression_step(std::string input, std::string target, RegressionLoss loss) {
  MPIGRAD_CHECK(loss != nullptr, "regression_step: no loss given");
  return [input, target, loss](nn::Module& model, const data::Batch& batch) {
    auto [prediction, expected] = flat_pair(model(batch[input]), batch, target);
    return loss(prediction, expected, nn::Reduction::Mean);
  };
}

EvalFunction regression_metrics(std::string input, std::string target, RegressionLoss loss) {
  MPIGRAD_CHECK(loss != nullptr, "regression_metrics: no loss given");
  return [input, target, loss](nn::Module& model, const data::Batch& batch) {
    auto [prediction, expected] = flat_pair(model(batch[input]), batch, target);
    std::map<std::string, core::Tensor> metrics;
    metrics["loss"] = core::mean(loss(prediction, expected, nn::Reduction::None), {1});
    return metrics;
  };
}

StepFunction supcon_step(std::string input, std::string label, nn::SupConOptions options) {
  return [input, label, options](nn::Module& model, const data::Batch& batch) {
    const int64_t n = batch.size();
    const core::Tensor& views = batch[input];
    MPIGRAD_CHECK(views.dim() >= 1 && n > 0 && views.size(0) % n == 0 && views.size(0) >= 2 * n,
                  "supcon_step: field '", input, "' has ", views.dim() >= 1 ? views.size(0) : 0,
                  " rows for a batch of ", n,
                  "; expected at least two views per sample, "
                  "view-major [views * batch, ...]");
    const int64_t view_count = views.size(0) / n;
    core::Tensor projections = model(views);  // [V * batch, P], view-major
    MPIGRAD_CHECK(projections.dim() == 2 && projections.size(0) == view_count * n,
                  "supcon_step: "
                  "the model maps ",
                  views.shape(), " to ", projections.shape(), "; expected [", view_count * n,
                  ", projection]");
    core::Tensor features =
        projections.reshape({view_count, n, projections.size(1)}).transpose(0, 1);
    return nn::supcon_loss(features, labels_of(batch, label), core::Tensor(), options);
  };
}

StepFunction with_precision(StepFunction step, nn::Precision precision) {
  const std::optional<core::DType> dtype = nn::autocast_dtype_of(precision);
  if (!dtype || !step) return step;
  return [step = std::move(step), dtype](nn::Module& model, const data::Batch& batch) {
    core::AutocastGuard autocast(dtype);
    return step(model, batch);
  };
}

EvalFunction with_precision(EvalFunction evaluate, nn::Precision precision) {
  const std::optional<core::DType> dtype = nn::autocast_dtype_of(precision);
  if (!dtype || !evaluate) return evaluate;
  return [evaluate = std::move(evaluate), dtype](nn::Module& model, const data::Batch& batch) {
    core::AutocastGuard autocast(dtype);
    return evaluate(model, batch);
  };
}

}  // namespace mpigrad::launch
