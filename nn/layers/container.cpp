#include "mpigrad/nn/layers/container.h"

#include <typeinfo>

#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/batch_norm.h"

namespace mpigrad::nn {

namespace {

// `first` when it is a BatchNorm1d or BatchNorm2d and `second` a ReLU, exactly those types (a
// subclass may forward differently), else null. Such a pair runs as BatchNorm::forward_relu:
// one op where the backend fuses it, writing the activation once, with bitwise the same results
// as the two modules in turn. A SyncBatchNorm (launch/ddp/) is no BatchNorm, so a model converted
// for multi-rank runs keeps its pairs apart.
BatchNorm* batch_norm_before_relu(Module& first, const Module& second) {
  const std::type_info& type = typeid(first);
  if (type != typeid(BatchNorm1d) && type != typeid(BatchNorm2d)) return nullptr;
  if (typeid(second) != typeid(ReLU)) return nullptr;
  return static_cast<BatchNorm*>(&first);
}

}  // namespace

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) {
  for (const auto& module : modules) push_back(module);
}

Sequential::Sequential(const std::vector<std::shared_ptr<Module>>& modules) {
  for (const auto& module : modules) push_back(module);
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  const auto& children = named_children();
  for (size_t i = 0; i < children.size(); ++i) {
    Module& child = *children[i].second;
    if (i + 1 < children.size()) {
      if (BatchNorm* batch_norm = batch_norm_before_relu(child, *children[i + 1].second)) {
        x = batch_norm->forward_relu(x);
        ++i;
        continue;
      }
    }
    x = child.forward(x);
  }
  return x;
}

std::shared_ptr<Module> Sequential::operator[](size_t index) const {
  MPIGRAD_CHECK(index < size_, "Sequential: index ", index, " out of range for ", size_,
                " modules");
  return named_children()[index].second;
}

}  // namespace mpigrad::nn
