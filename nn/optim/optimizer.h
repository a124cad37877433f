// The base of the optimizers: parameter groups with their own lr, weight decay and momentum
// (SGD's momentum, or Adam's beta1 - the quantity OneCycleLR cycles), lazily created
// per-parameter state, the walk of a step (step_batched: one backend call per device and dtype),
// zero_grad, and state_dict / load_state_dict in PyTorch's structure:
// "param_groups/<g>/lr", ... as scalars and "state/<i>/<name>" as tensors, where i numbers the
// parameters across all groups in order. Parameters are held by handle: build the optimizer
// after moving the model with Module::to.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mpigrad/core/autocast.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/backend.h"
#include "mpigrad/core/profiler.h"
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

  // A parameter that this step updates, as step_batched hands it to make_slot.
  struct Update {
    ParamGroup& group;
    Tensor& param;
    ParamState& state;
    size_t index;        // across groups, in order (as state(index))
    const Tensor& grad;  // checked_grad's, alive until the backend calls are done
  };

  // The walk every step() makes, written once: under no-grad, each parameter that has a gradient
  // gets its kernel slot from make_slot(const Update&) and counts as written (its version is
  // bumped); then launch(device, dtype, std::vector<Slot>&) makes one backend call per
  // (device type, device index, dtype), a single fused launch on CUDA
  // (core::Backend::sgd_step / adam_step). Every slot is made before the first call. Where the
  // backend can, a parameter's autocast copy (core/autocast.h) is rewritten in the same pass.
  template <typename Slot, typename MakeSlot, typename Launch>
  void step_batched(MakeSlot&& make_slot, Launch&& launch);

 private:
  using SlotKey = std::tuple<int, int, core::DType>;
  static SlotKey slot_key(const Tensor& param) {
    return {int(param.device().type), param.device().index, param.dtype()};
  }
  static core::Device slot_device(const SlotKey& key) {
    return core::Device(core::DeviceType(std::get<0>(key)), std::get<1>(key));
  }

  std::vector<ParamGroup> groups_;
  std::vector<ParamState> state_;
};

template <typename Slot, typename MakeSlot, typename Launch>
void Optimizer::step_batched(MakeSlot&& make_slot, Launch&& launch) {
  core::ProfileSpan span(core::ProfileKind::Optimizer, [this] { return type_name() + ".step"; });
  core::NoGradGuard no_grad;
  std::map<SlotKey, std::vector<Slot>> slots;
  std::vector<Tensor> keep;           // the converted gradients the slots point into
  std::vector<Tensor> with_low_copy;  // parameters whose autocast copy the step rewrites
  size_t index = 0;
  for (ParamGroup& group : groups_) {
    for (Tensor& param : group.params) {
      const size_t i = index++;
      if (!param.grad().defined()) continue;
      Tensor grad = checked_grad(param);
      Slot slot = make_slot(Update{group, param, state_[i], i, grad});
      if (core::backend_for(param.device()).optimizer_writes_low_copies()) {
        if (auto copy = core::autocast_copy_for_update(param)) {
          slot.low_copy = copy->data;
          slot.low_dtype = copy->dtype;
          with_low_copy.push_back(param);
        }
      }
      slots[slot_key(param)].push_back(slot);
      keep.push_back(std::move(grad));
      param.storage()->bump_version();
    }
  }
  for (auto& [key, batch] : slots) launch(slot_device(key), std::get<2>(key), batch);
  for (const Tensor& param : with_low_copy) core::autocast_copy_updated(param);
}

}  // namespace mpigrad::nn
