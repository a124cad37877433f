#include "mpigrad/launch/train/hooks/preemption_hook.h"

#include <csignal>

#include "mpigrad/core/error.h"
#include "mpigrad/launch/job/distributed_manager.h"

namespace mpigrad::launch {

PreemptionHook::PreemptionHook(PreemptionSettings settings)
    : settings_(std::move(settings)), test_signals_(test_signals_from_environment()) {}

// A pending agreement is completed before the handlers go: its buffer is ours.
PreemptionHook::~PreemptionHook() {
  try {
    if (pending_) pending_->wait();
  } catch (...) {
  }
}

void PreemptionHook::raise_test_signals(TrainingContext& context, int64_t step) {
  for (const TestSignal& test : test_signals_) {
    if (test.rank == context.manager->rank() && test.step == step) std::raise(test.signal);
  }
}

void PreemptionHook::on(HookStage stage, TrainingContext& context) {
  if (stage == HookStage::Setup) {
    if (settings_.start == std::chrono::steady_clock::time_point{}) {
      settings_.start = std::chrono::steady_clock::now();
    }
    if (!settings_.signals.empty()) {
      handlers_ = std::make_unique<StopSignalHandlers>(settings_.signals);
    }
    agreement_ = core::Tensor::from_vector<int64_t>({0, 0, 0}, {3});
  } else if (stage == HookStage::AfterBackward) {
    // MPI moves a non-blocking collective on only inside MPI calls: one test here lets the
    // agreement finish during the step, so the wait at its end finds it done.
    if (pending_) pending_->test();
  } else if (stage == HookStage::AfterOptimizerStep) {
    at_step_boundary(context);
  } else if (stage == HookStage::AfterTraining) {
    // Every rank started the same agreements, so every rank completes the last one here.
    if (pending_) {
      pending_->wait();
      pending_.reset();
    }
    handlers_.reset();  // after CheckpointHook's write, which runs before this hook
  }
}

// Every rank reaches the stop at the same boundary, so this one blocking all-reduce per run is
// safe; it counts the signals received by now, not only those the agreement carried a step ago.
std::string PreemptionHook::signalled_ranks(TrainingContext& context) const {
  DistributedManager& manager = *context.manager;
  SignalTally tally;
  tally.add(handlers_ ? handlers_->received() : 0, manager.rank());
  if (manager.world_size() > 1) {
    core::Tensor sum = core::Tensor::from_vector<int64_t>(tally.counts, {SignalTally::kSignals});
    manager.world().all_reduce(sum, ReduceOp::Sum);
    tally.counts = sum.to_vector<int64_t>();
  }
  return tally.describe(manager.world_size());
}

bool PreemptionHook::decide(TrainingContext& context, const std::vector<int64_t>& agreed) {
  const int64_t signal = agreed[0], signal_rank = agreed[1] - 1, time_up = agreed[2];
  if (signal == 0 && time_up == 0) return false;
  if (signal != 0) {
    reason_ = signalled_ranks(context);
    // A test's raise on a rank without handlers still stops the run; name it as the agreement did.
    if (reason_.empty()) {
      reason_ =
          "signal " + stop_signal_name(int(signal)) + " on rank " + std::to_string(signal_rank);
    }
  } else {
    reason_ = "time_limit " + format_duration(settings_.time_limit_seconds) + " on rank 0's clock";
  }
  context.stop = true;
  context.preempted = true;
  raise_test_signals(context, -1);
  return true;
}

void PreemptionHook::at_step_boundary(TrainingContext& context) {
  // Nothing to agree on: no collective either.
  const bool watching = handlers_ || settings_.time_limit_seconds > 0 || !test_signals_.empty();
  if (context.preempted || !watching) return;
  // The run's last step: it ends now anyway, with its epoch's checkpoint (the same on every
  // rank: all count the same steps and batches).
  const bool last_step = (context.max_steps > 0 && context.step >= context.max_steps) ||
                         (context.epoch + 1 == context.epochs && context.train_loader != nullptr &&
                          context.batch_in_epoch + 1 >= context.train_loader->size());
  if (last_step) return;
  raise_test_signals(context, context.step);
  DistributedManager& manager = *context.manager;
  const int signal = handlers_ ? handlers_->received() : 0;
  bool time_up = false;
  if (manager.is_main_process() && settings_.time_limit_seconds > 0) {
    // Compared in seconds: a limit of centuries would overflow int64 nanoseconds.
    const auto elapsed = std::chrono::duration_cast<std::chrono::seconds>(
        std::chrono::steady_clock::now() - settings_.start);
    time_up = elapsed.count() >= settings_.time_limit_seconds;
  }
  const std::vector<int64_t> mine = {signal, signal != 0 ? manager.rank() + 1 : 0, time_up ? 1 : 0};
  if (manager.world_size() == 1) {
    decide(context, mine);
    return;
  }
  if (pending_) {
    pending_->wait();
    pending_.reset();
    if (decide(context, agreement_.to_vector<int64_t>())) return;
  }
  agreement_ = core::Tensor::from_vector<int64_t>(mine, {3});
  pending_ = manager.world().all_reduce_async(agreement_, ReduceOp::Max);
}

}  // namespace mpigrad::launch
