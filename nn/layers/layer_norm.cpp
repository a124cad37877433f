#include "mpigrad/nn/layers/layer_norm.h"

#include <sstream>

#include "mpigrad/nn/functional/normalization.h"

namespace mpigrad::nn {

LayerNorm::LayerNorm(std::vector<int64_t> normalized_shape, double eps, bool elementwise_affine)
    : normalized_shape_(std::move(normalized_shape)), eps_(eps) {
  MPIGRAD_CHECK(!normalized_shape_.empty(), "LayerNorm: normalized_shape is empty");
  if (elementwise_affine) {
    weight_ = &register_parameter("weight", core::ones(core::Shape(normalized_shape_)));
    bias_ = &register_parameter("bias", core::zeros(core::Shape(normalized_shape_)));
  } else {
    weight_ = bias_ = &none_;
  }
}

Tensor LayerNorm::forward(const Tensor& input) {
  return functional::layer_norm(input, normalized_shape_, *weight_, *bias_, eps_);
}

std::string LayerNorm::extra_repr() const {
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < normalized_shape_.size(); ++i) {
    out << normalized_shape_[i]
        << (normalized_shape_.size() == 1 || i + 1 < normalized_shape_.size() ? "," : "");
    if (i + 1 < normalized_shape_.size()) out << " ";
  }
  out << "), eps=" << eps_ << ", elementwise_affine=" << (weight_->defined() ? "True" : "False");
  return out.str();
}

}  // namespace mpigrad::nn
