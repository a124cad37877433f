#include "mpigrad/nn/optim/sgd.h"

#include "mpigrad/core/autograd.h"
#include "mpigrad/kernels/optimizer.h"

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
      kernels::cpu::sgd_step(p.dtype(), p.numel(), hyper, p.data_ptr(), grad.data_ptr(), buffer);
      p.storage()->bump_version();
    }
  }
}

}  // namespace mpigrad::nn
