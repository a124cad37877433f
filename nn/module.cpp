#include "mpigrad/nn/module.h"

#include <algorithm>
#include <sstream>
#include <unordered_set>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"

namespace mpigrad::nn {

using core::Device;
using core::DType;

void Module::check_new_name(const std::string& name) const {
  MPIGRAD_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name(),
                ": invalid member name '", name, "' (must be non-empty and contain no '.')");
  auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& e) {
      if constexpr (std::is_same_v<std::decay_t<decltype(e)>, std::unique_ptr<Slot>>) {
        return e->name == name;
      } else {
        return e.first == name;
      }
    });
  };
  MPIGRAD_CHECK(!taken(parameters_) && !taken(buffers_) && !taken(children_) && !taken(generators_),
                type_name(), ": member name '", name, "' is already registered");
}

Tensor& Module::register_parameter(const std::string& name, Tensor value) {
  check_new_name(name);
  MPIGRAD_CHECK(value.defined(), type_name(), ": parameter '", name, "' is undefined");
  if (!value.is_leaf()) value = value.detach();
  if (core::is_floating(value.dtype())) value.set_requires_grad(true);
  parameters_.push_back(std::make_unique<Slot>(Slot{name, std::move(value), true}));
  return parameters_.back()->tensor;
}

Tensor& Module::register_buffer(const std::string& name, Tensor value, bool persistent) {
  check_new_name(name);
  MPIGRAD_CHECK(value.defined(), type_name(), ": buffer '", name, "' is undefined");
  buffers_.push_back(std::make_unique<Slot>(Slot{name, value.detach(), persistent}));
  return buffers_.back()->tensor;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name);
  MPIGRAD_CHECK(module != nullptr, type_name(), ": child module '", name, "' is null");
  children_.emplace_back(name, std::move(module));
}

void Module::register_generator(const std::string& name,
                                std::shared_ptr<core::Generator> generator) {
  check_new_name(name);
  MPIGRAD_CHECK(generator != nullptr, type_name(), ": generator '", name, "' is null");
  generators_.emplace_back(name, std::move(generator));
}

void Module::collect(const std::string& prefix, bool recurse, bool parameters_wanted,
                     bool persistent_only, std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& slot : parameters_wanted ? parameters_ : buffers_) {
    if (persistent_only && !slot->persistent) continue;
    out.emplace_back(prefix + slot->name, slot->tensor);
  }
  if (!recurse) return;
  for (const auto& [name, child] : children_) {
    child->collect(prefix + name + ".", true, parameters_wanted, persistent_only, out);
  }
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", recurse, true, false, out);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, tensor] : named_parameters(recurse)) out.push_back(tensor);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", recurse, false, false, out);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, tensor] : named_buffers(recurse)) out.push_back(tensor);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  return children_;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [name, child] : children_) out.push_back(child);
  return out;
}

