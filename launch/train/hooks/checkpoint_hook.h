// CheckpointHook: resumes from a checkpoint, at an epoch's end or mid-epoch, and writes them:
// rank 0 writes ckpt-step0.h5 (optional), ckpt-epoch<N>.h5 and last.h5 after each epoch, and
// ckpt-epoch<N>-step<S>.h5 when preempted, atomically, with the state of every hook that has one
// (Hook::state_dict).
//
// A resume is one decision for the whole job: rank 0 chooses the checkpoint (the newest that
// loads, for resume = auto), and every rank then holds that same file, by name and by the CRC-32C
// of its tensors, or the job fails at once on every rank with one error naming the rank that
// could not, its host and the path. No rank starts afresh while another resumes (which would
// leave them waiting for each other in the first all-reduce). Where every rank reads the file
// from, CheckpointScope says.
//
// What a checkpoint holds of a run (save_training_state) and how it is put back
// (restore_training_state) is written here once, for this hook and for embedded models, whose
// host code saves and loads when it chooses (launch/insitu/embedded_model.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mpigrad/core/enum_names.h"
#include "mpigrad/launch/train/hook.h"
#include "mpigrad/nn/checkpoint.h"

namespace mpigrad::launch {

// Where the ranks find the checkpoint rank 0 chose ([train] checkpoint_scope).
enum class CheckpointScope {
  // out_dir is one directory for every rank (a shared filesystem): each rank reads the file.
  Shared,
  // out_dir is rank 0's own (node-local scratch): rank 0 reads the file and sends it to one rank
  // of each other node, which writes it to a temporary file there for the node's ranks to read.
  NodeLocal,
};
inline constexpr core::EnumName<CheckpointScope> kCheckpointScopeNames[] = {
    {CheckpointScope::Shared, "shared"}, {CheckpointScope::NodeLocal, "node_local"}};

struct CheckpointSettings {
  std::string out_dir;
  std::string resume;            // checkpoint to resume from, "auto" (newest_checkpoint), or empty
  bool save_initial = false;     // ckpt-step0.h5 before the first step
  std::string config_text;       // stored in every checkpoint
  int64_t keep_checkpoints = 0;  // the newest N of checkpoint_files stay; older ones go; 0: all
  CheckpointScope scope = CheckpointScope::Shared;
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
  std::optional<nn::CheckpointData> load_newest();
  std::string receive_checkpoint(TrainingContext& context, std::string& readable_path,
                                 std::string& temporary) const;
  void restore_resumed(TrainingContext& context, const nn::CheckpointData& data);
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
