#include "mpigrad/launch/config/run.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>

#include "mpigrad/core/atomic_file.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/threads.h"
#include "mpigrad/data/augment.h"
#include "mpigrad/data/training_data.h"
#include "mpigrad/data/transforms.h"
#include "mpigrad/launch/ddp/sync_batch_norm.h"
#include "mpigrad/launch/observe/op_profile.h"
#include "mpigrad/launch/observe/timeline.h"
#include "mpigrad/launch/train/atomistic_steps.h"
#include "mpigrad/launch/train/hooks/checkpoint_hook.h"
#include "mpigrad/launch/train/hooks/cuda_graph_hook.h"
#include "mpigrad/launch/train/hooks/ddp_hook.h"
#include "mpigrad/launch/train/hooks/derived_metrics_hook.h"
#include "mpigrad/launch/train/hooks/ema_hook.h"
#include "mpigrad/launch/train/hooks/grad_accumulation_hook.h"
#include "mpigrad/launch/train/hooks/grad_clip_hook.h"
#include "mpigrad/launch/train/hooks/logging_hook.h"
#include "mpigrad/launch/train/hooks/loss_scaling_hook.h"
#include "mpigrad/launch/train/hooks/lr_scheduler_hook.h"
#include "mpigrad/launch/train/hooks/preemption_hook.h"
#include "mpigrad/launch/train/hooks/retrieval_metrics_hook.h"
#include "mpigrad/launch/train/hooks/swa_hook.h"
#include "mpigrad/launch/train/swa.h"
#include "mpigrad/launch/train/training_steps.h"
#include "mpigrad/nn/checkpoint.h"

