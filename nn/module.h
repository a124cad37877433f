// Module: the base of every layer and model. It owns named parameters, buffers, child modules
// and random generators, all kept in registration order, and derives PyTorch's dotted names
// from the tree ("features.0.weight").
//
// A subclass registers what it owns in its constructor and implements forward(). Parameters and
// buffers live in slots owned by the module: register_parameter returns a reference to the slot
// that stays valid for the module's lifetime, and to(device, dtype) replaces the tensor inside
// the slot. So keep `Tensor*` (or the returned reference) to a slot, never a copy of the Tensor,
// and build optimizers and DDP wrappers after moving the model.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "mpigrad/core/rng.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/nn/state_dict.h"

namespace mpigrad::nn {

using core::Tensor;

// What a non-strict load_state_dict did not match.
struct LoadResult {
  std::vector<std::string> missing_keys;     // in the module, not in the state dict
  std::vector<std::string> unexpected_keys;  // in the state dict, not in the module
};

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual Tensor forward(const Tensor& input) = 0;
  Tensor operator()(const Tensor& input) { return forward(input); }

  // The class name as printed ("Linear") and the text inside its parentheses.
  virtual std::string type_name() const = 0;
  virtual std::string extra_repr() const { return {}; }

  // ---- The tree -----------------------------------------------------------------------------
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  std::vector<std::shared_ptr<Module>> children() const;
  // Puts `module` in place of the child registered as `name` (same name, same position) and
  // returns the old one; core::Error if there is no such child. Code that walks children (as
  // Sequential does) sees the new module; a subclass that kept its own pointer to the old child
  // does not. launch's convert_sync_batchnorm swaps BatchNorm layers with it.
  std::shared_ptr<Module> replace_child(const std::string& name, std::shared_ptr<Module> module);
  // This module ("") and every descendant, depth first in registration order.
  std::vector<std::pair<std::string, Module*>> named_modules();
  // Every generator owned by this module or a descendant (Dropout's), with dotted names.
  std::vector<std::pair<std::string, std::shared_ptr<core::Generator>>> named_generators() const;

  // Direct access by (non-dotted) name to this module's own slots; core::Error if absent.
  Tensor& parameter(const std::string& name);
  Tensor& buffer(const std::string& name);
  bool has_parameter(const std::string& name) const;

  // ---- Modes and placement ------------------------------------------------------------------
  // Sets training mode here and in every descendant; returns *this.
  Module& train(bool training = true);
  Module& eval() { return train(false); }
  bool is_training() const { return training_; }

  // Moves every parameter and buffer. A dtype change applies to floating tensors only
  // (integer buffers such as num_batches_tracked keep Int64), like torch.nn.Module.to.
  // Gradients are dropped.
  Module& to(core::Device device);
  Module& to(core::DType dtype);
  Module& to(core::Device device, core::DType dtype);

  // Clears every parameter's gradient: undefined (set_to_none) or filled with zeros.
  void zero_grad(bool set_to_none = true);
  // The number of parameter elements (only those requiring grad when trainable_only).
  int64_t num_parameters(bool trainable_only = false) const;

  // PyTorch's repr: "Sequential(\n  (0): Linear(in_features=2, ...)\n)".
  std::string str() const;

  // ---- State --------------------------------------------------------------------------------
  // Parameters and persistent buffers by dotted name, in registration order (aliases, no copy).
  StateDict state_dict() const;
  // Copies values in (converting the device, and between floating dtypes). A shape mismatch, or
  // a floating/integer dtype mismatch, is always a core::Error naming the key, the expected and
  // the found shape or dtype. strict: a missing or unexpected key is an error too; otherwise
  // they are returned.
  LoadResult load_state_dict(const StateDict& state, bool strict = true);

 protected:
  // Registers a leaf that requires grad (when floating). Names are unique and have no '.'.
  Tensor& register_parameter(const std::string& name, Tensor value);
  // Non-persistent buffers are moved by to() but left out of state_dict.
  Tensor& register_buffer(const std::string& name, Tensor value, bool persistent = true);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }
  void register_generator(const std::string& name, std::shared_ptr<core::Generator> generator);
  void add_child(const std::string& name, std::shared_ptr<Module> module);

 private:
  struct Slot {
    std::string name;
    Tensor tensor;
    bool persistent = true;
  };
  void check_new_name(const std::string& name) const;
  Module& to_impl(std::optional<core::Device> device, std::optional<core::DType> dtype);
  void collect(const std::string& prefix, bool recurse, bool parameters_wanted,
               bool persistent_only, std::vector<std::pair<std::string, Tensor>>& out) const;
  void print(std::ostream& out, int indent) const;

  std::vector<std::unique_ptr<Slot>> parameters_;
  std::vector<std::unique_ptr<Slot>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<std::pair<std::string, std::shared_ptr<core::Generator>>> generators_;
  bool training_ = true;
};

std::ostream& operator<<(std::ostream& out, const Module& module);

}  // namespace mpigrad::nn
