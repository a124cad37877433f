#include "mpigrad/nn/layers/container.h"

#include <typeinfo>

#include "mpigrad/nn/functional/normalization.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/batch_norm.h"
#include "mpigrad/nn/layers/pooling.h"

namespace mpigrad::nn {

namespace {

// Whether children i, i + 1 and i + 2 are a training-mode BatchNorm2d, a ReLU and a MaxPool2d of
// 2x2 windows with stride 2 and no padding or dilation, over a 4-d input: the pattern that
// functional::batch_norm_relu_max_pool2d fuses (where the backend supports it; elsewhere it
// composes the three ops itself). Anything else, a subclass of either module included, runs
// module by module.
bool batch_norm_relu_max_pool_at(
    const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children, size_t i,
    const Tensor& x) {
  if (i + 2 >= children.size() || x.dim() != 4) return false;
  const Module& norm = *children[i].second;
  const Module& pool = *children[i + 2].second;
  if (typeid(norm) != typeid(BatchNorm2d) || !norm.is_training() ||
      typeid(*children[i + 1].second) != typeid(ReLU) || typeid(pool) != typeid(MaxPool2d)) {
    return false;
  }
  return functional::fused_max_pool_window(static_cast<const MaxPool2d&>(pool).options());
}

}  // namespace

Tensor forward_in_order(
    const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children,
    const Tensor& input) {
  Tensor x = input;
  for (size_t i = 0; i < children.size(); ++i) {
    Module& child = *children[i].second;
    if (batch_norm_relu_max_pool_at(children, i, x)) {
      const auto& pool = static_cast<const MaxPool2d&>(*children[i + 2].second);
      x = static_cast<BatchNorm&>(child).forward_relu_max_pool(x, pool.options());
      i += 2;
      continue;
    }
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
