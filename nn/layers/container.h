// Sequential runs its children in order and names them "0", "1", ..., so its parameters get
// PyTorch's names ("0.weight", "features.3.bias"). A BatchNorm directly followed by a ReLU runs
// as one op (BatchNorm::forward_relu), fused where the backend can: the same results, the same
// modules. Identity returns its input; Flatten merges dims start_dim..end_dim (torch's defaults
// 1..-1 keep the batch dim).
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mpigrad/nn/module.h"

namespace mpigrad::nn {

// Runs `children` in order on `input`, a BatchNorm directly followed by a ReLU as one op
// (batch_norm_then_relu): Sequential's forward, and that of models whose children run in order.
Tensor forward_in_order(
    const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children,
    const Tensor& input);

class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  explicit Sequential(const std::vector<std::shared_ptr<Module>>& modules);

  // Appends a module under the next index and returns it.
  template <typename M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    add_child(std::to_string(size_), module);
    ++size_;
    return module;
  }
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Sequential"; }
  size_t size() const { return size_; }
  std::shared_ptr<Module> operator[](size_t index) const;

 private:
  size_t size_ = 0;
};

class Identity : public Module {
 public:
  Tensor forward(const Tensor& input) override { return input; }
  std::string type_name() const override { return "Identity"; }
};

class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : start_dim_(start_dim), end_dim_(end_dim) {}
  Tensor forward(const Tensor& input) override { return input.flatten(start_dim_, end_dim_); }
  std::string type_name() const override { return "Flatten"; }
  std::string extra_repr() const override {
    return "start_dim=" + std::to_string(start_dim_) + ", end_dim=" + std::to_string(end_dim_);
  }

 private:
  int64_t start_dim_, end_dim_;
};

}  // namespace mpigrad::nn
