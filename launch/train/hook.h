// What a hook of TrainingStrategy is, and what it sees. A hook adds one behaviour to the training
// loop (DDP, checkpoints, accumulation, loss scaling, clipping, EMA, logging, ...; the built-in
// ones live one per file in launch/train/hooks/), and declares two things about itself:
//   stages()  the stages it acts at; the strategy calls on() at those stages only;
//   place()   where it runs among the other hooks: an order key, the same in every stage, lowest
//             first, plus the hooks it must follow or precede (`after`, `before`).
// TrainingStrategy sorts its hooks by order key, so the order in which they were given means
// nothing. Two hooks with the same key, or a broken `after`/`before`, are an error at
// construction that names both hooks: an order chosen carelessly fails at once, it does not
// run in a surprising order. docs/architecture.md lists the built-in hooks in their order.
//
// A hook may also claim a part of the step that only one hook can own: the optimizer step (fp16
// loss scaling skips overflowed steps) or forward and backward together (a CUDA graph captures
// both); at most one hook may claim each.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "mpigrad/core/enum_names.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/data/batch.h"
#include "mpigrad/data/data_loader.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/nn/module.h"
#include "mpigrad/nn/optim/lr_scheduler.h"
#include "mpigrad/nn/optim/optimizer.h"
#include "mpigrad/nn/state_dict.h"

namespace mpigrad::launch {

class DistributedDataParallel;
class Timeline;
class ZeroRedundancyOptimizer;

// The stages of a run, in the order one optimizer step meets them (TrainingStrategy's header
// shows the whole sequence).
enum class HookStage : uint8_t {
  Setup,
  BeforeTraining,
  BeforeEpoch,
  BeforeBatch,
  BeforeForward,
  AfterLoss,
  BeforeBackward,
  AfterBackward,
  BeforeOptimizerStep,
  AfterOptimizerStep,
  AfterBatch,
  AfterEpoch,
  AfterValidation,
  AfterTraining,
};
inline constexpr core::EnumName<HookStage> kHookStageNames[] = {
    {HookStage::Setup, "setup"},
    {HookStage::BeforeTraining, "before_training"},
    {HookStage::BeforeEpoch, "before_epoch"},
    {HookStage::BeforeBatch, "before_batch"},
    {HookStage::BeforeForward, "before_forward"},
    {HookStage::AfterLoss, "after_loss"},
    {HookStage::BeforeBackward, "before_backward"},
    {HookStage::AfterBackward, "after_backward"},
    {HookStage::BeforeOptimizerStep, "before_optimizer_step"},
    {HookStage::AfterOptimizerStep, "after_optimizer_step"},
    {HookStage::AfterBatch, "after_batch"},
    {HookStage::AfterEpoch, "after_epoch"},
    {HookStage::AfterValidation, "after_validation"},
    {HookStage::AfterTraining, "after_training"}};
constexpr int kHookStageCount = 14;

// A set of stages: HookStages{HookStage::Setup, HookStage::AfterEpoch}, or HookStages::all().
class HookStages {
 public:
  HookStages(std::initializer_list<HookStage> stages) {
    for (HookStage stage : stages) bits_ |= bit(stage);
  }
  static HookStages all() {
    HookStages every{};
    every.bits_ = (1u << kHookStageCount) - 1;
    return every;
  }
  bool contains(HookStage stage) const { return (bits_ & bit(stage)) != 0; }

 private:
  static uint32_t bit(HookStage stage) { return 1u << static_cast<unsigned>(stage); }
  uint32_t bits_ = 0;
};

// Where a hook runs among the others (see the top of this file).
struct HookPlace {
  int order = 0;
  std::vector<std::string> after = {};   // names of hooks that must run before this one
  std::vector<std::string> before = {};  // names of hooks that must run after it
};

class Hook;

// What hooks see and may change.
struct TrainingContext {
  // Null for a run without MPI (an embedded model of one process): then one rank, and hooks
  // that need collectives are not used.
  DistributedManager* manager = nullptr;
  core::Device device = core::kCPU;  // where the model and its batches live
  std::vector<nn::Module*> models;   // models[0] is the one trained
  std::vector<nn::Optimizer*> optimizers;
  nn::LRScheduler* scheduler = nullptr;      // null: none; its state goes into checkpoints
  data::DataLoader* train_loader = nullptr;  // null when batches are handed in one at a time
  data::DataLoader* val_loader = nullptr;
  DistributedDataParallel* ddp = nullptr;  // set by DDPHook
  // Set by DDPHook under [distributed] zero = 1: the optimizer step (the strategy's own, or a
  // hook's that claims it), clipping, loss scaling and checkpoints go through it
  // (launch/ddp/zero_redundancy.h).
  ZeroRedundancyOptimizer* zero = nullptr;
  Timeline* timeline = nullptr;  // set before begin() to record spans; null: none
  std::vector<Hook*> hooks;      // every hook, in the order they run

