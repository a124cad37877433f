#include "mpigrad/nn/layers/container.h"

#include <typeinfo>

#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/batch_norm.h"

namespace mpigrad::nn {

Tensor forward_in_order(
    const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children,
    const Tensor& input) {
  Tensor x = input;
  for (size_t i = 0; i < children.size(); ++i) {
    Module& child = *children[i].second;
    if (i + 1 < children.size() && is_plain_batch_norm(child) &&
        typeid(*children[i + 1].second) == typeid(ReLU)) {
      x = static_cast<BatchNorm&>(child).forward_relu(x);
      ++i;
      continue;
    }
    x = child.forward(x);
  }
  return x;
}

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) {
  for (const auto& module : modules) push_back(module);
}

Sequential::Sequential(const std::vector<std::shared_ptr<Module>>& modules) {
  for (const auto& module : modules) push_back(module);
}

Tensor Sequential::forward(const Tensor& input) {
  return forward_in_order(named_children(), input);
}

std::shared_ptr<Module> Sequential::operator[](size_t index) const {
  MPIGRAD_CHECK(index < size_, "Sequential: index ", index, " out of range for ", size_,
                " modules");
  return named_children()[index].second;
}

}  // namespace mpigrad::nn
