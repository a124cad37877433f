#include "mpigrad/nn/optim/sgd.h"

#include <utility>
#include <vector>

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
  step_batched<core::SgdSlot>(
      [&](const Update& u) {
        ParamState& s = u.state;
        kernels::SgdHyper hyper;
        hyper.lr = u.group.lr;
        hyper.momentum = u.group.momentum;
        hyper.dampening = options_.dampening;
        hyper.weight_decay = u.group.weight_decay;
        hyper.nesterov = options_.nesterov;
        void* buffer = nullptr;
        if (u.group.momentum != 0.0) {
          Tensor* existing = s.find("momentum_buffer");
          hyper.first_step = existing == nullptr;
          if (existing == nullptr) {
            s.tensors.emplace_back("momentum_buffer", core::zeros_like(u.param).detach());
            existing = &s.tensors.back().second;
          }
          buffer = existing->data_ptr();
        }
        ++s.step;
        core::SgdSlot slot;
        slot.param = u.param.data_ptr();
        slot.grad = u.grad.data_ptr();
        slot.momentum_buffer = buffer;
        slot.numel = u.param.numel();
        slot.hyper = hyper;
        return slot;
      },
      [](core::Device device, core::DType dtype, std::vector<core::SgdSlot>& slots) {
        core::backend_for(device).sgd_step(dtype, int64_t(slots.size()), slots.data());
      });
}

}  // namespace mpigrad::nn
