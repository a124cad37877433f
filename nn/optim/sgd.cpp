#include "mpigrad/nn/optim/sgd.h"

#include <map>
#include <utility>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/backend.h"

namespace mpigrad::nn {

SGD::SGD(std::vector<ParamGroupSpec> groups, const SGDOptions& options)
    : Optimizer(std::move(groups), options.lr, options.weight_decay, options.momentum),
      options_(options) {
  MPIGRAD_CHECK(options.dampening >= 0.0, "SGD: invalid dampening ", options.dampening);
  for (const ParamGroup& group : param_groups()) {
    MPIGRAD_CHECK(group.momentum >= 0.0, "SGD: invalid momentum ", group.momentum);
    MPIGRAD_CHECK(!options.nesterov || (group.momentum > 0.0 && options.dampening == 0.0),
                  "SGD: nesterov momentum requires a momentum > 0 and zero dampening");
  }
}

void SGD::step() {
  core::NoGradGuard no_grad;
  // Parameters are collected per (device, dtype) and updated by one backend call each (one fused
  // launch on CUDA); `keep` holds the gradients converted for the kernels until then.
  std::map<SlotKey, std::vector<core::SgdSlot>> slots;
  std::vector<Tensor> keep;
  size_t index = 0;
  for (ParamGroup& group : param_groups()) {
    for (Tensor& p : group.params) {
      ParamState& s = state(index++);
      if (!p.grad().defined()) continue;
      Tensor grad = checked_grad(p);
      kernels::SgdHyper hyper;
      hyper.lr = group.lr;
      hyper.momentum = group.momentum;
      hyper.dampening = options_.dampening;
      hyper.weight_decay = group.weight_decay;
      hyper.nesterov = options_.nesterov;
      void* buffer = nullptr;
      if (group.momentum != 0.0) {
        Tensor* existing = s.find("momentum_buffer");
        hyper.first_step = existing == nullptr;
        if (existing == nullptr) {
          s.tensors.emplace_back("momentum_buffer", core::zeros_like(p).detach());
          existing = &s.tensors.back().second;
        }
        buffer = existing->data_ptr();
      }
      ++s.step;
      core::SgdSlot slot;
      slot.param = p.data_ptr();
      slot.grad = grad.data_ptr();
      slot.momentum_buffer = buffer;
      slot.numel = p.numel();
      slot.hyper = hyper;
      slots[slot_key(p)].push_back(slot);
      keep.push_back(grad);
      p.storage()->bump_version();
    }
  }
  for (const auto& [key, group] : slots) {
    core::backend_for(slot_device(key))
        .sgd_step(std::get<2>(key), int64_t(group.size()), group.data());
  }
}

}  // namespace mpigrad::nn