std::shared_ptr<Module> Module::replace_child(const std::string& name,
                                              std::shared_ptr<Module> module) {
  MPIGRAD_CHECK(module != nullptr, type_name(), ": replacement for child module '", name,
                "' is null");
  for (auto& [child_name, child] : children_) {
    if (child_name == name) {
      std::swap(child, module);
      return module;
    }
  }
  core::fail(type_name(), ": no child module named '", name, "' to replace");
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  // Iterative depth-first walk: a deep Sequential must not exhaust the stack.
  std::vector<std::pair<std::string, Module*>> stack{{"", this}};
  while (!stack.empty()) {
    auto [prefix, module] = stack.back();
    stack.pop_back();
    out.emplace_back(prefix, module);
    for (auto it = module->children_.rbegin(); it != module->children_.rend(); ++it) {
      stack.emplace_back(prefix.empty() ? it->first : prefix + "." + it->first, it->second.get());
    }
  }
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<core::Generator>>> Module::named_generators()
    const {
  std::vector<std::pair<std::string, std::shared_ptr<core::Generator>>> out = generators_;
  for (const auto& [name, child] : children_) {
    for (auto& [child_name, generator] : child->named_generators()) {
      out.emplace_back(name + "." + child_name, generator);
    }
  }
  return out;
}

namespace {
template <typename Slots>
Tensor& find_slot(Slots& slots, const std::string& name, const std::string& owner,
                  const char* kind) {
  for (auto& slot : slots) {
    if (slot->name == name) return slot->tensor;
  }
  core::fail(owner, ": no ", kind, " named '", name, "'");
}
}  // namespace

Tensor& Module::parameter(const std::string& name) {
  return find_slot(parameters_, name, type_name(), "parameter");
}
Tensor& Module::buffer(const std::string& name) {
  return find_slot(buffers_, name, type_name(), "buffer");
}
bool Module::has_parameter(const std::string& name) const {
  return std::any_of(parameters_.begin(), parameters_.end(),
                     [&](const auto& slot) { return slot->name == name; });
}

Module& Module::train(bool training) {
  for (auto& [name, module] : named_modules()) module->training_ = training;
  return *this;
}

Module& Module::to(Device device) {
  return to_impl(device, std::nullopt);
}
Module& Module::to(DType dtype) {
  return to_impl(std::nullopt, dtype);
}
Module& Module::to(Device device, DType dtype) {
  return to_impl(device, dtype);
}

Module& Module::to_impl(std::optional<Device> device, std::optional<DType> dtype) {
  core::NoGradGuard no_grad;
  for (auto& [name, module] : named_modules()) {
    for (auto* slots : {&module->parameters_, &module->buffers_}) {
      for (auto& slot : *slots) {
        Tensor& t = slot->tensor;
        const Device target_device = device.value_or(t.device());
        const DType target_dtype = dtype && core::is_floating(t.dtype()) ? *dtype : t.dtype();
        if (target_device == t.device() && target_dtype == t.dtype()) continue;
        const bool requires_grad = t.requires_grad();
        Tensor moved = t.detach().to(target_device, target_dtype);
        if (moved.is_same(t)) moved = moved.clone();
        moved = moved.detach();
        if (requires_grad) moved.set_requires_grad(true);
        t = moved;
      }
    }
  }
  return *this;
}

void Module::zero_grad(bool set_to_none) {
  core::zero_grad(parameters(), set_to_none);
}

int64_t Module::num_parameters(bool trainable_only) const {
  int64_t total = 0;
  for (auto& [name, p] : named_parameters()) {
    if (!trainable_only || p.requires_grad()) total += p.numel();
  }
  return total;
}

void Module::print(std::ostream& out, int indent) const {
  out << type_name() << "(";
  const std::string extra = extra_repr();
  if (children_.empty()) {
    out << extra << ")";
    return;
  }
  const std::string pad(size_t(indent + 2), ' ');
  if (!extra.empty()) out << "\n" << pad << extra;
  for (const auto& [name, child] : children_) {
    out << "\n" << pad << "(" << name << "): ";
    child->print(out, indent + 2);
  }
  out << "\n" << std::string(size_t(indent), ' ') << ")";
}

std::string Module::str() const {
  std::ostringstream out;
  print(out, 0);
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const Module& module) {
  return out << module.str();
}

StateDict Module::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> entries;
  // PyTorch order: each module's parameters, then its buffers, then its children.
  std::vector<std::pair<std::string, const Module*>> stack{{"", this}};
  StateDict state;
  while (!stack.empty()) {
    auto [prefix, module] = stack.back();
    stack.pop_back();
    for (const auto& slot : module->parameters_)
      state.set(prefix + slot->name, slot->tensor.detach());
    for (const auto& slot : module->buffers_) {
      if (slot->persistent) state.set(prefix + slot->name, slot->tensor.detach());
    }
    for (auto it = module->children_.rbegin(); it != module->children_.rend(); ++it) {
      stack.emplace_back(prefix + it->first + ".", it->second.get());
    }
  }
  return state;
}

LoadResult Module::load_state_dict(const StateDict& state, bool strict) {
  LoadResult result;
  std::vector<std::pair<std::string, Tensor*>> targets;
  for (auto& [prefix, module] : named_modules()) {
    const std::string dotted = prefix.empty() ? "" : prefix + ".";
    for (auto& slot : module->parameters_) targets.emplace_back(dotted + slot->name, &slot->tensor);
    for (auto& slot : module->buffers_) {
      if (slot->persistent) targets.emplace_back(dotted + slot->name, &slot->tensor);
    }
  }
  std::unordered_set<std::string> known;
  // Validate everything before copying anything, so a failed load leaves the module untouched.
  for (auto& [key, target] : targets) {
    known.insert(key);
    const Tensor* source = state.find(key);
    if (source == nullptr) {
      result.missing_keys.push_back(key);
      continue;
    }
    MPIGRAD_CHECK(source->shape() == target->shape(), "load_state_dict: size mismatch for '", key,
                  "': the model expects shape ", target->shape(), ", the state dict has ",
                  source->shape());
    MPIGRAD_CHECK(core::is_floating(source->dtype()) == core::is_floating(target->dtype()),
                  "load_state_dict: dtype mismatch for '", key, "': the model expects ",
                  target->dtype(), ", the state dict has ", source->dtype());
  }
  for (const auto& [key, tensor] : state.tensors()) {
    if (!known.count(key)) result.unexpected_keys.push_back(key);
  }
  if (strict && (!result.missing_keys.empty() || !result.unexpected_keys.empty())) {
    std::ostringstream message;
    message << "load_state_dict: error(s) in loading state dict for " << type_name() << ":";
    if (!result.missing_keys.empty()) {
      message << " missing key(s):";
      for (const auto& key : result.missing_keys) message << " '" << key << "'";
      message << ".";
    }
    if (!result.unexpected_keys.empty()) {
      message << " unexpected key(s):";
      for (const auto& key : result.unexpected_keys) message << " '" << key << "'";
      message << ".";
    }
    throw core::Error(message.str());
  }
  core::NoGradGuard no_grad;
  for (auto& [key, target] : targets) {
    const Tensor* source = state.find(key);
    if (source == nullptr || source->is_same(*target)) continue;
    target->copy_(source->to(target->device()));
  }
  return result;
}

}  // namespace mpigrad::nn