namespace mpigrad::launch {

Run::Run(TrainConfig config, RunInputs inputs, DistributedManager* manager, core::Device device,
         RunKind kind)
    : config_(std::move(config)),
      inputs_(std::move(inputs)),
      manager_(manager),
      device_(device),
      kind_(kind) {
  MPIGRAD_CHECK(inputs_.model != nullptr, "Run: no model given");
  MPIGRAD_CHECK(manager_ != nullptr || kind_ == RunKind::Embedded,
                "Run: only an embedded model runs without a DistributedManager");
  prepare_model();
  make_loaders();
  if (kind_ == RunKind::Evaluate) return;
  add_hooks();
  make_strategy();
}

Run::Run(TrainConfig config, RunInputs inputs, DistributedManager& manager, RunKind kind)
    : Run(std::move(config), std::move(inputs), &manager, manager.device(), kind) {}

Run::~Run() = default;

int Run::world_size() const {
  return manager_ != nullptr ? manager_->world_size() : 1;
}

bool Run::is_main_process() const {
  return manager_ == nullptr || manager_->is_main_process();
}

DistributedManager& Run::manager() {
  MPIGRAD_CHECK(manager_ != nullptr, "Run: this run has no DistributedManager (one process)");
  return *manager_;
}

TrainingStrategy& Run::strategy() {
  MPIGRAD_CHECK(strategy_ != nullptr, "Run: an evaluation run has no training strategy");
  return *strategy_;
}

const TrainingStrategy& Run::strategy() const {
  MPIGRAD_CHECK(strategy_ != nullptr, "Run: an evaluation run has no training strategy");
  return *strategy_;
}

// The model on the run's device, its gradient communicator, SyncBatchNorm, the optimizer.
void Run::prepare_model() {
  model_ = inputs_.model;
  model_->to(device_);
  if (kind_ == RunKind::Evaluate) return;
  if (is_main_process() && kind_ == RunKind::Train && device_.is_cpu()) {
    // The count and where it came from (the affinity mask, the node's ranks sharing it, or an
    // override): a rank with more threads than cores of its own runs several times slower.
    const core::ThreadChoice& threads = manager_->threads();
    std::printf("mpigrad train: %d CPU thread(s) on rank 0 (%s), OpenMP waits: %s\n",
                threads.threads, threads.source.c_str(), core::openmp_wait_description().c_str());
  }
  if (world_size() > 1) {
    // Gradients (and SyncBatchNorm's statistics) travel on a communicator of the configured
    // backend and timeout: NCCL for a model on a GPU.
    CollectiveConfig collectives = manager_->collective_config();
    collectives.timeout_seconds = config_.distributed.timeout_s;
    manager_->set_collective_config(collectives);
    gradient_communicator_ =
        create_communicator(*manager_, config_.distributed.backend, device_, "gradients");
    if (config_.distributed.sync_bn) {
      const int64_t converted = convert_sync_batchnorm(*model_, *gradient_communicator_);
      if (is_main_process() && kind_ == RunKind::Train) {
        std::printf("mpigrad train: %lld BatchNorm layer(s) synchronized across ranks\n",
                    static_cast<long long>(converted));
      }
    }
  }
  optimizer_ = make_optimizer(config_.optim, *model_);
  scheduler_ = make_scheduler(config_.sched, *optimizer_, inputs_.total_steps);
}

std::unique_ptr<data::DataLoader> Run::evaluation_loader(std::shared_ptr<data::Dataset> dataset,
                                                         int64_t batch_size) const {
  data::DataLoaderOptions options;
  options.batch_size = batch_size;
  options.num_replicas = world_size();  // a DistributedSampler without shuffle, padded
  options.rank = manager_ != nullptr ? manager_->rank() : 0;
  options.num_workers = loader_workers();
  options.transform = inputs_.inputs.transform;
  options.device = device_;
  return std::make_unique<data::DataLoader>(std::move(dataset), options);
}

int Run::loader_workers() const {
  // The node's ranks all run this many threads (their share of the cores, or the one override).
  return launch::loader_workers(config_.data.read_ahead, device_.is_cpu(), core::num_threads(),
                                manager_ != nullptr ? manager_->local_size() : 1,
                                int64_t(core::affinity_cpus().size()));
}

// Training batches: crop and flip on the stored values into the views (two for SupCon), then
// the input transform, then noise (data/augment.h). Test batches get the input transform only.
void Run::make_loaders() {
  if (kind_ == RunKind::Embedded) return;
  if (kind_ == RunKind::Evaluate) {
    if (inputs_.train_set)
      train_loader_ = evaluation_loader(inputs_.train_set, config_.train.batch_size);
    if (inputs_.test_set) test_loader_ = evaluation_loader(inputs_.test_set, kTestBatchSize);
    return;
  }
  MPIGRAD_CHECK(inputs_.train_set != nullptr, "Run: training needs [data] train");
  const data::AugmentSpec& augment = config_.data.augment;
  const int64_t views = config_.train.stage == StageKind::SupCon ? 2 : 1;
  data::DataLoaderOptions options;
  options.batch_size = config_.train.batch_size;
  options.shuffle = config_.train.shuffle;
  options.seed = config_.train.seed;
  options.num_workers = loader_workers();
  options.transform = inputs_.inputs.transform;
  if (!augment.empty() || views > 1) {
    std::vector<data::BatchTransform> transforms = {
        data::augment_views_transform(config_.data.x, augment, config_.train.seed, views),
        inputs_.inputs.transform};
    if (augment.noise_std > 0) {
      transforms.push_back(
          data::gaussian_noise_transform(config_.data.x, augment.noise_std, config_.train.seed));
    }
    options.transform = data::compose_transforms(std::move(transforms));
  }
  // Atomic structures: the batches of [data] max_atoms and the mix of several stores
  // (data/training_data.h), cut for this rank already, so DDPHook keeps them.
  if (is_atomistic(config_)) {
    options.batch_sampler = data::make_batch_sampler(
        *inputs_.train_set,
        batching_options(config_, manager_ != nullptr ? manager_->rank() : 0, world_size()));
  }
  // On a GPU the loader stages batches in pinned memory and copies them on its own stream.
  options.device = device_;
  train_loader_ = std::make_unique<data::DataLoader>(inputs_.train_set, options);
  // A dry run builds the test loader too (read_first_test_batch).
  if (kind_ == RunKind::Train && inputs_.test_set) {
    test_loader_ = evaluation_loader(inputs_.test_set, kTestBatchSize);
  }
}

// The hooks this kind of run takes from the config. Their order is their own (launch/train/hook.h).
void Run::add_hooks() {
  const TrainSection& train = config_.train;
  const bool training = kind_ == RunKind::Train;
  const bool writes = training && !config_.dry_run;
  const std::string out_dir = writes ? train.out_dir : "";
  const bool loss_scaling = train.precision == nn::Precision::Float16;
  if (training) {
    hooks_.push_back(std::make_shared<CheckpointHook>(
        CheckpointSettings{out_dir, train.resume, train.save_initial, config_.resolved_text(),
                           train.keep_checkpoints, train.checkpoint_scope}));
  }
  if (writes) {
    hooks_.push_back(std::make_shared<PreemptionHook>(
        PreemptionSettings{train.stop_signals, train.time_limit_s, inputs_.started}));
  }
  hooks_.push_back(std::make_shared<DDPHook>(ddp_options(config_.distributed, loss_scaling),
                                             DistributedSamplerSettings{}, nullptr,
                                             gradient_communicator_.get()));
  if (scheduler_) hooks_.push_back(std::make_shared<LRSchedulerHook>());
  if (train.grad_accum_steps > 1) {
    hooks_.push_back(std::make_shared<GradAccumulationHook>(train.grad_accum_steps));
  }
  if (loss_scaling) {
    hooks_.push_back(std::make_shared<LossScalingHook>(
        nn::GradScalerOptions{.growth_interval = train.loss_scale_growth_interval}));
  }
  if (train.clip_grad_norm > 0)
    hooks_.push_back(std::make_shared<GradClipHook>(train.clip_grad_norm));
  if (training && train.ema_decay > 0) {
    // Evaluation runs on a second instance of the model holding the averaged weights.
    std::shared_ptr<nn::Module> averaged =
        is_atomistic(config_)
            ? make_atomistic_model(config_)
            : make_stage_model(config_.model, train, inputs_.sample_shape, inputs_.outputs);
    averaged->to(device_);
    hooks_.push_back(std::make_shared<EMAHook>(*model_, train.ema_decay, averaged));
  }
  if (training && train.stage == StageKind::SupCon) {
    hooks_.push_back(std::make_shared<RetrievalMetricsHook>(config_.data.x, config_.data.y));
  }
  if (training && is_atomistic(config_) && !inputs_.evaluate) {
    // Force MAE and RMSE over all atoms are ratios of global sums (launch/train/atomistic_steps.h).
    hooks_.push_back(std::make_shared<DerivedMetricsHook>(
        energy_force_derived_metrics(energy_force_options(config_.loss))));
  }
  if (training && train.swa_start > 0) {
    hooks_.push_back(std::make_shared<SWAHook>(SWASettings{train.swa_start, train.swa_lr}));
  }
  if (training) {
    hooks_.push_back(std::make_shared<LoggingHook>(out_dir, train.log_every, train.tensorboard));
  }
  if (kind_ == RunKind::Embedded && train.cuda_graphs) {
    hooks_.push_back(std::make_shared<CudaGraphHook>(device_, train.cuda_graph_warmup));
  }
  hooks_.insert(hooks_.end(), inputs_.extra_hooks.begin(), inputs_.extra_hooks.end());
}

// The step and evaluation functions of [loss] and [train] stage, under [train] precision.
void Run::make_strategy() {
  const TrainConfig& config = config_;
  StepFunction step = inputs_.step;
  EvalFunction evaluate = inputs_.evaluate;
  // The optimizer steps taken, for a loss whose weights switch at a step: read through the
  // strategy, which is built below, once the step function is.
  auto context = std::make_shared<const TrainingContext*>(nullptr);
  const auto optimizer_step = [context] { return *context != nullptr ? (*context)->step : 0; };
  if (!step && is_atomistic(config)) {
    const EnergyForceLossOptions options = energy_force_options(config.loss);
    Communicator* world = world_size() > 1 ? &manager_->world() : nullptr;
    step = energy_force_step(options, {world, optimizer_step});
    if (!evaluate && kind_ == RunKind::Train) {
      evaluate = energy_force_metrics(options, optimizer_step);
    }
  }
  if (!step) {
    step = make_supervised_step(config.loss.name, config.data.x, config.data.y);
    if (config.train.stage == StageKind::SupCon) {
      // base_temperature = temperature, as BioEncoder sets it.
      step = supcon_step(config.data.x, config.data.y,
                         nn::SupConOptions{.temperature = config.loss.temperature,
                                           .base_temperature = config.loss.temperature});
    }
  }
  if (!evaluate && kind_ == RunKind::Train && config.train.stage != StageKind::SupCon) {
    // SupCon's validation is RetrievalMetricsHook's.
    evaluate = config.loss.name == LossKind::CrossEntropy
                   ? classification_metrics(config.data.x, config.data.y)
                   : regression_metrics(config.data.x, config.data.y,
                                        make_regression_loss(config.loss.name));
  }
  step = with_precision(std::move(step), config.train.precision);
  if (evaluate) evaluate = with_precision(std::move(evaluate), config.train.precision);
  const bool one_step = config.dry_run;
  strategy_ = std::make_unique<TrainingStrategy>(
      std::vector<nn::Module*>{model_.get()}, std::vector<nn::Optimizer*>{optimizer_.get()},
      std::move(step), std::move(evaluate), manager_, device_, hooks_,
      one_step ? 1 : config.train.epochs, one_step ? 1 : config.train.max_steps);
  *context = &strategy_->context();
  strategy_->context().scheduler = scheduler_.get();
  strategy_->context().quiet = kind_ == RunKind::Embedded;
}

void Run::read_first_test_batch() {
  if (!test_loader_) return;
  test_loader_->start();
  std::optional<data::Batch> first = test_loader_->next();
  MPIGRAD_CHECK(first.has_value(), "[data] test: ", inputs_.test_set->describe(),
                " gave this rank no batch");
}

bool Run::train() {
  MPIGRAD_CHECK(kind_ == RunKind::Train || kind_ == RunKind::LrFind,
                "Run::train: this run is fed one batch at a time, or evaluates only");
  TrainingStrategy& strategy = *strategy_;
  if (config_.dry_run) read_first_test_batch();
  std::unique_ptr<Timeline> timeline;
  if (kind_ == RunKind::Train && !config_.train.trace.empty() && !config_.dry_run) {
    timeline = std::make_unique<Timeline>();
    timeline->start(manager_->world());
    strategy.context().timeline = timeline.get();
  }
  // Every rank profiles (alike, so no rank is slowed alone); rank 0 prints its table.
  std::unique_ptr<OpProfiler> profiler;
  const int64_t first_step = strategy.context().step;
  if (kind_ == RunKind::Train && config_.train.profile && !config_.dry_run) {
    profiler = std::make_unique<OpProfiler>(timeline.get());
  }
  strategy.run(*train_loader_, config_.dry_run ? nullptr : test_loader_.get());
  OpProfileReport profile;
  if (profiler) profile = profiler->finish(strategy.context().step - first_step);
  const bool preempted = strategy.context().preempted;
  if (kind_ == RunKind::Train && !config_.dry_run && !preempted && hook<SWAHook>() != nullptr) {
    finish_swa();
  }
  if (timeline) {
    strategy.context().timeline = nullptr;
    const int64_t spans = write_merged_timeline(*timeline, manager_->world(), config_.train.trace);
    if (is_main_process()) {
      std::printf(
          "mpigrad train: timeline of %lld rank(s), %lld spans: %s (open it in "
          "ui.perfetto.dev)\n",
          static_cast<long long>(world_size()), static_cast<long long>(spans),
          config_.train.trace.c_str());
    }
  }
  if (profiler && is_main_process()) report_profile(profile);
  return preempted;
}

void Run::report_profile(const OpProfileReport& profile) const {
  OpProfileTableOptions options;
  options.max_rows = size_t(config_.train.profile_rows);
  std::fputs(format_op_profile(profile, options).c_str(), stdout);
  if (!config_.train.profile_json.empty()) {
    core::write_file_atomically(config_.train.profile_json,
                                [&](std::ostream& out) { out << op_profile_json(profile); });
    std::printf("mpigrad train: every row of the profile: %s\n",
                config_.train.profile_json.c_str());
  }
  std::fflush(stdout);
}

void Run::finish_swa() {
  const SWAHook& swa = *hook<SWAHook>();
  const TrainingContext& context = strategy_->context();
  const bool main_process = is_main_process();
  if (swa.averager().count() == 0) {
    if (main_process) std::printf("mpigrad train: SWA averaged no epoch (training ended first)\n");
    return;
  }
  std::shared_ptr<nn::Module> averaged =
      make_model(config_.model, inputs_.sample_shape, inputs_.outputs, config_.train.seed);
  averaged->to(device_);
  swa.averager().copy_to(*averaged);
  std::unique_ptr<data::DataLoader> train_loader =
      evaluation_loader(inputs_.train_set, config_.train.batch_size);
  recompute_bn_statistics(*averaged, *train_loader, config_.data.x, *manager_);
  std::map<std::string, double> metrics;
  if (inputs_.test_set) {
    std::unique_ptr<data::DataLoader> test_loader =
        evaluation_loader(inputs_.test_set, kTestBatchSize);
    metrics =
        evaluate_classifier(*averaged, *test_loader, config_.data.x, config_.data.y, *manager_);
  }
  if (!main_process) return;
  std::string path;
  if (!config_.train.out_dir.empty()) {
    path = (std::filesystem::path(config_.train.out_dir) / "swa.h5").string();
    nn::save_checkpoint(path, *averaged, nullptr, nullptr, context.epoch + 1, context.step,
                        world_size(), config_.resolved_text());
  }
  std::printf("mpigrad train: SWA of %lld epoch(s) from epoch %lld",
              static_cast<long long>(swa.averager().count()),
              static_cast<long long>(swa.settings().start_epoch));
  if (!metrics.empty()) std::printf("; SWA test accuracy %.4f", metrics["val_accuracy"]);
  if (!path.empty()) std::printf("; wrote %s", path.c_str());
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace mpigrad::launch
