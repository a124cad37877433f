// The classification and regression losses with torch.nn.functional's semantics, built from the
// differentiable core ops (the fused cross-entropy rows, log_softmax, gather, ...), so their
// gradients need no code of their own. A loss object is a small value holding its options; call
// it like a function.
#pragma once

#include <cstdint>
#include <string>

#include "mpigrad/core/tensor.h"

namespace mpigrad::nn {

using core::Tensor;

enum class Reduction { Mean, Sum, None };

struct CrossEntropyOptions {
  Reduction reduction = Reduction::Mean;
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  // What the labels are, for the error about a bad one: e.g. "label field 'y'" (a trainer knows
  // the dataset's field name; the loss does not). Empty: the error names no source.
  std::string labels_name;
};

// logits [N, C] (or [N, C, d1, ...]) and Int64/Int32 labels [N] (or [N, d1, ...]). Labels equal
// to ignore_index contribute nothing and are left out of the mean's count; any other label
// outside [0, C) is a core::Error "cross_entropy: label 17 at position 3 of label field 'y' is
// out of range for num_classes = 10" (position in the flattened labels). With smoothing eps the
// target is (1 - eps) * one_hot + eps / C, as in torch.
// Without smoothing, one fused kernel computes the loss and its gradient
// (core/ops/cross_entropy.h): on a GPU nothing waits for the host, the labels are checked on the
// device, and a bad label's error comes at a later synchronization (the next loss.item(), a copy
// to the host, or core::check_device_errors; see core/device_checks.h). With smoothing the labels
// are checked on the host, which costs a GPU step one synchronization.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels,
                     const CrossEntropyOptions& options = {});

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
// Mean (or sum) absolute error, torch.nn.functional.l1_loss; its gradient at 0 is 0.
Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

// Numerically stable: max(x, 0) - x*y + log(1 + exp(-|x|)). pos_weight (optional, broadcast
// over the last dim) scales the positive term, like torch.
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        Reduction reduction = Reduction::Mean,
                                        const Tensor& pos_weight = Tensor());

class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(CrossEntropyOptions options = {}) : options_(options) {}
  Tensor operator()(const Tensor& logits, const Tensor& labels) const {
    return cross_entropy(logits, labels, options_);
  }

 private:
  CrossEntropyOptions options_;
};

class MSELoss {
 public:
  explicit MSELoss(Reduction reduction = Reduction::Mean) : reduction_(reduction) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return mse_loss(input, target, reduction_);
  }

 private:
  Reduction reduction_;
};

class BCEWithLogitsLoss {
 public:
  explicit BCEWithLogitsLoss(Reduction reduction = Reduction::Mean, Tensor pos_weight = Tensor())
      : reduction_(reduction), pos_weight_(std::move(pos_weight)) {}
  Tensor operator()(const Tensor& logits, const Tensor& target) const {
    return binary_cross_entropy_with_logits(logits, target, reduction_, pos_weight_);
  }

 private:
  Reduction reduction_;
  Tensor pos_weight_;
};

}  // namespace mpigrad::nn
