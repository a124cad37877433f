#include "mpigrad/nn/loss.h"

#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/backend.h"
#include "mpigrad/core/ops/cross_entropy.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/ops/softmax.h"

namespace mpigrad::nn {

namespace {
Tensor reduce(const Tensor& loss, Reduction reduction) {
  switch (reduction) {
    case Reduction::Mean:
      return core::mean(loss);
    case Reduction::Sum:
      return core::sum(loss);
    case Reduction::None:
      return loss;
  }
  return loss;
}
}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& labels,
                     const CrossEntropyOptions& options) {
  MPIGRAD_CHECK(logits.defined() && labels.defined(), "cross_entropy: undefined input");
  MPIGRAD_CHECK(core::is_floating(logits.dtype()), "cross_entropy: logits must be floating, got ",
                logits.dtype());
  MPIGRAD_CHECK(labels.dtype() == core::kInt64 || labels.dtype() == core::kInt32,
                "cross_entropy: labels must be Int64 or Int32 class indices, got ", labels.dtype());
  MPIGRAD_CHECK(logits.dim() >= 2, "cross_entropy: logits must be [N, C, ...], got shape ",
                logits.shape());
  MPIGRAD_CHECK(options.label_smoothing >= 0.0 && options.label_smoothing <= 1.0,
                "cross_entropy: label_smoothing must be in [0, 1], got ", options.label_smoothing);
  const int64_t classes = logits.shape()[1];
  // Labels must match logits without the class dim.
  core::Shape expected = logits.shape();
  expected.erase(1);
  MPIGRAD_CHECK(labels.shape() == expected, "cross_entropy: labels of shape ", labels.shape(),
                " do not match logits of shape ", logits.shape(), " (expected ", expected, ")");

  // Move the class dim last and flatten: [rows, C], rows in the labels' row-major order.
  Tensor rows = logits;
  if (logits.dim() > 2) {
    std::vector<int64_t> order{0};
    for (int64_t d = 2; d < logits.dim(); ++d) order.push_back(d);
    order.push_back(1);
    rows = logits.permute(order).reshape({-1, classes});
  }
  const core::TargetCheck check{"cross_entropy", options.labels_name};
  if (options.label_smoothing == 0.0) {
    Tensor flat_labels;
    {
      core::NoGradGuard no_grad;
      flat_labels = labels.reshape({-1}).to(core::kInt64);
    }
    core::RowLossReduction reduction = core::RowLossReduction::Mean;
    if (options.reduction == Reduction::Sum) reduction = core::RowLossReduction::Sum;
    if (options.reduction == Reduction::None) reduction = core::RowLossReduction::None;
    Tensor out =
        core::cross_entropy_rows(rows, flat_labels, options.ignore_index, reduction, check);
    return options.reduction == Reduction::None ? out.reshape(labels.shape()) : out;
  }

  // Label smoothing: log_softmax and a gather, with the labels validated on the host first (one
  // bad label must be a clear error, not a wild gather).
  const std::vector<int64_t> host_labels = labels.to_vector<int64_t>();
  std::vector<int64_t> safe(host_labels.size());
  std::vector<uint8_t> keep(host_labels.size());
  int64_t kept = 0;
  for (size_t i = 0; i < host_labels.size(); ++i) {
    const int64_t label = host_labels[i];
    if (label == options.ignore_index) {
      safe[i] = 0;
      keep[i] = 0;
      continue;
    }
    MPIGRAD_CHECK(label >= 0 && label < classes,
                  core::bad_target_message(check, int64_t(i), label, classes));
    safe[i] = label;
    keep[i] = 1;
    ++kept;
  }
  const auto device = logits.device();
  const int64_t n = int64_t(safe.size());
  Tensor index =
      Tensor::from_vector(safe, {n, 1}, core::TensorOptions(core::kInt64).device(device));
  Tensor mask = Tensor::from_vector(std::vector<double>(keep.begin(), keep.end()), {n},
                                    core::TensorOptions(logits.dtype()).device(device));
  Tensor log_probs = core::log_softmax(rows, 1);
  Tensor nll = -core::gather(log_probs, 1, index).reshape({n});
  const double eps = options.label_smoothing;
  Tensor smooth = -core::sum(log_probs, {1}) * (eps / double(classes));
  Tensor per_row = (nll * (1.0 - eps) + smooth) * mask;
  switch (options.reduction) {
    case Reduction::Mean:
      return core::sum(per_row) / double(kept);  // NaN when all ignored, as torch
    case Reduction::Sum:
      return core::sum(per_row);
    case Reduction::None:
      return per_row.reshape(labels.shape());
  }
  return per_row;
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  MPIGRAD_CHECK(input.defined() && target.defined(), "mse_loss: undefined input");
  MPIGRAD_CHECK(input.shape() == target.shape(), "mse_loss: input shape ", input.shape(),
                " differs from target shape ", target.shape());
  Tensor diff = input - target;
  return reduce(diff * diff, reduction);
}

Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  MPIGRAD_CHECK(input.defined() && target.defined(), "l1_loss: undefined input");
  MPIGRAD_CHECK(input.shape() == target.shape(), "l1_loss: input shape ", input.shape(),
                " differs from target shape ", target.shape());
  return reduce(core::abs(input - target), reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        Reduction reduction, const Tensor& pos_weight) {
  MPIGRAD_CHECK(logits.defined() && target.defined(),
                "binary_cross_entropy_with_logits: "
                "undefined input");
  MPIGRAD_CHECK(logits.shape() == target.shape(), "binary_cross_entropy_with_logits: logits shape ",
                logits.shape(), " differs from target shape ", target.shape());
  // log(1 + exp(-|x|)) + max(-x, 0) = -log(sigmoid(x)); the stable softplus form of torch.
  Tensor log_sigmoid_neg = core::log(1.0 + core::exp(-core::abs(logits))) + core::relu(-logits);
  Tensor loss;
  if (pos_weight.defined()) {
    // torch: (1 - y) * x + (1 + (pw - 1) * y) * softplus(-x)
    Tensor log_weight = 1.0 + (pos_weight - 1.0) * target;
    loss = (1.0 - target) * logits + log_weight * log_sigmoid_neg;
  } else {
    loss = (1.0 - target) * logits + log_sigmoid_neg;
  }
  return reduce(loss, reduction);
}

}  // namespace mpigrad::nn
