// defines: Reduction, cross_entropy, mse_loss, l1_loss, binary_cross_entropy_with_logits,
//          CrossEntropyLoss, MSELoss, BCEWithLogitsLoss
//
// The classification and regression losses with torch.nn.functional's semantics, built from the
// differentiable core ops (log_softmax, gather, ...), so their gradients need no code of their
// own. A loss object is a small value holding its options; call it like a function.
#pragma once

#include <cstdint>

#include "mpigrad/core/tensor.h"

namespace mpigrad::nn {

using core::Tensor;

enum class Reduction { Mean, Sum, None };

struct CrossEntropyOptions {
  Reduction reduction = Reduction::Mean;
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
};

// logits [N, C] (or [N, C, d1, ...]) and Int64/Int32 labels [N] (or [N, d1, ...]). Labels equal
// to ignore_index contribute nothing and are left out of the mean's count; any other label
// outside [0, C) is a core::Error naming the label value and num_classes. With smoothing eps the
// target is (1 - eps) * one_hot + eps / C, as in torch.
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
