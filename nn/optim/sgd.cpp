#include "mpigrad/nn/optim/sgd.h"

#include <map>
#include <utility>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/kernels/optimizer.h"
#if defined(MPIGRAD_WITH_CUDA)
#include "mpigrad/nn/cuda/cuda_ops.h"
#endif

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
  // CUDA parameters are collected per (device, dtype) and updated by one fused launch each;
  // `keep` holds the gradients converted for the kernels until then.
  std::map<std::pair<int, core::DType>, std::vector<kernels::cuda::SgdSlot>> cuda_slots;
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
      if (p.device().is_cuda()) {
        kernels::cuda::SgdSlot slot;
        slot.param = p.data_ptr();
        slot.grad = grad.data_ptr();
        slot.momentum_buffer = buffer;
        slot.numel = p.numel();
        slot.hyper = hyper;
        cuda_slots[{p.device().index, p.dtype()}].push_back(slot);
        keep.push_back(grad);
      } else {
        kernels::cpu::sgd_step(p.dtype(), p.numel(), hyper, p.data_ptr(), grad.data_ptr(), buffer);
      }
      p.storage()->bump_version();
    }
  }
  for (const auto& [key, slots] : cuda_slots) {
#if defined(MPIGRAD_WITH_CUDA)
    cuda_ops::sgd_step_multi(core::cuda(key.first), key.second, slots);
#else
    (void)slots;
    core::fail("SGD: this libmpigrad has no CUDA backend");
#endif
  }
}

}  // namespace mpigrad::nn
