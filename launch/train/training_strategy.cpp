#include "mpigrad/launch/train/training_strategy.h"

#include <algorithm>
#include <optional>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/device_checks.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/profiler.h"
#include "mpigrad/launch/ddp/zero_redundancy.h"
#include "mpigrad/launch/observe/timeline.h"

namespace mpigrad::launch {

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

// The hook named `name` among `hooks`, or null.
const Hook* find_hook(const std::vector<std::shared_ptr<Hook>>& hooks, const std::string& name) {
  for (const auto& hook : hooks) {
    if (hook->name() == name) return hook.get();
  }
  return nullptr;
}

// Records which hook claims a part of the step; a second claim is an error naming both.
void claim(Hook*& owner, Hook* hook, const char* what) {
  MPIGRAD_CHECK(owner == nullptr, "TrainingStrategy: hooks '", owner ? owner->name() : "",
                "' and '", hook->name(), "' both replace ", what, "; at most one hook may");
  owner = hook;
}
}  // namespace

TrainingStrategy::TrainingStrategy(std::vector<nn::Module*> models,
                                   std::vector<nn::Optimizer*> optimizers, StepFunction step,
                                   EvalFunction evaluate, DistributedManager& manager,
                                   std::vector<std::shared_ptr<Hook>> hooks, int64_t epochs,
                                   int64_t max_steps)
    : TrainingStrategy(std::move(models), std::move(optimizers), std::move(step),
                       std::move(evaluate), &manager, manager.device(), std::move(hooks), epochs,
                       max_steps) {}

TrainingStrategy::TrainingStrategy(std::vector<nn::Module*> models,
                                   std::vector<nn::Optimizer*> optimizers, StepFunction step,
                                   EvalFunction evaluate, DistributedManager* manager,
                                   core::Device device, std::vector<std::shared_ptr<Hook>> hooks,
                                   int64_t epochs, int64_t max_steps)
    : step_(std::move(step)), evaluate_(std::move(evaluate)), hooks_(std::move(hooks)) {
  MPIGRAD_CHECK(!models.empty() && models[0] != nullptr, "TrainingStrategy: no model given");
  MPIGRAD_CHECK(step_, "TrainingStrategy: no step function given");
  MPIGRAD_CHECK(epochs >= 1, "TrainingStrategy: epochs must be at least 1, got ", epochs);
  context_.manager = manager;
  context_.device = device;
  context_.models = std::move(models);
  context_.optimizers = std::move(optimizers);
  context_.epochs = epochs;
  context_.max_steps = max_steps;
  order_hooks();
}

