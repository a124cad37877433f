// The training loop, written once, that runs unchanged on one process or on many (the pattern
// of NVIDIA ALCHEMI's TrainingStrategy + hooks). The strategy owns the order of events; hooks
// add behaviour at named stages: DDP, checkpoints, schedules, accumulation, clipping, EMA and
// logging are all hooks (launch/train/training_hooks.h), and a user adds their own the same way.
//
// The strategy knows no field names and no loss: its caller gives it the step function, which
// turns (model, batch) into the loss, and an evaluation function for validation
// (launch/train/training_steps.h has both for classifiers, regressors and SupCon).
//
// One optimizer step:
//   before_batch, before_forward, [step function: forward and loss], after_loss,
//   before_backward, backward, after_backward,
//   [when ctx.sync_step:] before_optimizer_step, step + zero_grad (ctx.zero's sharded step
//   when set), after_optimizer_step,
//   after_batch
// around which run setup, before/after_training, before/after_epoch and after_validation.
// A hook may replace backward or the optimizer step (at most one hook may claim each).
// Per-batch stages honour the hook's `every` (it runs when the micro-batch count is a multiple).
//
// Validation runs after every epoch when a loader is given: each rank evaluates its shard with
// the evaluation function, which gives per-sample values of each metric; the strategy sums each
// over the real samples and all-reduces the sums, counting each sample once even when the
// loader's DistributedSampler (shuffle off, no drop_last) padded the shard with repeats. A hook
// may offer the model to evaluate instead of the trained one (EMAHook: the averaged weights).
// Metrics that need the whole set at once (retrieval over gathered embeddings) come from a hook
// instead: with a loader but no evaluation function, after_validation runs with empty metrics
// for hooks to fill (launch/train/embeddings.h's RetrievalMetricsHook).
//
// With ctx.timeline set (launch/observe/timeline.h) the strategy records the spans "data wait"
// (the loop waiting for the loader's next batch), "forward" (the step function), "backward",
// "optimizer step" and "validation"; DDPHook hands the timeline to DDP for its buckets and
// CheckpointHook records its writes. Null, the default, records nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mpigrad/core/tensor.h"
#include "mpigrad/data/batch.h"
#include "mpigrad/data/data_loader.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/nn/module.h"
#include "mpigrad/nn/optim/optimizer.h"
#include "mpigrad/nn/state_dict.h"

namespace mpigrad::launch {

class DistributedDataParallel;
class Timeline;
class ZeroRedundancyOptimizer;

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
const char* hook_stage_name(HookStage stage);

// The forward half of a training step: the loss of `model` on `batch`, a scalar tensor (for a
// classifier, cross-entropy of model(batch[x]) against batch[y]). Backward and the optimizer
// step are the strategy's.
using StepFunction = std::function<core::Tensor(nn::Module& model, const data::Batch& batch)>;

// Evaluation of one batch: per-sample values of each metric, a tensor of [batch size] elements
// each, with the same names for every batch ({"loss", "accuracy"} for a classifier).
using EvalFunction =
    std::function<std::map<std::string, core::Tensor>(nn::Module& model, const data::Batch& batch)>;

class Hook;

// What hooks see and may change.
struct TrainingContext {
  DistributedManager* manager = nullptr;
  std::vector<nn::Module*> models;  // models[0] is the one trained
  std::vector<nn::Optimizer*> optimizers;
  data::DataLoader* train_loader = nullptr;
  data::DataLoader* val_loader = nullptr;
  DistributedDataParallel* ddp = nullptr;  // set by DDPHook
  // Set by DDPHook under [distributed] zero = 1: the optimizer step (the strategy's own, or a
  // hook's that claims it), clipping, loss scaling and checkpoints go through it
  // (launch/ddp/zero_redundancy.h).
  ZeroRedundancyOptimizer* zero = nullptr;
  Timeline* timeline = nullptr;  // set before run() to record spans; null: none
  std::vector<Hook*> hooks;      // every hook, in call order (CheckpointHook saves
                                 // the state of those that have one)

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
  core::Tensor loss;  // the step function's result, on the model's device
  // After validation: val_<metric> for each metric of the evaluation function, and val_samples.
  std::map<std::string, double> metrics;
  bool stop = false;  // a hook may end training early
  // Set with `stop` by PreemptionHook (a signal, the time limit): the run ends mid-epoch, to be
  // resumed. The epoch's end (AfterEpoch, validation) is skipped; CheckpointHook saves the
  // position instead (launch/train/preemption.h).
  bool preempted = false;

  nn::Module& model() { return *models.at(0); }
  nn::Optimizer& optimizer() { return *optimizers.at(0); }
};

class Hook {
 public:
  explicit Hook(int64_t every = 1) : every_(every < 1 ? 1 : every) {}
  virtual ~Hook() = default;
  virtual std::string name() const = 0;
  virtual void on(HookStage stage, TrainingContext& context) = 0;

  // Claims: a hook that returns true here must implement the matching function.
  virtual bool replaces_backward() const { return false; }
  virtual void backward(TrainingContext&) {}
  virtual bool replaces_optimizer_step() const { return false; }
  virtual void optimizer_step(TrainingContext&) {}

  // For hooks whose state must survive a restart: CheckpointHook saves every non-empty
  // state_dict under /hooks/<name>/ and gives it back through load_state_dict on resume.
  virtual nn::StateDict state_dict() const { return {}; }
  virtual void load_state_dict(const nn::StateDict&) {}

  // The model validation should evaluate instead of the trained one (for example averaged
  // weights), or null. At most one hook may offer one.
  virtual nn::Module* evaluation_model(TrainingContext&) { return nullptr; }

  int64_t every() const { return every_; }

 private:
  int64_t every_;
};

class TrainingStrategy {
 public:
  // Throws core::Error when two hooks claim backward (or the optimizer step), naming both.
  // `evaluate` may be null: no validation, or validation by hooks alone (see above).
  TrainingStrategy(std::vector<nn::Module*> models, std::vector<nn::Optimizer*> optimizers,
                   StepFunction step, EvalFunction evaluate, DistributedManager& manager,
                   std::vector<std::shared_ptr<Hook>> hooks, int64_t epochs, int64_t max_steps = 0);

  // Trains for the configured epochs (or max_steps); val_loader may be null.
  void run(data::DataLoader& train_loader, data::DataLoader* val_loader);

  // Evaluates models[0] (or a hook's evaluation model) on `loader`, every rank its shard, and
  // returns val_<metric> (the mean over the global set, padding repeats counted once) for each
  // metric of the evaluation function, and val_samples.
  std::map<std::string, double> validate(data::DataLoader& loader);

  TrainingContext& context() { return context_; }
  const std::vector<std::shared_ptr<Hook>>& hooks() const { return hooks_; }

 private:
  void call(HookStage stage);
  void train_batch(data::Batch& batch);

  TrainingContext context_;
  StepFunction step_;
  EvalFunction evaluate_;
  std::vector<std::shared_ptr<Hook>> hooks_;
  Hook* backward_owner_ = nullptr;
  Hook* step_owner_ = nullptr;
};

}  // namespace mpigrad::launch
