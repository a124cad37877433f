#include "mpigrad/nn/layers/linear.h"

#include <cmath>

#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/linalg.h"
#include "mpigrad/nn/init.h"

namespace mpigrad::nn {

Linear::Linear(int64_t in_features, int64_t out_features, core::Generator& generator, bool bias)
    : in_features_(in_features), out_features_(out_features) {
  MPIGRAD_CHECK(in_features >= 0 && out_features >= 0, "Linear: negative feature count ",
                in_features, " -> ", out_features);
  weight_ = &register_parameter("weight", core::empty({out_features, in_features}));
  bias_ = bias ? &register_parameter("bias", core::empty({out_features})) : &no_bias_;
  reset_parameters(generator);
}

void Linear::reset_parameters(core::Generator& generator) {
  init::kaiming_uniform_(*weight_, generator, std::sqrt(5.0));
  if (bias_->defined()) {
    const double bound = in_features_ > 0 ? 1.0 / std::sqrt(double(in_features_)) : 0.0;
    init::uniform_(*bias_, -bound, bound, generator);
  }
}

Tensor Linear::forward(const Tensor& input) {
  MPIGRAD_CHECK(input.dim() >= 1 && input.size(-1) == in_features_, "Linear: input of shape ",
                input.shape(), " does not end in in_features = ", in_features_);
  Tensor out = core::matmul(input, weight_->t());
  return bias_->defined() ? out + *bias_ : out;
}

std::string Linear::extra_repr() const {
  return "in_features=" + std::to_string(in_features_) +
         ", out_features=" + std::to_string(out_features_) +
         ", bias=" + (bias_->defined() ? "True" : "False");
}

}  // namespace mpigrad::nn
