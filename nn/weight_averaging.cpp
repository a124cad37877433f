#include "mpigrad/nn/weight_averaging.h"

#include <algorithm>
#include <optional>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/nn/layers/batch_norm.h"

namespace mpigrad::nn {

namespace {
// A private, detached copy (the model keeps training in place).
core::Tensor snapshot(const core::Tensor& t) {
  return t.detach().clone().detach();
}

void check_same_keys(const StateDict& average, const StateDict& model, const char* owner) {
  MPIGRAD_CHECK(average.size() == model.size(), owner, ": the model has ", model.size(),
                " entries, the average has ", average.size());
  for (const auto& [key, tensor] : model.tensors()) {
    const core::Tensor* mine = average.find(key);
    MPIGRAD_CHECK(mine != nullptr, owner, ": the model has '", key, "', the average does not");
    MPIGRAD_CHECK(mine->shape() == tensor.shape(), owner, ": size mismatch for '", key,
                  "': average ", mine->shape(), ", model ", tensor.shape());
  }
}
}  // namespace

ModelEMA::ModelEMA(const Module& model, double decay, bool warmup)
    : decay_(decay), warmup_(warmup) {
  MPIGRAD_CHECK(decay >= 0.0 && decay <= 1.0, "ModelEMA: decay must be in [0, 1], got ", decay);
  const StateDict current = model.state_dict();
  for (const auto& [key, tensor] : current.tensors()) shadow_.set(key, snapshot(tensor));
}

void ModelEMA::update(const Module& model) {
  const StateDict current = model.state_dict();
  check_same_keys(shadow_, current, "ModelEMA.update");
  const double n = double(num_updates_);
  const double d = warmup_ ? std::min(decay_, (1.0 + n) / (10.0 + n)) : decay_;
  core::NoGradGuard no_grad;
  for (const auto& [key, value] : current.tensors()) {
    core::Tensor shadow = *shadow_.find(key);
    if (core::is_floating(shadow.dtype())) {
      shadow.mul_(d).add_(value.to(shadow.device(), shadow.dtype()), 1.0 - d);
    } else {
      shadow.copy_(value);
    }
  }
  ++num_updates_;
}

void ModelEMA::copy_to(Module& model) const {
  model.load_state_dict(shadow_, true);
}

StateDict ModelEMA::state_dict() const {
  StateDict out = shadow_;
  out.set_scalar("num_updates", double(num_updates_));
  return out;
}

void ModelEMA::load_state_dict(const StateDict& state) {
  check_same_keys(shadow_, state, "ModelEMA.load_state_dict");
  core::NoGradGuard no_grad;
  for (const auto& [key, value] : state.tensors()) {
    core::Tensor shadow = *shadow_.find(key);
    shadow.copy_(value.to(shadow.device()));
  }
  num_updates_ = int64_t(state.scalar("num_updates", "ModelEMA.load_state_dict"));
}

void SWAAverager::update(const Module& model) {
  const StateDict current = model.state_dict();
  core::NoGradGuard no_grad;
  if (count_ == 0) {
    average_ = StateDict();
    for (const auto& [key, tensor] : current.tensors()) average_.set(key, snapshot(tensor));
    count_ = 1;
    return;
  }
  check_same_keys(average_, current, "SWAAverager.update");
  ++count_;
  for (const auto& [key, value] : current.tensors()) {
    core::Tensor avg = *average_.find(key);
    if (core::is_floating(avg.dtype())) {
      // avg += (value - avg) / n: the running mean without a growing sum.
      core::Tensor delta = value.to(avg.device(), avg.dtype()) - avg;
      avg.add_(delta, 1.0 / double(count_));
    } else {
      avg.copy_(value);
    }
  }
}

void SWAAverager::copy_to(Module& model) const {
  MPIGRAD_CHECK(count_ > 0, "SWAAverager.copy_to: no model has been averaged yet");
  model.load_state_dict(average_, true);
}

StateDict SWAAverager::state_dict() const {
  StateDict out = count_ > 0 ? average_ : StateDict();
  out.set_scalar("count", double(count_));
  return out;
}

void SWAAverager::load_state_dict(const StateDict& state) {
  const int64_t count = int64_t(state.scalar("count", "SWAAverager.load_state_dict"));
  MPIGRAD_CHECK(count >= 0, "SWAAverager.load_state_dict: count ", count, " is negative");
  MPIGRAD_CHECK(count == 0 || state.size() > 0, "SWAAverager.load_state_dict: count ", count,
                " but no averaged entries");
  core::NoGradGuard no_grad;
  StateDict average;
  for (const auto& [key, value] : state.tensors()) average.set(key, snapshot(value));
  average_ = std::move(average);
  count_ = count;
}

StateDict average_state_dicts(const std::vector<StateDict>& states) {
  MPIGRAD_CHECK(!states.empty(), "average_state_dicts: no state dicts given");
  StateDict out;
  const StateDict& first = states.front();
  core::NoGradGuard no_grad;
  for (const auto& [key, tensor] : first.tensors()) {
    if (!core::is_floating(tensor.dtype())) {
      out.set(key, snapshot(states.back().at(key, "average_state_dicts")));
      continue;
    }
    core::Tensor sum = tensor.detach().to(core::kFloat64).clone().detach();
    for (size_t i = 1; i < states.size(); ++i) {
      const core::Tensor* other = states[i].find(key);
      MPIGRAD_CHECK(other != nullptr, "average_state_dicts: state dict ", i, " lacks '", key, "'");
      MPIGRAD_CHECK(other->shape() == tensor.shape(), "average_state_dicts: size mismatch for '",
                    key, "': ", tensor.shape(), " in state dict 0, ", other->shape(),
                    " in state dict ", i);
      sum.add_(other->to(sum.device(), core::kFloat64));
    }
    sum.div_(double(states.size()));
    out.set(key, sum.to(tensor.dtype()).detach());
  }
  for (size_t i = 1; i < states.size(); ++i) {
    MPIGRAD_CHECK(states[i].size() == first.size(), "average_state_dicts: state dict ", i, " has ",
                  states[i].size(), " entries, state dict 0 has ", first.size());
  }
  return out;
}

void update_bn(Module& model, const std::function<core::Tensor()>& next_batch) {
  std::vector<std::pair<BatchNorm*, std::optional<double>>> norms;
  std::vector<std::pair<Module*, bool>> modes;
  for (auto& [name, module] : model.named_modules()) {
    modes.emplace_back(module, module->is_training());
    if (auto* bn = dynamic_cast<BatchNorm*>(module)) norms.emplace_back(bn, bn->momentum());
  }
  if (norms.empty()) return;
  for (auto& [bn, momentum] : norms) {
    bn->reset_running_stats();
    bn->set_momentum(std::nullopt);
  }
  // Restore momenta and modes even if a forward throws.
  struct Restore {
    decltype(norms)& n;
    decltype(modes)& m;
    ~Restore() {
      for (auto& [bn, momentum] : n) bn->set_momentum(momentum);
      for (auto& [module, training] : m) module->train(training);
    }
  } restore{norms, modes};
  model.train(true);
  core::NoGradGuard no_grad;
  for (core::Tensor batch = next_batch(); batch.defined(); batch = next_batch())
    model.forward(batch);
}

}  // namespace mpigrad::nn
