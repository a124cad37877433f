// torch.nn.LayerNorm: normalizes over the trailing normalized_shape dims, with elementwise
// affine weight (ones) and bias (zeros) of that shape.
#pragma once

#include <vector>

#include "mpigrad/nn/module.h"

namespace mpigrad::nn {

class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::vector<int64_t> normalized_shape, double eps = 1e-5,
                     bool elementwise_affine = true);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "LayerNorm"; }
  std::string extra_repr() const override;

 private:
  std::vector<int64_t> normalized_shape_;
  double eps_;
  Tensor* weight_ = nullptr;
  Tensor* bias_ = nullptr;
  Tensor none_;
};

}  // namespace mpigrad::nn
