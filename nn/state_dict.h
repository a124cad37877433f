// StateDict: the ordered name -> tensor (and name -> number) map that modules, optimizers and
// schedulers save into and load from, and that checkpoints write to HDF5.
//
// Keys keep their insertion order, so a model's state_dict lists parameters and buffers in
// registration order, exactly like PyTorch's OrderedDict. Module keys are dotted
// ("features.0.weight"); optimizer and scheduler keys use '/' ("state/0/exp_avg",
// "param_groups/0/lr") so a checkpoint can map them onto HDF5 groups.
#pragma once

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mpigrad/core/tensor.h"

namespace mpigrad::nn {

class StateDict {
 public:
  // Inserts, or replaces the value of an existing key in place (its position is kept).
  void set(const std::string& key, const core::Tensor& tensor);
  void set_scalar(const std::string& key, double value);

  bool contains(const std::string& key) const { return tensor_index_.count(key) != 0; }
  bool contains_scalar(const std::string& key) const { return scalar_index_.count(key) != 0; }
  // Null when absent.
  const core::Tensor* find(const std::string& key) const;
  const double* find_scalar(const std::string& key) const;
  // core::Error naming the key when absent; `owner` says who asked ("SGD.load_state_dict").
  const core::Tensor& at(const std::string& key, const char* owner = "StateDict") const;
  double scalar(const std::string& key, const char* owner = "StateDict") const;

  // On a temporary (module.state_dict().tensors()) these return by value, so a range-for over
  // them never iterates a destroyed StateDict.
  const std::vector<std::pair<std::string, core::Tensor>>& tensors() const& { return tensors_; }
  std::vector<std::pair<std::string, core::Tensor>> tensors() && { return std::move(tensors_); }
  const std::vector<std::pair<std::string, double>>& scalars() const& { return scalars_; }
  std::vector<std::pair<std::string, double>> scalars() && { return std::move(scalars_); }
  size_t size() const { return tensors_.size(); }
  bool empty() const { return tensors_.empty() && scalars_.empty(); }

 private:
  std::vector<std::pair<std::string, core::Tensor>> tensors_;
  std::vector<std::pair<std::string, double>> scalars_;
  std::unordered_map<std::string, size_t> tensor_index_, scalar_index_;
};

}  // namespace mpigrad::nn
