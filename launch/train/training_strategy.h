// The training loop, written once, that runs unchanged on one process or on many, for every entry
// point: `mpigrad train` and `lr-find` drive it epoch by epoch with run(), and an embedded model
// (the C API, the Fortran module) drives it one batch at a time with begin(), train_batch() and
// end(). The pattern is NVIDIA ALCHEMI's TrainingStrategy + hooks: the strategy owns the order of
// events; hooks (launch/train/hook.h, the built-in ones in launch/train/hooks/) add behaviour at
// named stages. DDP, checkpoints, schedules, accumulation, loss scaling, clipping, EMA and
// logging are all hooks, and a user adds their own the same way.
//
// The strategy knows no field names and no loss: its caller gives it the step function, which
// turns (model, batch) into the loss, and an evaluation function for validation
// (launch/train/training_steps.h has both for classifiers, regressors and SupCon).
//
// One micro-batch (train_batch):
//   before_batch, before_forward, [step function: forward and loss], after_loss,
//   before_backward, [backward of context.backward_loss], after_backward,
//   [when it ends an optimizer step:] before_optimizer_step, step + zero_grad (ZeRO-1's sharded
//   step when context.zero is set), after_optimizer_step,
//   after_batch
// around which run setup, before/after_training, before/after_epoch and after_validation. The
// optimizer steps every context.accumulation_steps micro-batches, and at the last micro-batch of
// an epoch, so no gradient crosses epochs. Per-batch stages honour the hook's `every` (it runs
// when the micro-batch count is a multiple).
//
// Validation runs after every epoch when a loader is given: each rank evaluates its shard with
// the evaluation function, which gives per-sample values of each metric; the strategy sums each
// over the real samples and all-reduces the sums, counting each sample once even when the
// loader's DistributedSampler (shuffle off, no drop_last) padded the shard with repeats. A hook
// may offer the model to evaluate instead of the trained one (EMAHook: the averaged weights).
// Metrics that need the whole set at once (retrieval over gathered embeddings) come from a hook
// instead: with a loader but no evaluation function, after_validation runs with empty metrics
// for hooks to fill (RetrievalMetricsHook).
//
// With context().timeline set (launch/observe/timeline.h) the strategy records the spans "data
// wait" (the loop waiting for the loader's next batch), "forward" (the step function),
// "backward", "optimizer step" and "validation"; DDPHook hands the timeline to DDP for its
// buckets and CheckpointHook records its writes. Null, the default, records nothing.
#pragma once

#include <array>
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
#include "mpigrad/launch/train/hook.h"
#include "mpigrad/nn/module.h"
#include "mpigrad/nn/optim/optimizer.h"

namespace mpigrad::launch {

// The forward half of a training step: the loss of `model` on `batch`, a scalar tensor (for a
// classifier, cross-entropy of model(batch[x]) against batch[y]). Backward and the optimizer
// step are the strategy's.
using StepFunction = std::function<core::Tensor(nn::Module& model, const data::Batch& batch)>;

// Evaluation of one batch: per-sample values of each metric, a tensor of [batch size] elements
// each, with the same names for every batch ({"loss", "accuracy"} for a classifier).
using EvalFunction =
    std::function<std::map<std::string, core::Tensor>(nn::Module& model, const data::Batch& batch)>;

class TrainingStrategy {
 public:
  // Sorts the hooks by their place and throws core::Error, naming both hooks, when two share a
  // name or an order key, when an `after`/`before` of a place is broken, or when two claim the
  // optimizer step (or forward and backward). `evaluate` may be null: no validation, or
  // validation by hooks alone (see above).
  TrainingStrategy(std::vector<nn::Module*> models, std::vector<nn::Optimizer*> optimizers,
                   StepFunction step, EvalFunction evaluate, DistributedManager& manager,
                   std::vector<std::shared_ptr<Hook>> hooks, int64_t epochs, int64_t max_steps = 0);
  // The same with the device given; `manager` may be null (one process without MPI).
  TrainingStrategy(std::vector<nn::Module*> models, std::vector<nn::Optimizer*> optimizers,
                   StepFunction step, EvalFunction evaluate, DistributedManager* manager,
                   core::Device device, std::vector<std::shared_ptr<Hook>> hooks, int64_t epochs,
                   int64_t max_steps = 0);

  // Trains for the configured epochs (or max_steps); val_loader may be null.
  void run(data::DataLoader& train_loader, data::DataLoader* val_loader);

  // One batch at a time: begin() runs setup and before_training; each train_batch() takes one
  // micro-batch through every per-batch stage (the optimizer steps every accumulation_steps of
  // them); end() runs after_training. run() is these three around a loop over epochs.
  void begin(data::DataLoader* train_loader = nullptr, data::DataLoader* val_loader = nullptr);
  void train_batch(data::Batch& batch);
  void end();

  // Evaluates models[0] (or a hook's evaluation model) on `loader`, every rank its shard, and
  // returns val_<metric> (the mean over the global set, padding repeats counted once) for each
  // metric of the evaluation function, and val_samples.
  std::map<std::string, double> validate(data::DataLoader& loader);

  TrainingContext& context() { return context_; }
  const TrainingContext& context() const { return context_; }
  // In the order they run.
  const std::vector<std::shared_ptr<Hook>>& hooks() const { return hooks_; }

 private:
  void order_hooks();
  void call(HookStage stage);
  // One micro-batch; `ends_step`: the optimizer steps after it.
  void train_micro_batch(data::Batch& batch, bool ends_step);
  void backward();
  void optimizer_step();

  TrainingContext context_;
  StepFunction step_;
  EvalFunction evaluate_;
  std::vector<std::shared_ptr<Hook>> hooks_;
  std::array<std::vector<Hook*>, kHookStageCount> hooks_by_stage_;
  Hook* step_owner_ = nullptr;
  Hook* forward_backward_owner_ = nullptr;
  int64_t micro_batches_since_step_ = 0;
};

}  // namespace mpigrad::launch
