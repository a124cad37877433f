#include "mpigrad/nn/state_dict.h"

#include "mpigrad/core/error.h"

namespace mpigrad::nn {

void StateDict::set(const std::string& key, const core::Tensor& tensor) {
  auto it = tensor_index_.find(key);
  if (it != tensor_index_.end()) {
    tensors_[it->second].second = tensor;
    return;
  }
  tensor_index_.emplace(key, tensors_.size());
  tensors_.emplace_back(key, tensor);
}

void StateDict::set_scalar(const std::string& key, double value) {
  auto it = scalar_index_.find(key);
  if (it != scalar_index_.end()) {
    scalars_[it->second].second = value;
    return;
  }
  scalar_index_.emplace(key, scalars_.size());
  scalars_.emplace_back(key, value);
}

const core::Tensor* StateDict::find(const std::string& key) const {
  auto it = tensor_index_.find(key);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second].second;
}

const double* StateDict::find_scalar(const std::string& key) const {
  auto it = scalar_index_.find(key);
  return it == scalar_index_.end() ? nullptr : &scalars_[it->second].second;
}

const core::Tensor& StateDict::at(const std::string& key, const char* owner) const {
  const core::Tensor* tensor = find(key);
  MPIGRAD_CHECK(tensor != nullptr, owner, ": state dict has no tensor '", key, "'");
  return *tensor;
}

double StateDict::scalar(const std::string& key, const char* owner) const {
  const double* value = find_scalar(key);
  MPIGRAD_CHECK(value != nullptr, owner, ": state dict has no value '", key, "'");
  return *value;
}

}  // namespace mpigrad::nn
