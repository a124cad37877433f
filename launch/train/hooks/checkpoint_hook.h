// CheckpointHook: resumes from a checkpoint, at an epoch's end or mid-epoch, and writes them:
// rank 0 writes ckpt-step0.h5 (optional), ckpt-epoch<N>.h5 and last.h5 after each epoch, and
// ckpt-epoch<N>-step<S>.h5 when preempted, atomically, with the state of every hook that has one
// (Hook::state_dict).
//
// What a checkpoint holds of a run (save_training_state) and how it is put back
// (restore_training_state) is written here once, for this hook and for embedded models, whose
// host code saves and loads when it chooses (launch/insitu/embedded_model.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mpigrad/launch/train/hook.h"
#include "mpigrad/nn/checkpoint.h"

namespace mpigrad::launch {

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

// Everything a restart needs of the run in `context`: the weights, the optimizer state (ZeRO-1's
// shards gathered into the plain layout), the scheduler, every hook's state, the generators and
// the position. Collective (every rank must call it, for ZeRO-1's gather); the data on rank 0,
// nullopt elsewhere.
std::optional<nn::CheckpointData> gather_training_state(TrainingContext& context,
                                                        const std::string& config_text);
// Puts `data` (read from `path`) back into the run: the weights, optimizer (and its ZeRO-1
// shard), scheduler and generators, every hook's state and the step and position. A hook whose
// state the file lacks starts afresh, and rank 0 says so; a hook state that does not fit is a
// core::Error starting with `what` (for example "[train] resume: ").
void restore_training_state(TrainingContext& context, const nn::CheckpointData& data,
                            const std::string& path, const std::string& what = "");

class CheckpointHook final : public Hook {
 public:
  static constexpr int kOrder = 100;
  explicit CheckpointHook(CheckpointSettings settings);
  std::string name() const override { return "checkpoint"; }
  HookStages stages() const override {
    return {HookStage::Setup, HookStage::BeforeTraining, HookStage::AfterEpoch,
            HookStage::AfterTraining};
  }
  // First at setup: the other hooks see the resumed position and state.
  HookPlace place() const override { return {kOrder}; }
  void on(HookStage stage, TrainingContext& context) override;
  // Writes a checkpoint of the current state to `path` (rank 0 only; atomic). When
  // context.preempted, it holds the position in the epoch too.
  void save(TrainingContext& context, const std::string& path) const;
  // The mid-epoch checkpoint written when the run was preempted, or empty.
  const std::string& preempted_checkpoint() const { return preempted_path_; }

 private:
  void resume(TrainingContext& context);
  std::optional<nn::CheckpointData> load_newest(bool main_process);
  void check_resumed_position(TrainingContext& context) const;
  void save_preempted(TrainingContext& context);
  void remove_old_checkpoints(TrainingContext& context) const;

  CheckpointSettings settings_;
  // The position a mid-epoch checkpoint was taken at, checked against this run before training.
  int64_t resumed_batch_ = 0, resumed_epoch_batches_ = 0, resumed_world_size_ = 0;
  int64_t resumed_order_ = 0;
  std::string preempted_path_;
};

}  // namespace mpigrad::launch
