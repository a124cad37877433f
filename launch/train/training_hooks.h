// The built-in hooks of TrainingStrategy. Each does one thing and touches only what it names:
//   DDPHook               wraps the model in DistributedDataParallel and gives the training
//                         loader a distributed sampler (nothing at world size 1); with
//                         DdpOptions::zero it steps the optimizer through ZeRO-1 (claims the
//                         optimizer step)
//   CheckpointHook        resumes from a checkpoint, at an epoch's end or mid-epoch; rank 0
//                         writes ckpt-step0.h5 (optional), ckpt-epoch<N>.h5 and last.h5, and
//                         ckpt-epoch<N>-step<S>.h5 when preempted, atomically, with the state of
//                         every hook that has one (Hook::state_dict)
//   LRSchedulerHook       steps a scheduler after every optimizer step
//   GradAccumulationHook  k micro-batches per optimizer step, with DDP's no_sync (claims backward)
//   GradClipHook          clips the global gradient norm before each step
//   EMAHook               keeps an exponential moving average of the weights, and offers
//                         it to validation when given a model to hold it
//   LoggingHook           rank 0 logs loss, lr and throughput (a progress bar on a terminal
//                         outside mpirun/srun or with MPIGRAD_PROGRESS_BAR=1, plain lines
//                         otherwise) and appends metrics.jsonl; every scalar of metrics.jsonl
//                         also goes to TensorBoard event files in out_dir/tb when asked
// The scheduler's state is handed to CheckpointHook (it lives in the checkpoint's /scheduler).
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mpigrad/launch/ddp/distributed_data_parallel.h"
#include "mpigrad/launch/ddp/zero_redundancy.h"
#include "mpigrad/launch/train/training_strategy.h"
#include "mpigrad/nn/checkpoint.h"
#include "mpigrad/nn/optim/lr_scheduler.h"
#include "mpigrad/nn/weight_averaging.h"

namespace mpigrad::launch {

class EventFileWriter;

// Overrides of the distributed sampler DDPHook installs (PyTorch's sampler kwargs); unset fields
// keep the loader's own options.
struct DistributedSamplerSettings {
  std::optional<bool> shuffle;
  std::optional<uint64_t> seed;
  std::optional<bool> drop_last;
};

// Builds a custom distributed batch sampler for (loader, num_replicas, rank).
using BatchSamplerFactory = std::function<std::shared_ptr<data::BatchSamplerBase>(
    const data::DataLoader& loader, int64_t num_replicas, int64_t rank)>;

class DDPHook final : public Hook {
 public:
  // `communicator` carries the gradients; null means the manager's world (MPI).
  explicit DDPHook(DdpOptions options = {}, DistributedSamplerSettings sampler = {},
                   BatchSamplerFactory custom_sampler = nullptr,
                   Communicator* communicator = nullptr);
  ~DDPHook() override;
  std::string name() const override { return "ddp"; }
  void on(HookStage stage, TrainingContext& context) override;
  DistributedDataParallel* ddp() { return ddp_.get(); }
  ZeroRedundancyOptimizer* zero() { return zero_.get(); }

 private:
  void install_sampler(data::DataLoader& loader, int64_t replicas, int64_t rank);

  DdpOptions options_;
  DistributedSamplerSettings sampler_;
  BatchSamplerFactory custom_sampler_;
  Communicator* communicator_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<ZeroRedundancyOptimizer> zero_;
};

struct CheckpointSettings {
  std::string out_dir;
  std::string resume;            // checkpoint to resume from, "auto" (newest_checkpoint), or empty
  bool save_initial = false;     // ckpt-step0.h5 before the first step
  std::string config_text;       // stored in every checkpoint
  int64_t keep_checkpoints = 0;  // the newest N of checkpoint_files stay; older ones go; 0: all
};

// A checkpoint CheckpointHook wrote: ckpt-epoch<N>.h5 after N epochs, or ckpt-epoch<N>-step<S>.h5
// when a run was preempted after N epochs and optimizer step S (launch/train/preemption.h).
struct CheckpointFile {
  int64_t epochs = 0;  // epochs finished
  int64_t step = -1;   // the optimizer step of a mid-epoch checkpoint; -1: an epoch's end
  std::string path;
  // Newer is later in training: more epochs, then mid-epoch after the epoch's start.
  bool operator<(const CheckpointFile& other) const {
    return epochs != other.epochs ? epochs < other.epochs : step < other.step;
  }
};
// The checkpoints of `out_dir`, oldest first (names CheckpointHook does not write, such as a
// user's ckpt-epoch2-best.h5, are not listed). Files are written to a temporary name and
// renamed, so every file listed is complete.
std::vector<CheckpointFile> checkpoint_files(const std::string& out_dir);
// The newest of them, or empty when there is none: what `[train] resume = auto` loads first.
std::string newest_checkpoint(const std::string& out_dir);

class CheckpointHook final : public Hook {
 public:
  explicit CheckpointHook(CheckpointSettings settings, nn::LRScheduler* scheduler = nullptr);
  std::string name() const override { return "checkpoint"; }
  void on(HookStage stage, TrainingContext& context) override;
  // Writes a checkpoint of the current state to `path` (rank 0 only; atomic). When
  // context.preempted, it holds the position in the epoch too.
  void save(TrainingContext& context, const std::string& path) const;
  // The mid-epoch checkpoint written when the run was preempted, or empty.
  const std::string& preempted_checkpoint() const { return preempted_path_; }

