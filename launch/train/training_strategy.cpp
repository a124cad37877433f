#include "mpigrad/launch/train/training_strategy.h"

#include <optional>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/device_checks.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/launch/ddp/zero_redundancy.h"
#include "mpigrad/launch/observe/timeline.h"

namespace mpigrad::launch {

const char* hook_stage_name(HookStage stage) {
  switch (stage) {
    case HookStage::Setup:
      return "setup";
    case HookStage::BeforeTraining:
      return "before_training";
    case HookStage::BeforeEpoch:
      return "before_epoch";
    case HookStage::BeforeBatch:
      return "before_batch";
    case HookStage::BeforeForward:
      return "before_forward";
    case HookStage::AfterLoss:
      return "after_loss";
    case HookStage::BeforeBackward:
      return "before_backward";
    case HookStage::AfterBackward:
      return "after_backward";
    case HookStage::BeforeOptimizerStep:
      return "before_optimizer_step";
    case HookStage::AfterOptimizerStep:
      return "after_optimizer_step";
    case HookStage::AfterBatch:
      return "after_batch";
    case HookStage::AfterEpoch:
      return "after_epoch";
    case HookStage::AfterValidation:
      return "after_validation";
    case HookStage::AfterTraining:
      return "after_training";
  }
  return "unknown";
}

namespace {
// Batches come from the loader on the rank's device (DataLoaderOptions::device), or on the
// host from a loader without one; only the latter are moved here.
void move_to_device(data::Batch& batch, core::Device device) {
  if (device.is_cpu()) return;
  for (auto& [name, tensor] : batch.fields) {
    if (tensor.device() != device) tensor = tensor.to(device, /*non_blocking=*/true);
  }
}

bool per_batch(HookStage stage) {
  return stage >= HookStage::BeforeBatch && stage <= HookStage::AfterBatch;
}
}  // namespace

TrainingStrategy::TrainingStrategy(std::vector<nn::Module*> models,
                                   std::vector<nn::Optimizer*> optimizers, StepFunction step,
                                   EvalFunction evaluate, DistributedManager& manager,
                                   std::vector<std::shared_ptr<Hook>> hooks, int64_t epochs,
                                   int64_t max_steps)
    : step_(std::move(step)), evaluate_(std::move(evaluate)), hooks_(std::move(hooks)) {
  MPIGRAD_CHECK(!models.empty() && models[0] != nullptr, "TrainingStrategy: no model given");
  MPIGRAD_CHECK(step_, "TrainingStrategy: no step function given");
  MPIGRAD_CHECK(epochs >= 1, "TrainingStrategy: epochs must be at least 1, got ", epochs);
  context_.manager = &manager;
  context_.models = std::move(models);
  context_.optimizers = std::move(optimizers);
  context_.epochs = epochs;
  context_.max_steps = max_steps;
  for (const auto& hook : hooks_) {
    MPIGRAD_CHECK(hook != nullptr, "TrainingStrategy: a null hook was given");
    context_.hooks.push_back(hook.get());
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
  const int64_t first_epoch = ctx.epoch, resumed_batch = ctx.batch_in_epoch;
  for (int64_t epoch = ctx.epoch; epoch < ctx.epochs && !ctx.stop && !reached_max; ++epoch) {
    ctx.epoch = epoch;
    ctx.batch_in_epoch = epoch == first_epoch ? resumed_batch : 0;
    train_loader.set_epoch(epoch);
    // The order of an epoch depends on its seed and number alone, so skipping the batches done
    // before a mid-epoch stop gives the resumed run the very batches the stopped one had next.
    if (ctx.batch_in_epoch > 0) train_loader.set_epoch_step(ctx.batch_in_epoch);
    call(HookStage::BeforeEpoch);
    ctx.model().train();
    int64_t batches = train_loader.size();
    train_loader.start();
    while (true) {
      // The previous batch is gone before the next is asked for: its buffers go back to the
      // loader's pool.
      std::optional<data::Batch> batch;
      {
        Span wait(ctx.timeline, "data wait");
        batch = train_loader.next();
      }
      if (!batch) break;
      // The last micro-batch of an epoch always steps, so no gradient crosses epochs.
      ctx.sync_step = (ctx.batch_in_epoch + 1) % ctx.accumulation_steps == 0 ||
                      ctx.batch_in_epoch + 1 == batches;
      train_batch(*batch);
      ++ctx.batch_in_epoch;
      ++ctx.micro_batches;
      reached_max = ctx.max_steps > 0 && ctx.step >= ctx.max_steps;
      if (ctx.stop || reached_max) break;
    }
    // A bad label found on the GPU surfaces at the next synchronization; make that no later
    // than the end of the epoch, before its checkpoint.
    core::check_device_errors(ctx.manager->device());
    // Preempted: the epoch ends, with its checkpoint and validation, in the resumed run.
    if (ctx.preempted) break;
    call(HookStage::AfterEpoch);
    if (val_loader != nullptr) {
      {
        Span validation(ctx.timeline, "validation");
        // Without an evaluation function the metrics come from hooks (RetrievalMetricsHook).
        ctx.metrics = evaluate_ ? validate(*val_loader) : std::map<std::string, double>{};
      }
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
  {
    Span forward(ctx.timeline, "forward");
    ctx.loss = step_(ctx.model(), batch);
  }
  MPIGRAD_CHECK(ctx.loss.defined() && ctx.loss.numel() == 1,
                "TrainingStrategy: the step "
                "function must return the loss as one number, got ",
                ctx.loss.defined() ? ctx.loss.shape() : core::Shape{}, " at step ", ctx.step);
  call(HookStage::AfterLoss);
  call(HookStage::BeforeBackward);
  {
    Span backward(ctx.timeline, "backward");
    if (backward_owner_ != nullptr) {
      backward_owner_->backward(ctx);
    } else {
      ctx.loss.backward();
    }
  }
  call(HookStage::AfterBackward);
  if (ctx.sync_step) {
    call(HookStage::BeforeOptimizerStep);
    {
      Span step(ctx.timeline, "optimizer step");
      if (step_owner_ != nullptr) {
        step_owner_->optimizer_step(ctx);
      } else if (ctx.zero != nullptr) {
        ctx.zero->step();  // ZeRO-1's sharded step, which also resets the gradients
      } else {
        for (nn::Optimizer* optimizer : ctx.optimizers) {
          optimizer->step();
          optimizer->zero_grad();
        }
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
  MPIGRAD_CHECK(evaluate_, "TrainingStrategy::validate: no evaluation function was given");
  nn::Module* model = &ctx.model();
  Hook* offered_by = nullptr;
  for (Hook* hook : ctx.hooks) {
    nn::Module* offered = hook->evaluation_model(ctx);
    if (offered == nullptr) continue;
    MPIGRAD_CHECK(offered_by == nullptr, "TrainingStrategy: hooks '", offered_by->name(), "' and '",
                  hook->name(), "' both offer the model to evaluate; at most one may");
    offered_by = hook;
    model = offered;
  }
  bool was_training = model->is_training();
  model->eval();
  core::NoGradGuard no_grad;
  // A DistributedSampler without drop_last pads rank r's shard with repeats: its k-th sample
  // sits at position r + k * R of the padded order, and only positions below N are real.
  const int64_t ranks = ctx.manager->world_size(), rank = ctx.manager->rank();
  const int64_t dataset_size = loader.dataset().size();
  int64_t seen = 0, counted = 0;
  // Sums stay on the model's device until the end: no host synchronization per batch.
  std::map<std::string, core::Tensor> sums;
  loader.set_epoch(0);
  for (data::Batch& batch : loader) {
    move_to_device(batch, ctx.manager->device());
    const int64_t n = batch.size();
    std::vector<double> real(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      bool is_real = ranks == 1 || rank + (seen + i) * ranks < dataset_size;
      real[size_t(i)] = is_real ? 1.0 : 0.0;
      counted += is_real ? 1 : 0;
    }
    seen += n;
    core::Tensor mask = core::Tensor::from_vector<double>(real, {n}).to(ctx.manager->device());
    for (auto& [name, values] : evaluate_(*model, batch)) {
      MPIGRAD_CHECK(values.numel() == n, "TrainingStrategy::validate: metric '", name, "' has ",
                    values.numel(), " values for a batch of ", n, "; expected one per sample");
      core::Tensor total = core::sum(values.reshape({n}).to(core::kFloat64) * mask);
      auto found = sums.find(name);
      if (found == sums.end()) {
        sums.emplace(name, total);
      } else {
        found->second = found->second + total;
      }
    }
  }
  // Every rank has at least one batch (the sampler gives each rank a sample), so every rank
  // holds the same names, in the same (sorted) order.
  std::vector<double> local;
  for (const auto& [name, total] : sums) local.push_back(total.item<double>());
  local.push_back(double(counted));
  core::Tensor totals = core::Tensor::from_vector<double>(local, {int64_t(local.size())});
  ctx.manager->world().all_reduce(totals, ReduceOp::Sum);
  std::vector<double> global = totals.to_vector<double>();
  model->train(was_training);
  const double samples = global.back();
  std::map<std::string, double> metrics;
  size_t i = 0;
  for (const auto& entry : sums) {
    metrics["val_" + entry.first] = samples > 0 ? global[i++] / samples : 0.0;
  }
  metrics["val_samples"] = samples;
  return metrics;
}

}  // namespace mpigrad::launch
