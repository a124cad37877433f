// torch.nn.Dropout driven by a counter-based Philox generator. The generator is shared (pass
// one to give several layers one reproducible stream) or owned (seeded by `seed`); either way
// it is registered under the name "generator", so checkpoints save and restore its state.
#pragma once

#include <memory>

#include "mpigrad/core/rng.h"
#include "mpigrad/nn/module.h"

namespace mpigrad::nn {

class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, std::shared_ptr<core::Generator> generator = nullptr,
                   uint64_t seed = 0);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Dropout"; }
  std::string extra_repr() const override;
  core::Generator& generator() { return *generator_; }

 private:
  double p_;
  std::shared_ptr<core::Generator> generator_;
};

}  // namespace mpigrad::nn
