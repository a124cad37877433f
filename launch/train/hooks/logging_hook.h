// LoggingHook: rank 0 logs loss, lr and throughput every log_every optimizer steps (a progress
// bar on a terminal outside mpirun/srun or with MPIGRAD_PROGRESS_BAR=1, plain lines otherwise)
// and appends metrics.jsonl; every scalar of metrics.jsonl also goes to TensorBoard event files
// in out_dir/tb when asked. The logged loss is the mean over ranks of their mean losses.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mpigrad/launch/train/hook.h"

namespace mpigrad::launch {

class EventFileWriter;

// The TensorBoard tag of a metrics.jsonl scalar: test_<name> is "test/<name>", any other
// <name> "train/<name>" (so loss, lr and samples_per_s are train/..., and a new metric of the
// evaluation function appears as test/<metric> with no code of its own).
std::string tensorboard_tag(const std::string& metric);

class LoggingHook final : public Hook {
 public:
  static constexpr int kOrder = 1200;
  // Logs every `every` optimizer steps; metrics.jsonl goes to out_dir (rank 0). With
  // `tensorboard`, rank 0 also writes every scalar of metrics.jsonl to an event file in
  // out_dir/tb, at the optimizer step it was logged at (evaluations: the step at the end of
  // their epoch), flushed after every epoch and closed at the end.
  LoggingHook(std::string out_dir, int64_t every, bool tensorboard = false);
  ~LoggingHook() override;
  std::string name() const override { return "logging"; }
  HookStages stages() const override {
    return {HookStage::Setup,        HookStage::BeforeEpoch,
            HookStage::AfterLoss,    HookStage::AfterOptimizerStep,
            HookStage::AfterEpoch,   HookStage::AfterValidation,
            HookStage::AfterTraining};
  }
  // Last: a resumed run appends to the metrics it continues (setup), the lr logged is the one
  // the scheduler and SWA set (after a step), and hook metrics are in (after validation).
  HookPlace place() const override {
    return {kOrder, {"checkpoint", "lr_scheduler", "swa", "retrieval_metrics"}};
  }
  void on(HookStage stage, TrainingContext& context) override;
  double samples_per_second() const;  // over the whole run so far
  // The event file being written, or empty.
  std::string tensorboard_path() const;
  // One line of metrics.jsonl (rank 0; nothing elsewhere): the integer `counters` (step, epoch)
  // then the `scalars`, which also go to TensorBoard at `step` under tensorboard_tag(name).
  // The loss and evaluation lines are written through it; other code with scalars to log calls
  // it too, and they reach both files with no code of their own.
  void write_record(const std::vector<std::pair<std::string, int64_t>>& counters,
                    const std::vector<std::pair<std::string, double>>& scalars, int64_t step);

 private:
  void setup(TrainingContext& context);
  void log_step(TrainingContext& context);
  void log_validation(TrainingContext& context);

  std::string out_dir_;
  int64_t log_every_;
  bool tensorboard_wanted_;
  std::unique_ptr<EventFileWriter> tensorboard_;
  bool main_process_ = false;
  bool tty_ = false;
  std::ofstream metrics_;
  std::chrono::steady_clock::time_point start_, last_log_;
  double train_seconds_ = 0;
  int64_t samples_ = 0, samples_since_log_ = 0;
  // Summed on the loss's device and read back only on logging steps: reading a GPU loss every
  // step would synchronize the host with the device every step.
  core::Tensor loss_sum_;
  int64_t loss_count_ = 0;
};

}  // namespace mpigrad::launch
