// y = x W^T + b with W [out_features, in_features] (PyTorch's layout, so checkpoints load into
// torch.nn.Linear as they are). Default init is PyTorch's: kaiming_uniform(a = sqrt(5)) for W,
// which is U(-1/sqrt(in), 1/sqrt(in)), and the same bound for b.
#pragma once

#include "mpigrad/core/rng.h"
#include "mpigrad/nn/module.h"

namespace mpigrad::nn {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, core::Generator& generator, bool bias = true);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Linear"; }
  std::string extra_repr() const override;
  // Redraws the parameters with the default initialization.
  void reset_parameters(core::Generator& generator);

  Tensor& weight() { return *weight_; }
  Tensor& bias() { return *bias_; }  // undefined slot when built without bias
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

 private:
  int64_t in_features_, out_features_;
  Tensor* weight_ = nullptr;
  Tensor* bias_ = nullptr;
  Tensor no_bias_;
};

}  // namespace mpigrad::nn
