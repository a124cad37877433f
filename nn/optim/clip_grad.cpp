#include "mpigrad/nn/optim/clip_grad.h"

#include <algorithm>
#include <cmath>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"

namespace mpigrad::nn {

double clip_grad_norm_(const std::vector<core::Tensor>& parameters, double max_norm,
                       double norm_type, bool error_if_nonfinite) {
  MPIGRAD_CHECK(norm_type > 0.0, "clip_grad_norm_: norm_type must be positive, got ", norm_type);
  core::NoGradGuard no_grad;
  std::vector<core::Tensor> grads;
  for (const core::Tensor& p : parameters) {
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return 0.0;
  const bool infinity = std::isinf(norm_type);
  double total = 0.0;
  for (const core::Tensor& g : grads) {
    // Accumulate in float64 whatever the gradient dtype, so many small terms are not lost.
    core::Tensor a = core::abs(g.to(core::kFloat64));
    if (infinity) {
      if (a.numel() > 0) total = std::max(total, core::max(a).item<double>());
    } else if (norm_type == 2.0) {
      total += core::sum(a * a).item<double>();
    } else if (norm_type == 1.0) {
      total += core::sum(a).item<double>();
    } else {
      total += core::sum(core::pow(a, norm_type)).item<double>();
    }
  }
  if (!infinity) total = norm_type == 2.0 ? std::sqrt(total) : std::pow(total, 1.0 / norm_type);
  MPIGRAD_CHECK(!error_if_nonfinite || std::isfinite(total),
                "clip_grad_norm_: the total norm "
                "of order ",
                norm_type, " of the gradients is non-finite (", total, ")");
  const double coefficient = max_norm / (total + 1e-6);
  if (coefficient < 1.0) {
    for (core::Tensor& g : grads) g.mul_(coefficient);
  }
  return total;
}

}  // namespace mpigrad::nn