void TrainingStrategy::order_hooks() {
  for (const auto& hook : hooks_) {
    MPIGRAD_CHECK(hook != nullptr, "TrainingStrategy: a null hook was given");
  }
  // Sorted once by the order each declares; the order they were given in means nothing.
  std::vector<std::pair<HookPlace, std::shared_ptr<Hook>>> placed;
  for (const auto& hook : hooks_) placed.emplace_back(hook->place(), hook);
  std::stable_sort(placed.begin(), placed.end(),
                   [](const auto& a, const auto& b) { return a.first.order < b.first.order; });
  hooks_.clear();
  for (size_t i = 0; i < placed.size(); ++i) {
    const Hook& hook = *placed[i].second;
    for (size_t j = 0; j < i; ++j) {
      const Hook& earlier = *placed[j].second;
      MPIGRAD_CHECK(earlier.name() != hook.name(), "TrainingStrategy: two hooks are named '",
                    hook.name(), "'; names must be unique (checkpoints keep state by name)");
    }
    if (i > 0) {
      const Hook& previous = *placed[i - 1].second;
      MPIGRAD_CHECK(placed[i - 1].first.order != placed[i].first.order, "TrainingStrategy: hooks '",
                    previous.name(), "' and '", hook.name(), "' both claim order ",
                    placed[i].first.order, "; give each hook a place of its own");
    }
    hooks_.push_back(placed[i].second);
  }
  for (const auto& [place, hook] : placed) {
    for (const std::string& name : place.after) {
      const Hook* other = find_hook(hooks_, name);
      MPIGRAD_CHECK(other == nullptr || other->place().order < place.order,
                    "TrainingStrategy: hook '", hook->name(), "' (order ", place.order,
                    ") must run after '", name, "' (order ", other ? other->place().order : 0, ")");
    }
    for (const std::string& name : place.before) {
      const Hook* other = find_hook(hooks_, name);
      MPIGRAD_CHECK(other == nullptr || other->place().order > place.order,
                    "TrainingStrategy: hook '", hook->name(), "' (order ", place.order,
                    ") must run before '", name, "' (order ", other ? other->place().order : 0,
                    ")");
    }
  }
  for (const auto& hook : hooks_) {
    context_.hooks.push_back(hook.get());
    const HookStages stages = hook->stages();
    for (int stage = 0; stage < kHookStageCount; ++stage) {
      if (stages.contains(HookStage(stage))) hooks_by_stage_[size_t(stage)].push_back(hook.get());
    }
    if (hook->replaces_optimizer_step()) claim(step_owner_, hook.get(), "the optimizer step");
    if (hook->replaces_forward_backward()) {
      claim(forward_backward_owner_, hook.get(), "forward and backward");
    }
  }
  if (forward_backward_owner_ != nullptr) {
    for (HookStage stage : {HookStage::AfterLoss, HookStage::BeforeBackward}) {
      for (Hook* hook : hooks_by_stage_[size_t(stage)]) {
        core::fail("TrainingStrategy: hook '", forward_backward_owner_->name(),
                   "' runs forward and backward as one, so hook '", hook->name(),
                   "' cannot act at ", core::enum_name(stage, kHookStageNames),
                   " (it would land inside that call)");
      }
    }
  }
}

void TrainingStrategy::call(HookStage stage) {
  for (Hook* hook : hooks_by_stage_[size_t(stage)]) {
    if (per_batch(stage) && context_.micro_batches % hook->every() != 0) continue;
    hook->on(stage, context_);
  }
}

void TrainingStrategy::begin(data::DataLoader* train_loader, data::DataLoader* val_loader) {
  context_.train_loader = train_loader;
  context_.val_loader = val_loader;
  call(HookStage::Setup);  // a resuming hook sets ctx.epoch and ctx.step here
  call(HookStage::BeforeTraining);
  micro_batches_since_step_ = 0;
}

void TrainingStrategy::end() {
  call(HookStage::AfterTraining);
}

void TrainingStrategy::train_batch(data::Batch& batch) {
  context_.model().train();
  train_micro_batch(batch, micro_batches_since_step_ + 1 >= context_.accumulation_steps);
  ++context_.batch_in_epoch;
}