  int64_t epoch = 0;  // current epoch (0-based); a resuming hook sets it in setup
  int64_t epochs = 1;
  int64_t step = 0;       // optimizer steps taken so far
  int64_t max_steps = 0;  // 0: no limit
  // Micro-batches done in this epoch. A hook resuming mid-epoch sets it in setup, and the first
  // epoch then starts at that batch of the loader.
  int64_t batch_in_epoch = 0;
  int64_t micro_batches = 0;  // micro-batches done overall
  int64_t accumulation_steps = 1;
  bool sync_step = true;  // this micro-batch ends with an optimizer step

  data::Batch* batch = nullptr;
  // The step function's result, on the model's device: what is logged. Hooks leave it alone.
  core::Tensor loss;
  // What backward differentiates: `loss` on entry to BeforeBackward, where hooks may rescale it
  // (accumulation divides it by the micro-batches of a step, loss scaling multiplies it).
  core::Tensor backward_loss;
  // After validation: val_<metric> for each metric of the evaluation function, and val_samples.
  std::map<std::string, double> metrics;
  bool stop = false;  // a hook may end training early
  // Set with `stop` by PreemptionHook (a signal, the time limit): the run ends mid-epoch, to be
  // resumed. The epoch's end (AfterEpoch, validation) is skipped; CheckpointHook saves the
  // position instead (launch/train/preemption.h).
  bool preempted = false;

  // Hooks print no reports (an embedded model inside a host code's output).
  bool quiet = false;

  nn::Module& model() { return *models.at(0); }
  nn::Optimizer& optimizer() { return *optimizers.at(0); }
  int rank() const { return manager != nullptr ? manager->rank() : 0; }
  int world_size() const { return manager != nullptr ? manager->world_size() : 1; }
  bool is_main_process() const { return rank() == 0; }
  // Whether this rank prints the hooks' reports.
  bool reports() const { return !quiet && is_main_process(); }
};

class Hook {
 public:
  explicit Hook(int64_t every = 1) : every_(every < 1 ? 1 : every) {}
  virtual ~Hook() = default;
  // Unique within a strategy: checkpoints keep a hook's state under its name.
  virtual std::string name() const = 0;
  virtual HookStages stages() const = 0;
  virtual HookPlace place() const = 0;
  virtual void on(HookStage stage, TrainingContext& context) = 0;

  // Claims: a hook that returns true here must implement the matching function.
  virtual bool replaces_optimizer_step() const { return false; }
  virtual void optimizer_step(TrainingContext&) {}
  // `compute` runs the step function and backward, and returns the loss, detached. The claiming
  // hook decides how to run it (a CUDA graph replays it). No hook may then act at
  // BeforeBackward or AfterLoss (they would land inside the claimed call): the strategy checks.
  virtual bool replaces_forward_backward() const { return false; }
  virtual core::Tensor forward_backward(TrainingContext&,
                                        const std::function<core::Tensor()>& compute) {
    return compute();
  }

  // For hooks whose state must survive a restart: checkpoints keep every non-empty state_dict
  // under /hooks/<name>/ and give it back through load_state_dict on resume.
  virtual nn::StateDict state_dict() const { return {}; }
  virtual void load_state_dict(const nn::StateDict&) {}

  // The model validation should evaluate instead of the trained one (for example averaged
  // weights), or null. At most one hook may offer one.
  virtual nn::Module* evaluation_model(TrainingContext&) { return nullptr; }

  // Per-batch stages (BeforeBatch to AfterBatch) run when the micro-batch count is a multiple.
  int64_t every() const { return every_; }

 private:
  int64_t every_;
};

}  // namespace mpigrad::launch
