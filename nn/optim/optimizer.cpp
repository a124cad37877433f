#include "mpigrad/nn/optim/optimizer.h"

#include <unordered_set>

#include "mpigrad/core/autograd.h"

namespace mpigrad::nn {

Optimizer::Optimizer(std::vector<ParamGroupSpec> groups, double lr, double weight_decay,
                     double momentum) {
  MPIGRAD_CHECK(!groups.empty(), "optimizer: no parameter groups given");
  std::unordered_set<const void*> seen;
  size_t total = 0;
  for (auto& spec : groups) {
    ParamGroup group;
    group.lr = spec.lr.value_or(lr);
    group.weight_decay = spec.weight_decay.value_or(weight_decay);
    group.momentum = spec.momentum.value_or(momentum);
    group.initial_lr = group.lr;
    MPIGRAD_CHECK(group.lr >= 0.0, "optimizer: invalid learning rate ", group.lr);
    MPIGRAD_CHECK(group.weight_decay >= 0.0, "optimizer: invalid weight decay ",
                  group.weight_decay);
    for (const Tensor& p : spec.params) {
      MPIGRAD_CHECK(p.defined() && p.is_leaf() && p.requires_grad(), "optimizer: parameter ", total,
                    " is not a leaf tensor that requires grad");
      MPIGRAD_CHECK(seen.insert(p.impl_ptr()).second, "optimizer: parameter ", total,
                    " appears in more than one place");
      ++total;
    }
    group.params = std::move(spec.params);
    groups_.push_back(std::move(group));
  }
  state_.resize(total);
}

Tensor* Optimizer::ParamState::find(const std::string& name) {
  for (auto& [key, tensor] : tensors) {
    if (key == name) return &tensor;
  }
  return nullptr;
}

void Optimizer::zero_grad(bool set_to_none) {
  core::ProfileSpan span(core::ProfileKind::Optimizer,
                         [this] { return type_name() + ".zero_grad"; });
  for (const ParamGroup& group : groups_) core::zero_grad(group.params, set_to_none);
}

Tensor Optimizer::checked_grad(const Tensor& param) const {
  MPIGRAD_CHECK(param.is_contiguous(), type_name(), ": parameters must be contiguous");
  MPIGRAD_CHECK(param.dtype() == core::kFloat32 || param.dtype() == core::kFloat64, type_name(),
                ": parameters must be float32 or float64, got ", param.dtype());
  Tensor grad = param.grad();
  MPIGRAD_CHECK(grad.shape() == param.shape(), type_name(), ": gradient of shape ", grad.shape(),
                " for a parameter of shape ", param.shape());
  return grad.to(param.dtype()).contiguous();
}

StateDict Optimizer::state_dict() const {
  StateDict out;
  size_t index = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    const std::string prefix = "param_groups/" + std::to_string(g) + "/";
    out.set_scalar(prefix + "lr", group.lr);
    out.set_scalar(prefix + "weight_decay", group.weight_decay);
    out.set_scalar(prefix + "momentum", group.momentum);
    out.set_scalar(prefix + "initial_lr", group.initial_lr);
    out.set_scalar(prefix + "num_params", double(group.params.size()));
    for (size_t i = 0; i < group.params.size(); ++i, ++index) {
      const ParamState& s = state_[index];
      const std::string key = "state/" + std::to_string(index) + "/";
      if (s.step > 0 || !s.tensors.empty()) out.set_scalar(key + "step", double(s.step));
      for (const auto& [name, tensor] : s.tensors) out.set(key + name, tensor.detach());
    }
  }
  return out;
}

void Optimizer::load_state_dict(const StateDict& state) {
  const std::string owner = type_name() + ".load_state_dict";
  // Validate first so a failed load changes nothing.
  MPIGRAD_CHECK(
      !state.contains_scalar("param_groups/" + std::to_string(groups_.size()) + "/num_params"),
      owner, ": the state dict has more parameter groups than this optimizer (", groups_.size(),
      ")");
  size_t index = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string prefix = "param_groups/" + std::to_string(g) + "/";
    const double* count = state.find_scalar(prefix + "num_params");
    MPIGRAD_CHECK(count != nullptr, owner, ": the state dict has no parameter group ", g,
                  " (this optimizer has ", groups_.size(), ")");
    MPIGRAD_CHECK(size_t(*count) == groups_[g].params.size(), owner, ": parameter group ", g,
                  " has ", groups_[g].params.size(), " parameters, the state dict has ", *count);
    for (const Tensor& p : groups_[g].params) {
      const std::string key = "state/" + std::to_string(index++) + "/";
      for (const auto& [name, tensor] : state.tensors()) {
        if (name.rfind(key, 0) != 0) continue;
        MPIGRAD_CHECK(tensor.shape() == p.shape(), owner, ": size mismatch for '", name,
                      "': the parameter has shape ", p.shape(), ", the state dict has ",
                      tensor.shape());
      }
    }
  }
  index = 0;
  core::NoGradGuard no_grad;
  for (size_t g = 0; g < groups_.size(); ++g) {
    ParamGroup& group = groups_[g];
    const std::string prefix = "param_groups/" + std::to_string(g) + "/";
    group.lr = state.scalar(prefix + "lr", owner.c_str());
    group.weight_decay = state.scalar(prefix + "weight_decay", owner.c_str());
    group.momentum = state.scalar(prefix + "momentum", owner.c_str());
    group.initial_lr = state.scalar(prefix + "initial_lr", owner.c_str());
    for (const Tensor& p : group.params) {
      const std::string key = "state/" + std::to_string(index) + "/";
      ParamState fresh;
      const double* step = state.find_scalar(key + "step");
      fresh.step = step ? int64_t(*step) : 0;
      for (const auto& [name, tensor] : state.tensors()) {
        if (name.rfind(key, 0) != 0) continue;
        // A private copy: the optimizer updates its state in place.
        fresh.tensors.emplace_back(name.substr(key.size()),
                                   tensor.to(p.device(), p.dtype()).clone().detach());
      }
      state_[index++] = std::move(fresh);
    }
  }
}

}  // namespace mpigrad::nn
