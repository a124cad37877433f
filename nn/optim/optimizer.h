// The base of the optimizers: parameter groups with their own lr, weight decay and momentum
// (SGD's momentum, or Adam's beta1 - the quantity OneCycleLR cycles), lazily created
// per-parameter state, zero_grad, and state_dict / load_state_dict in PyTorch's structure:
// "param_groups/<g>/lr", ... as scalars and "state/<i>/<name>" as tensors, where i numbers the
// parameters across all groups in order. Parameters are held by handle: build the optimizer
// after moving the model with Module::to.
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mpigrad/core/tensor.h"
#include "mpigrad/nn/state_dict.h"

namespace mpigrad::nn {

using core::Tensor;

// What the user passes: unset fields take the optimizer's defaults.
struct ParamGroupSpec {
  std::vector<Tensor> params;
  std::optional<double> lr, weight_decay, momentum;
};

// A group as the optimizer and the schedulers see it.
struct ParamGroup {
  std::vector<Tensor> params;
  double lr = 0, weight_decay = 0, momentum = 0;
  double initial_lr = 0;  // the lr a scheduler starts from (torch's group['initial_lr'])
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual std::string type_name() const = 0;
  // One update of every parameter that has a gradient.
  virtual void step() = 0;
  // Clears the gradients of every parameter (undefined, or zero-filled).
  void zero_grad(bool set_to_none = true);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }

  StateDict state_dict() const;
  // Group count, parameter counts and state shapes must match; errors name the key. Tensors
  // are copied onto each parameter's device and dtype.
  void load_state_dict(const StateDict& state);

 protected:
  Optimizer(std::vector<ParamGroupSpec> groups, double lr, double weight_decay, double momentum);

  struct ParamState {
    int64_t step = 0;
    std::vector<std::pair<std::string, Tensor>> tensors;  // e.g. momentum_buffer, exp_avg
    Tensor* find(const std::string& name);
  };
  // State of the parameter with global index i (across groups, in order).
  ParamState& state(size_t index) { return state_[index]; }
  // Checks that `param` and its gradient can be updated by the backend's kernels and returns
  // the gradient as a dense tensor of the parameter's dtype.
  Tensor checked_grad(const Tensor& param) const;

  // The steps batch their updates per (device type, device index, dtype): one backend call each
  // (core::Backend::sgd_step / adam_step), a single fused launch on CUDA.
  using SlotKey = std::tuple<int, int, core::DType>;
  static SlotKey slot_key(const Tensor& param) {
    return {int(param.device().type), param.device().index, param.dtype()};
  }
  static core::Device slot_device(const SlotKey& key) {
    return core::Device(core::DeviceType(std::get<0>(key)), std::get<1>(key));
  }

 private:
  std::vector<ParamGroup> groups_;
  std::vector<ParamState> state_;
};

}  // namespace mpigrad::nn
