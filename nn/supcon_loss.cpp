#include "mpigrad/nn/supcon_loss.h"

#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/linalg.h"
#include "mpigrad/core/ops/reduce.h"

namespace mpigrad::nn {

Tensor supcon_loss(const Tensor& features, const Tensor& labels, const Tensor& mask,
                   const SupConOptions& options) {
  MPIGRAD_CHECK(features.defined() && features.dim() >= 3,
                "supcon_loss: features must be [batch, views, ...], got ",
                features.defined() ? features.shape().str() : std::string("undefined"));
  MPIGRAD_CHECK(!(labels.defined() && mask.defined()),
                "supcon_loss: pass labels or mask, not both");
  MPIGRAD_CHECK(options.temperature > 0.0 && options.base_temperature > 0.0,
                "supcon_loss: temperatures must be positive");
  const int64_t batch = features.shape()[0];
  const int64_t views = features.shape()[1];
  Tensor f = features.dim() > 3 ? features.reshape({batch, views, -1}) : features;
  const int64_t dim = f.shape()[2];
  const auto options_like = core::TensorOptions(features.dtype()).device(features.device());

  // positives[i][j] over samples.
  std::vector<double> base(size_t(batch * batch), 0.0);
  if (labels.defined()) {
    MPIGRAD_CHECK(labels.numel() == batch, "supcon_loss: ", labels.numel(),
                  " labels for a batch of ", batch);
    const std::vector<int64_t> l = labels.to_vector<int64_t>();
    for (int64_t i = 0; i < batch; ++i)
      for (int64_t j = 0; j < batch; ++j)
        base[size_t(i * batch + j)] = l[size_t(i)] == l[size_t(j)];
  } else if (mask.defined()) {
    MPIGRAD_CHECK(mask.shape() == core::Shape({batch, batch}), "supcon_loss: mask of shape ",
                  mask.shape(), " for a batch of ", batch);
    base = mask.to_vector<double>();
  } else {
    for (int64_t i = 0; i < batch; ++i) base[size_t(i * batch + i)] = 1.0;
  }

  // contrast rows: view-major [views * batch, dim] (torch.cat(torch.unbind(features, 1))).
  Tensor contrast = f.transpose(0, 1).reshape({views * batch, dim});
  const int64_t anchor_views = options.contrast_mode == SupConMode::All ? views : 1;
  Tensor anchor = options.contrast_mode == SupConMode::All ? contrast : f.select(1, 0);
  const int64_t anchors = anchor_views * batch, contrasts = views * batch;

  Tensor logits = core::matmul(anchor, contrast.t()) / options.temperature;
  Tensor row_max;
  {
    core::NoGradGuard no_grad;
    row_max = core::max(logits, 1, true).values.detach();
  }
  logits = logits - row_max;

  // mask.repeat(anchor_views, views), with self-contrast (i, i) removed.
  std::vector<double> positive(size_t(anchors * contrasts)), not_self(size_t(anchors * contrasts));
  std::vector<double> positive_count(size_t(anchors), 0.0);
  for (int64_t i = 0; i < anchors; ++i) {
    for (int64_t j = 0; j < contrasts; ++j) {
      const size_t k = size_t(i * contrasts + j);
      not_self[k] = i == j ? 0.0 : 1.0;
      positive[k] = base[size_t((i % batch) * batch + (j % batch))] * not_self[k];
      positive_count[size_t(i)] += positive[k];
    }
    // Anchors without positives would divide by zero.
    if (positive_count[size_t(i)] < 1e-6) positive_count[size_t(i)] = 1.0;
  }
  Tensor positive_mask = Tensor::from_vector(positive, {anchors, contrasts}, options_like);
  Tensor logits_mask = Tensor::from_vector(not_self, {anchors, contrasts}, options_like);
  Tensor counts = Tensor::from_vector(positive_count, {anchors}, options_like);

  Tensor exp_logits = core::exp(logits) * logits_mask;
  Tensor log_prob = logits - core::log(core::sum(exp_logits, {1}, true));
  Tensor mean_log_prob_pos = core::sum(positive_mask * log_prob, {1}) / counts;
  Tensor loss = mean_log_prob_pos * (-(options.temperature / options.base_temperature));
  return core::mean(loss);
}

}  // namespace mpigrad::nn