void TrainingStrategy::run(data::DataLoader& train_loader, data::DataLoader* val_loader) {
  TrainingContext& ctx = context_;
  begin(&train_loader, val_loader);
  bool reached_max = ctx.max_steps > 0 && ctx.step >= ctx.max_steps;
  const int64_t first_epoch = ctx.epoch, resumed_batch = ctx.batch_in_epoch;
  for (int64_t epoch = ctx.epoch; epoch < ctx.epochs && !ctx.stop && !reached_max; ++epoch) {
    ctx.epoch = epoch;
    ctx.batch_in_epoch = epoch == first_epoch ? resumed_batch : 0;
    // A run stops (and resumes) only after an optimizer step, so an epoch starts on one.
    micro_batches_since_step_ = 0;
    train_loader.set_epoch(epoch);
    // The order of an epoch depends on its seed and number alone, so skipping the batches done
    // before a mid-epoch stop gives the resumed run the very batches the stopped one had next.
    if (ctx.batch_in_epoch > 0) train_loader.set_epoch_step(ctx.batch_in_epoch);
    call(HookStage::BeforeEpoch);
    ctx.model().train();
    const int64_t batches = train_loader.size();
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
      const bool last_of_epoch = ctx.batch_in_epoch + 1 == batches;
      train_micro_batch(*batch,
                        micro_batches_since_step_ + 1 >= ctx.accumulation_steps || last_of_epoch);
      ++ctx.batch_in_epoch;
      reached_max = ctx.max_steps > 0 && ctx.step >= ctx.max_steps;
      if (ctx.stop || reached_max) break;
    }
    // A bad label found on the GPU surfaces at the next synchronization; make that no later
    // than the end of the epoch, before its checkpoint.
    core::check_device_errors(ctx.device);
    // Preempted: the epoch ends, with its checkpoint and validation, in the resumed run.
    if (ctx.preempted) break;
    call(HookStage::AfterEpoch);
    if (val_loader != nullptr) {
      {
        core::ProfilePause not_profiled;  // the per-op profile covers the training steps
        Span validation(ctx.timeline, "validation");
        // Without an evaluation function the metrics come from hooks (RetrievalMetricsHook).
        ctx.metrics = evaluate_ ? validate(*val_loader) : std::map<std::string, double>{};
      }
      call(HookStage::AfterValidation);
    }
  }
  end();
}

void TrainingStrategy::train_micro_batch(data::Batch& batch, bool ends_step) {
  TrainingContext& ctx = context_;
  ctx.batch = &batch;
  ctx.sync_step = ends_step;
  move_to_device(batch, ctx.device);
  call(HookStage::BeforeBatch);
  call(HookStage::BeforeForward);
  const auto forward = [&] {
    Span forward_span(ctx.timeline, "forward");
    core::Tensor loss = step_(ctx.model(), batch);
    MPIGRAD_CHECK(loss.defined() && loss.numel() == 1,
                  "TrainingStrategy: the step function must return the loss as one number, got ",
                  loss.defined() ? loss.shape() : core::Shape{}, " at step ", ctx.step);
    return loss;
  };
  if (forward_backward_owner_ != nullptr) {
    ctx.loss = forward_backward_owner_->forward_backward(ctx, [&] {
      core::Tensor loss = forward();
      ctx.backward_loss = loss;
      backward();
      return loss.detach();
    });
    call(HookStage::AfterBackward);
  } else {
    ctx.loss = forward();
    call(HookStage::AfterLoss);
    ctx.backward_loss = ctx.loss;
    call(HookStage::BeforeBackward);
    backward();
    call(HookStage::AfterBackward);
  }
  ctx.backward_loss = core::Tensor();
  ++micro_batches_since_step_;
  if (ctx.sync_step) optimizer_step();
  call(HookStage::AfterBatch);
  ++ctx.micro_batches;
  ctx.batch = nullptr;
}

void TrainingStrategy::backward() {
  Span backward_span(context_.timeline, "backward");
  context_.backward_loss.backward();
}

void TrainingStrategy::optimizer_step() {
  TrainingContext& ctx = context_;
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
  micro_batches_since_step_ = 0;
  ++ctx.step;
  call(HookStage::AfterOptimizerStep);
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
  const int64_t ranks = ctx.world_size(), rank = ctx.rank();
  const int64_t dataset_size = loader.dataset().size();
  int64_t seen = 0, counted = 0;
  // Sums stay on the model's device until the end: no host synchronization per batch.
  std::map<std::string, core::Tensor> sums;
  loader.set_epoch(0);
  for (data::Batch& batch : loader) {
    move_to_device(batch, ctx.device);
    const int64_t n = batch.size();
    std::vector<double> real(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      bool is_real = ranks == 1 || rank + (seen + i) * ranks < dataset_size;
      real[size_t(i)] = is_real ? 1.0 : 0.0;
      counted += is_real ? 1 : 0;
    }
    seen += n;
    core::Tensor mask = core::Tensor::from_vector<double>(real, {n}).to(ctx.device);
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
  if (ranks > 1) ctx.manager->world().all_reduce(totals, ReduceOp::Sum);
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
