// CudaGraphHook: [train] cuda_graphs for embedded models on a CUDA device. It claims forward and
// backward, which CapturedStep (launch/train/captured_step.h) runs eagerly for the warm-up
// steps, then captures as one CUDA graph and replays while the batch's arrays keep their
// addresses. It also claims the optimizer step: once captured, the gradients belong to the
// graph, which rewrites them every replay, so they are never reset to none. The caller checks
// that graphs apply (one rank, no accumulation, no fp16 loss scaling, no dropout) before adding
// it, and says whether each batch's arrays are the caller's own memory (set_arrays_in_place).
#pragma once

#include <cstdint>
#include <string>

#include "mpigrad/core/device.h"
#include "mpigrad/launch/train/captured_step.h"
#include "mpigrad/launch/train/hook.h"

namespace mpigrad::launch {

class CudaGraphHook final : public Hook {
 public:
  static constexpr int kOrder = 350;
  CudaGraphHook(core::Device device, int64_t warmup) : captured_(device, warmup) {}
  std::string name() const override { return "cuda_graph"; }
  HookStages stages() const override { return {}; }
  HookPlace place() const override { return {kOrder}; }
  void on(HookStage, TrainingContext&) override {}
  bool replaces_forward_backward() const override { return true; }
  core::Tensor forward_backward(TrainingContext& context,
                                const std::function<core::Tensor()>& compute) override;
  bool replaces_optimizer_step() const override { return true; }
  void optimizer_step(TrainingContext& context) override;

  // Whether the next batch's arrays are where the caller put them (not converted copies): only
  // then may a replay read them.
  void set_arrays_in_place(bool in_place) { arrays_in_place_ = in_place; }
  CapturedStep& captured_step() { return captured_; }
  const CapturedStep& captured_step() const { return captured_; }

 private:
  CapturedStep captured_;
  bool arrays_in_place_ = false;
};

}  // namespace mpigrad::launch
