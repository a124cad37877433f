// Parameter-free activation modules over the core elementwise ops (whose autograd and kernels
// live in core/ops/elementwise.h).
#pragma once

#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/nn/module.h"

namespace mpigrad::nn {

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& input) override { return core::relu(input); }
  std::string type_name() const override { return "ReLU"; }
};

class GELU : public Module {
 public:
  explicit GELU(core::GeluApproximation approximation = core::GeluApproximation::None)
      : approximation_(approximation) {}
  Tensor forward(const Tensor& input) override { return core::gelu(input, approximation_); }
  std::string type_name() const override { return "GELU"; }
  std::string extra_repr() const override {
    return approximation_ == core::GeluApproximation::Tanh ? "approximate='tanh'"
                                                           : "approximate='none'";
  }

 private:
  core::GeluApproximation approximation_;
};

class SiLU : public Module {
 public:
  Tensor forward(const Tensor& input) override { return core::silu(input); }
  std::string type_name() const override { return "SiLU"; }
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& input) override { return core::tanh(input); }
  std::string type_name() const override { return "Tanh"; }
};

class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& input) override { return core::sigmoid(input); }
  std::string type_name() const override { return "Sigmoid"; }
};

}  // namespace mpigrad::nn
