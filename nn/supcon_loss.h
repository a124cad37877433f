// The supervised contrastive loss of Khosla et al. 2020 ("Supervised Contrastive Learning"),
// following the reference implementation (HobbitLong/SupContrast, losses.py) term by term:
// features [batch, views, dim] (L2-normalized by the caller), positives are the other views of
// the same sample and, with labels, every view of a sample with the same label. With neither
// labels nor mask it is SimCLR's unsupervised loss. The row maximum is subtracted from the
// logits (detached) for stability, self-contrast is masked out, and anchors without any positive
// divide by 1 instead of 0, as in the reference's current version.
#pragma once

#include "mpigrad/core/tensor.h"

namespace mpigrad::nn {

using core::Tensor;

enum class SupConMode { All, One };  // anchors: every view, or only the first view

struct SupConOptions {
  double temperature = 0.07;
  double base_temperature = 0.07;
  SupConMode contrast_mode = SupConMode::All;
};

// labels: Int64/Int32 [batch] or undefined; mask: [batch, batch] float (mask[i][j] = 1 when j is
// a positive of i) or undefined; at most one of the two.
Tensor supcon_loss(const Tensor& features, const Tensor& labels = Tensor(),
                   const Tensor& mask = Tensor(), const SupConOptions& options = {});

class SupConLoss {
 public:
  explicit SupConLoss(SupConOptions options = {}) : options_(options) {}
  Tensor operator()(const Tensor& features, const Tensor& labels = Tensor()) const {
    return supcon_loss(features, labels, Tensor(), options_);
  }

 private:
  SupConOptions options_;
};

}  // namespace mpigrad::nn
