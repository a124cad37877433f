#include "mpigrad/nn/functional/dropout.h"

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"

namespace mpigrad::nn::functional {

core::Tensor dropout(const core::Tensor& input, double p, bool training,
                     core::Generator& generator) {
  MPIGRAD_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability must be in [0, 1], got ", p);
  if (!training || p == 0.0) return input;
  core::Tensor scaled_mask;
  {
    core::NoGradGuard no_grad;
    const auto options = core::TensorOptions(input.dtype()).device(input.device());
    if (p == 1.0) {
      scaled_mask = core::zeros(input.shape(), options);
    } else {
      scaled_mask = core::bernoulli(input.shape(), 1.0 - p, generator, options);
      scaled_mask.mul_(1.0 / (1.0 - p));
    }
  }
  return input * scaled_mask;
}

}  // namespace mpigrad::nn::functional