 private:
  void restore_hooks(TrainingContext& context, const nn::CheckpointData& data) const;
  std::optional<nn::CheckpointData> load_newest(bool main_process);
  void check_resumed_position(TrainingContext& context) const;
  void save_preempted(TrainingContext& context);
  void remove_old_checkpoints(TrainingContext& context) const;

  CheckpointSettings settings_;
  nn::LRScheduler* scheduler_;
  // The position a mid-epoch checkpoint was taken at, checked against this run before training.
  int64_t resumed_batch_ = 0, resumed_epoch_batches_ = 0, resumed_world_size_ = 0;
  int64_t resumed_order_ = 0;
  std::string preempted_path_;
};

class LRSchedulerHook final : public Hook {
 public:
  explicit LRSchedulerHook(nn::LRScheduler& scheduler) : scheduler_(scheduler) {}
  std::string name() const override { return "lr_scheduler"; }
  void on(HookStage stage, TrainingContext& context) override;

 private:
  nn::LRScheduler& scheduler_;
};

class GradAccumulationHook final : public Hook {
 public:
  explicit GradAccumulationHook(int64_t steps);
  std::string name() const override { return "grad_accumulation"; }
  void on(HookStage stage, TrainingContext& context) override;
  bool replaces_backward() const override { return true; }
  // (loss / k).backward(), inside DDP's no_sync on every micro-batch but the last.
  void backward(TrainingContext& context) override;

 private:
  int64_t steps_;
};

class GradClipHook final : public Hook {
 public:
  explicit GradClipHook(double max_norm) : max_norm_(max_norm) {}
  std::string name() const override { return "grad_clip"; }
  void on(HookStage stage, TrainingContext& context) override;
  double last_norm() const { return last_norm_; }

 private:
  double max_norm_;
  double last_norm_ = 0;
};

class EMAHook final : public Hook {
 public:
  // Averages `model` after every optimizer step. With `evaluation_copy` (a model of the same
  // architecture, on the same device) validation evaluates the averaged weights, loaded into it.
  EMAHook(const nn::Module& model, double decay = 0.999,
          std::shared_ptr<nn::Module> evaluation_copy = nullptr)
      : ema_(std::make_unique<nn::ModelEMA>(model, decay)),
        evaluation_copy_(std::move(evaluation_copy)) {}
  std::string name() const override { return "ema"; }
  void on(HookStage stage, TrainingContext& context) override;
  nn::ModelEMA& ema() { return *ema_; }
  nn::StateDict state_dict() const override { return ema_->state_dict(); }
  void load_state_dict(const nn::StateDict& state) override { ema_->load_state_dict(state); }
  nn::Module* evaluation_model(TrainingContext& context) override;

 private:
  std::unique_ptr<nn::ModelEMA> ema_;
  std::shared_ptr<nn::Module> evaluation_copy_;
};

// The TensorBoard tag of a metrics.jsonl scalar: test_<name> is "test/<name>", any other
// <name> "train/<name>" (so loss, lr and samples_per_s are train/..., and a new metric of the
// evaluation function appears as test/<metric> with no code of its own).
std::string tensorboard_tag(const std::string& metric);

class LoggingHook final : public Hook {
 public:
  // Logs every `every` optimizer steps; metrics.jsonl goes to out_dir (rank 0). With
  // `tensorboard`, rank 0 also writes every scalar of metrics.jsonl to an event file in
  // out_dir/tb, at the optimizer step it was logged at (evaluations: the step at the end of
  // their epoch), flushed after every epoch and closed at the end.
  LoggingHook(std::string out_dir, int64_t every, bool tensorboard = false);
  ~LoggingHook() override;
  std::string name() const override { return "logging"; }
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
