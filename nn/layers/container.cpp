#include "mpigrad/nn/layers/container.h"

namespace mpigrad::nn {

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) {
  for (const auto& module : modules) push_back(module);
}

Sequential::Sequential(const std::vector<std::shared_ptr<Module>>& modules) {
  for (const auto& module : modules) push_back(module);
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& [name, child] : named_children()) x = child->forward(x);
  return x;
}

std::shared_ptr<Module> Sequential::operator[](size_t index) const {
  MPIGRAD_CHECK(index < size_, "Sequential: index ", index, " out of range for ", size_,
                " modules");
  return named_children()[index].second;
}

}  // namespace mpigrad::nn
