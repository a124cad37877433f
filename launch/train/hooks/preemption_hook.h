// PreemptionHook: stops the run on a stop signal or the time limit, on every rank at the same
// optimizer step, so that CheckpointHook saves it mid-epoch and a later run resumes it with
// nothing lost. How the ranks agree, and what the signals and limits are, is in
// launch/train/preemption.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/comm/work.h"
#include "mpigrad/launch/train/hook.h"
#include "mpigrad/launch/train/preemption.h"

namespace mpigrad::launch {

struct PreemptionSettings {
  std::vector<int> signals;        // empty: no handler is installed
  int64_t time_limit_seconds = 0;  // 0: none
  // Where the time limit counts from (the program's start, ideally; the hook's setup when
  // unset).
  std::chrono::steady_clock::time_point start{};
};

class PreemptionHook final : public Hook {
 public:
  static constexpr int kOrder = 200;
  // Reads MPIGRAD_TEST_RAISE_SIGNAL (launch/train/preemption.h); a malformed value is a
  // core::Error naming it.
  explicit PreemptionHook(PreemptionSettings settings);
  ~PreemptionHook() override;
  std::string name() const override { return "preemption"; }
  HookStages stages() const override {
    return {HookStage::Setup, HookStage::AfterBackward, HookStage::AfterOptimizerStep,
            HookStage::AfterTraining};
  }
  // At the end it restores the signal handlers only once the stop's checkpoint is written.
  HookPlace place() const override { return {kOrder, {"checkpoint"}}; }
  void on(HookStage stage, TrainingContext& context) override;
  // Why training stopped ("signal USR1 on rank 1", "signal USR1 on all 4 ranks", "time_limit
  // 1h30m on rank 0's clock"), or empty when it was not preempted.
  const std::string& reason() const { return reason_; }

 private:
  void at_step_boundary(TrainingContext& context);
  void raise_test_signals(TrainingContext& context, int64_t step);
  bool decide(TrainingContext& context, const std::vector<int64_t>& agreed);
  std::string signalled_ranks(TrainingContext& context) const;

  PreemptionSettings settings_;
  std::unique_ptr<StopSignalHandlers> handlers_;
  core::Tensor agreement_;  // {signal, rank + 1 that saw it, time is up}: the all-reduce's buffer
  WorkPtr pending_;
  std::string reason_;
  std::vector<TestSignal> test_signals_;  // MPIGRAD_TEST_RAISE_SIGNAL (preemption.h)
};

}  // namespace mpigrad::launch
