#include "mpigrad/launch/training_strategy.h"

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/nn/loss.h"

namespace mpigrad::launch {

const char* hook_stage_name(HookStage stage) {
  switch (stage) {
    case HookStage::Setup: return "setup";
    case HookStage::BeforeTraining: return "before_training";
    case HookStage::BeforeEpoch: return "before_epoch";
    case HookStage::BeforeBatch: return "before_batch";
    case HookStage::BeforeForward: return "before_forward";
    case HookStage::AfterForward: return "after_forward";
    case HookStage::BeforeLoss: return "before_loss";
    case HookStage::AfterLoss: return "after_loss";
    case HookStage::BeforeBackward: return "before_backward";
    case HookStage::AfterBackward: return "after_backward";
    case HookStage::BeforeOptimizerStep: return "before_optimizer_step";
    case HookStage::AfterOptimizerStep: return "after_optimizer_step";
    case HookStage::AfterBatch: return "after_batch";
    case HookStage::AfterEpoch: return "after_epoch";
    case HookStage::AfterValidation: return "after_validation";
    case HookStage::AfterTraining: return "after_training";
  }
  return "unknown";
}

namespace {
// Batches arrive on the host; the model lives on the rank's device.
void move_to_device(data::Batch& batch, core::Device device) {
  if (device.is_cpu()) return;
  for (auto& [name, tensor] : batch.fields) tensor = tensor.to(device, /*non_blocking=*/true);
}

bool per_batch(HookStage stage) {
  return stage >= HookStage::BeforeBatch && stage <= HookStage::AfterBatch;
}
}  // namespace

TrainingStrategy::TrainingStrategy(std::vector<nn::Module*> models,
                                   std::vector<nn::Optimizer*> optimizers, LossFunction loss,
                                   DistributedManager& manager,
                                   std::vector<std::shared_ptr<Hook>> hooks, int64_t epochs,
                                   int64_t max_steps)
    : loss_(std::move(loss)), hooks_(std::move(hooks)) {
  MPIGRAD_CHECK(!models.empty() && models[0] != nullptr, "TrainingStrategy: no model given");
  MPIGRAD_CHECK(loss_, "TrainingStrategy: no loss function given");
  MPIGRAD_CHECK(epochs >= 1, "TrainingStrategy: epochs must be at least 1, got ", epochs);
  context_.manager = &manager;
  context_.models = std::move(models);
  context_.optimizers = std::move(optimizers);
  context_.epochs = epochs;
  context_.max_steps = max_steps;
  for (const auto& hook : hooks_) {
    MPIGRAD_CHECK(hook != nullptr, "TrainingStrategy: a null hook was given");
    if (hook->replaces_backward()) {
      MPIGRAD_CHECK(backward_owner_ == nullptr, "TrainingStrategy: hooks '",
                    backward_owner_ ? backward_owner_->name() : "", "' and '", hook->name(),
                    "' both replace backward; at most one hook may");
      backward_owner_ = hook.get();
    }
    if (hook->replaces_optimizer_step()) {
      MPIGRAD_CHECK(step_owner_ == nullptr, "TrainingStrategy: hooks '",
                    step_owner_ ? step_owner_->name() : "", "' and '", hook->name(),
                    "' both replace the optimizer step; at most one hook may");
      step_owner_ = hook.get();
    }
  }
}

void TrainingStrategy::call(HookStage stage) {
  for (const auto& hook : hooks_) {
    if (per_batch(stage) && context_.micro_batches % hook->every() != 0) continue;
    hook->on(stage, context_);
  }
}

void TrainingStrategy::run(data::DataLoader& train_loader, data::DataLoader* val_loader) {
  TrainingContext& ctx = context_;
  ctx.train_loader = &train_loader;
  ctx.val_loader = val_loader;
  call(HookStage::Setup);  // a resuming hook sets ctx.epoch and ctx.step here
  call(HookStage::BeforeTraining);
  bool reached_max = ctx.max_steps > 0 && ctx.step >= ctx.max_steps;
  for (int64_t epoch = ctx.epoch; epoch < ctx.epochs && !ctx.stop && !reached_max; ++epoch) {
    ctx.epoch = epoch;
    ctx.batch_in_epoch = 0;
    train_loader.set_epoch(epoch);
    call(HookStage::BeforeEpoch);
    ctx.model().train();
    int64_t batches = train_loader.size();
    for (data::Batch& batch : train_loader) {
      // The last micro-batch of an epoch always steps, so no gradient crosses epochs.
      ctx.sync_step = (ctx.batch_in_epoch + 1) % ctx.accumulation_steps == 0 ||
                      ctx.batch_in_epoch + 1 == batches;
      train_batch(batch);
      ++ctx.batch_in_epoch;
      ++ctx.micro_batches;
      reached_max = ctx.max_steps > 0 && ctx.step >= ctx.max_steps;
      if (ctx.stop || reached_max) break;
    }
    call(HookStage::AfterEpoch);
    if (val_loader != nullptr) {
      ctx.metrics = validate(*val_loader);
      call(HookStage::AfterValidation);
    }
  }
  call(HookStage::AfterTraining);
}

void TrainingStrategy::train_batch(data::Batch& batch) {
  TrainingContext& ctx = context_;
  ctx.batch = &batch;
  move_to_device(batch, ctx.manager->device());
  call(HookStage::BeforeBatch);
  call(HookStage::BeforeForward);
  ctx.output = ctx.model()(batch["x"]);
  call(HookStage::AfterForward);
  call(HookStage::BeforeLoss);
  ctx.loss = loss_(ctx.output, batch);
  call(HookStage::AfterLoss);
  call(HookStage::BeforeBackward);
  if (backward_owner_ != nullptr) {
    backward_owner_->backward(ctx);
  } else {
    ctx.loss.backward();
  }
  call(HookStage::AfterBackward);
  if (ctx.sync_step) {
    call(HookStage::BeforeOptimizerStep);
    if (step_owner_ != nullptr) {
      step_owner_->optimizer_step(ctx);
    } else {
      for (nn::Optimizer* optimizer : ctx.optimizers) {
        optimizer->step();
        optimizer->zero_grad();
      }
    }
    ++ctx.step;
    call(HookStage::AfterOptimizerStep);
  }
  call(HookStage::AfterBatch);
  ctx.batch = nullptr;
}

std::map<std::string, double> TrainingStrategy::validate(data::DataLoader& loader) {
  TrainingContext& ctx = context_;
  nn::Module& model = ctx.model();
  bool was_training = model.is_training();
  model.eval();
  core::NoGradGuard no_grad;
  // A DistributedSampler without drop_last pads rank r's shard with repeats: its k-th sample
  // sits at position r + k * R of the padded order, and only positions below N are real.
  const int64_t ranks = ctx.manager->world_size(), rank = ctx.manager->rank();
  const int64_t dataset_size = loader.dataset().size();
  int64_t seen = 0;
  double loss_sum = 0, correct = 0, counted = 0;
  loader.set_epoch(0);
  for (data::Batch& batch : loader) {
    move_to_device(batch, ctx.manager->device());
    core::Tensor output = model(batch["x"]);
    core::Tensor labels = batch["y"].to(core::kInt64);
    std::vector<int64_t> predicted = core::argmax(output, 1).to_vector<int64_t>();
    std::vector<int64_t> truth = labels.to_vector<int64_t>();
    // Per-sample cross-entropy, so padded repeats can be left out one by one.
    nn::CrossEntropyOptions per_sample;
    per_sample.reduction = nn::Reduction::None;
    std::vector<double> losses = nn::cross_entropy(output, labels, per_sample).to_vector<double>();
    for (size_t i = 0; i < truth.size(); ++i, ++seen) {
      bool real = ranks == 1 || rank + seen * ranks < dataset_size;
      if (!real) continue;
      counted += 1;
      loss_sum += losses[i];
      correct += predicted[i] == truth[i] ? 1 : 0;
    }
  }
  core::Tensor totals = core::Tensor::from_vector<double>({loss_sum, correct, counted}, {3});
  ctx.manager->world().all_reduce(totals, ReduceOp::Sum);
  std::vector<double> global = totals.to_vector<double>();
  model.train(was_training);
  double samples = global[2];
  return {{"val_loss", samples > 0 ? global[0] / samples : 0.0},
          {"val_accuracy", samples > 0 ? global[1] / samples : 0.0},
          {"val_samples", samples}};
}

}  // namespace mpigrad::launch
