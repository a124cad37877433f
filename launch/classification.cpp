#include "mpigrad/launch/classification.h"

#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/nn/loss.h"

namespace mpigrad::launch {

namespace {
// One integer label per sample, as int64 [batch] (the file may store any integer dtype, or
// [batch, 1]).
core::Tensor labels_of(const data::Batch& batch, const std::string& label) {
  const core::Tensor& stored = batch[label];
  MPIGRAD_CHECK(!core::is_floating(stored.dtype()), "label field '", label, "' is ",
                stored.dtype(), "; class labels must be integers");
  MPIGRAD_CHECK(stored.numel() == batch.size(), "label field '", label, "' has shape ",
                stored.shape(), "; expected one label per sample");
  return stored.reshape({batch.size()}).to(core::kInt64);
}
}  // namespace

StepFunction classification_step(std::string input, std::string label) {
  return [input, label](nn::Module& model, const data::Batch& batch) {
    core::Tensor logits = model(batch[input]);
    return nn::cross_entropy(logits, labels_of(batch, label));
  };
}

EvalFunction classification_metrics(std::string input, std::string label) {
  return [input, label](nn::Module& model, const data::Batch& batch) {
    core::Tensor logits = model(batch[input]);
    core::Tensor labels = labels_of(batch, label);
    nn::CrossEntropyOptions per_sample;
    per_sample.reduction = nn::Reduction::None;
    std::map<std::string, core::Tensor> metrics;
    metrics["loss"] = nn::cross_entropy(logits, labels, per_sample);
    metrics["accuracy"] = core::eq(core::argmax(logits, 1), labels).to(core::kFloat64);
    return metrics;
  };
}

}  // namespace mpigrad::launch
