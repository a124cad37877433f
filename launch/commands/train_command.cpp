#include "mpigrad/launch/commands/train_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "mpigrad/core/atomic_file.h"
#include "mpigrad/core/error.h"
#include "mpigrad/data/augment.h"
#include "mpigrad/data/data_loader.h"
#include "mpigrad/data/hdf5_dataset.h"
#include "mpigrad/data/transforms.h"
#include "mpigrad/launch/commands/checked_run.h"
#include "mpigrad/launch/commands/subcommand.h"
#include "mpigrad/launch/config/train_config.h"
#include "mpigrad/launch/config/train_setup.h"
#include "mpigrad/launch/ddp/sync_batch_norm.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/observe/timeline.h"
#include "mpigrad/launch/train/embeddings.h"
#include "mpigrad/launch/train/loss_scaling_hook.h"
#include "mpigrad/launch/train/preemption.h"
#include "mpigrad/launch/train/swa.h"
#include "mpigrad/launch/train/training_hooks.h"
#include "mpigrad/launch/train/training_steps.h"
#include "mpigrad/launch/train/training_strategy.h"
#include "mpigrad/nn/checkpoint.h"
#include "mpigrad/nn/optim/lr_scheduler.h"

namespace mpigrad::launch {

namespace {

// Writes text to path through a temporary file and a rename.
void write_atomically(const std::string& path, const std::string& text) {
  core::write_file_atomically(path, [&](std::ostream& out) { out << text; });
}

// One line that shows what the model will see: the first batch after the input transform.
void describe_first_batch(const CheckedRun& run) {
  const TrainConfig& config = run.config;
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < std::min(config.train.batch_size, run.train_set->size()); ++i) {
    indices.push_back(i);
  }
  data::Batch batch = run.train_set->get_batch(indices);
  if (run.inputs.transform) batch = run.inputs.transform(std::move(batch));
  const core::Tensor x = batch[config.data.x].to(core::kFloat64).contiguous();
  const std::vector<double> y = batch[config.data.y].to(core::kFloat64).to_vector<double>();
  const double* values = x.data<double>();
  double sum = 0, squares = 0, lo = values[0], hi = values[0];
  for (int64_t i = 0; i < x.numel(); ++i) {
    sum += values[i];
    squares += values[i] * values[i];
    lo = std::min(lo, values[i]);
    hi = std::max(hi, values[i]);
  }
  const double mean = sum / double(x.numel());
  const double std = std::sqrt(std::max(0.0, squares / double(x.numel()) - mean * mean));
  std::ostringstream shape;
  shape << x.shape();
  std::printf(
      "mpigrad train: first batch: field '%s' %s after the input transform: mean %.4g, "
      "std %.4g, min %.4g, max %.4g; field '%s' %s %g to %g\n",
      config.data.x.c_str(), shape.str().c_str(), mean, std, lo, hi, config.data.y.c_str(),
      config.loss.name == LossKind::CrossEntropy ? "labels" : "targets",
      *std::min_element(y.begin(), y.end()), *std::max_element(y.begin(), y.end()));
}

// The end of in-training SWA (launch/train/swa.h): the averaged weights in a second instance of the
// model, BatchNorm recomputed over the training data, evaluated, written to out_dir/swa.h5.
void finish_swa(const CheckedRun& run, const SWAHook& swa, DistributedManager& manager,
                const TrainingContext& context) {
  const TrainConfig& config = run.config;
  const bool main_process = manager.is_main_process();
  if (swa.averager().count() == 0) {
    if (main_process) std::printf("mpigrad train: SWA averaged no epoch (training ended first)\n");
    return;
  }
  std::shared_ptr<nn::Module> averaged =
      make_model(config.model, run.sample_shape, run.outputs, config.train.seed);
  averaged->to(manager.device());
  swa.averager().copy_to(*averaged);
  data::DataLoaderOptions options;
  options.batch_size = config.train.batch_size;
  options.num_replicas = manager.world_size();
  options.rank = manager.rank();
  options.num_workers = 1;
  options.transform = run.inputs.transform;
  options.device = manager.device();
  data::DataLoader train_loader(run.train_set, options);
  recompute_bn_statistics(*averaged, train_loader, config.data.x, manager);
  std::map<std::string, double> metrics;
  if (run.test_set) {
    options.batch_size = kTestBatchSize;
    data::DataLoader test_loader(run.test_set, options);
    metrics = evaluate_classifier(*averaged, test_loader, config.data.x, config.data.y, manager);
  }
  if (!main_process) return;
  std::string path;
  if (!config.train.out_dir.empty()) {
    path = (std::filesystem::path(config.train.out_dir) / "swa.h5").string();
    nn::save_checkpoint(path, *averaged, nullptr, nullptr, context.epoch + 1, context.step,
                        manager.world_size(), config.resolved_text());
  }
  std::printf("mpigrad train: SWA of %lld epoch(s) from epoch %lld",
              static_cast<long long>(swa.averager().count()),
              static_cast<long long>(swa.settings().start_epoch));
  if (!metrics.empty()) std::printf("; SWA test accuracy %.4f", metrics["val_accuracy"]);
  if (!path.empty()) std::printf("; wrote %s", path.c_str());
  std::printf("\n");
  std::fflush(stdout);
}

// What the training phase builds. Members are destroyed last to first, so the gradient
// communicator outlives the model (SyncBatchNorm layers refer to it, and the gradient buckets'
// memory was used on its stream), and the hooks go before the scheduler they step.
struct Training {
  std::unique_ptr<Communicator> gradient_communicator;  // null on one rank
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<nn::Optimizer> optimizer;
  std::unique_ptr<data::DataLoader> train_loader;
  std::unique_ptr<data::DataLoader> test_loader;  // null without [data] test
  std::unique_ptr<nn::LRScheduler> scheduler;     // null for [sched] name = none
  std::vector<std::shared_ptr<Hook>> hooks;
  std::shared_ptr<SWAHook> swa;                   // also in hooks; null without [train] swa_start
  std::shared_ptr<LoggingHook> logging;           // also in hooks
  std::shared_ptr<CheckpointHook> checkpoint;     // also in hooks
  std::shared_ptr<PreemptionHook> preemption;     // also in hooks; null in a dry run
  std::chrono::steady_clock::time_point started;  // the program's start: time_limit counts from it
};

// The model on the run's device, its gradient communicator, SyncBatchNorm, the optimizer.
void prepare_model(CheckedRun& run, DistributedManager& manager, Training& training) {
  const TrainConfig& config = run.config;
  training.model = std::move(run.model);
  nn::Module& model = *training.model;
  model.to(manager.device());
  // Gradients (and SyncBatchNorm's statistics) travel on a communicator of the configured
  // backend and timeout: NCCL for a model on a GPU.
  CollectiveConfig collectives = manager.collective_config();
  collectives.timeout_seconds = config.distributed.timeout_s;
  manager.set_collective_config(collectives);
  if (manager.world_size() > 1) {
    training.gradient_communicator =
        create_communicator(manager, config.distributed.backend, manager.device(), "gradients");
  }
  if (config.distributed.sync_bn && manager.world_size() > 1) {
    int64_t converted = convert_sync_batchnorm(model, *training.gradient_communicator);
    if (manager.is_main_process()) {
      std::printf("mpigrad train: %lld BatchNorm layer(s) synchronized across ranks\n",
                  static_cast<long long>(converted));
    }
  }
  training.optimizer = make_optimizer(config.optim, model);
}

// Training batches: crop and flip on the stored values into the views (two for SupCon), then
// the input transform, then noise (data/augment.h).
std::unique_ptr<data::DataLoader> make_train_loader(const CheckedRun& run,
                                                    DistributedManager& manager) {
  const TrainConfig& config = run.config;
  const data::AugmentSpec& augment = config.data.augment;
  const int64_t views = config.train.stage == StageKind::SupCon ? 2 : 1;
  std::vector<data::BatchTransform> train_transforms = {
      data::augment_views_transform(config.data.x, augment, config.train.seed, views),
      run.inputs.transform};
  if (augment.noise_std > 0) {
    train_transforms.push_back(
        data::gaussian_noise_transform(config.data.x, augment.noise_std, config.train.seed));
  }
  data::DataLoaderOptions options;
  options.batch_size = config.train.batch_size;
  options.shuffle = config.train.shuffle;
  options.seed = config.train.seed;
  options.num_workers = 1;  // one thread reads ahead; compute keeps the cores
  options.transform = augment.empty() && views == 1
                          ? run.inputs.transform
                          : data::compose_transforms(std::move(train_transforms));
  // On a GPU the loader stages batches in pinned memory and copies them on its own stream.
  options.device = manager.device();
  return std::make_unique<data::DataLoader>(run.train_set, options);
}

// Test batches get the input transform only. A dry run builds the test loader too (see
// read_first_test_batch).
std::unique_ptr<data::DataLoader> make_test_loader(const CheckedRun& run,
                                                   DistributedManager& manager) {
  if (!run.test_set) return nullptr;
  data::DataLoaderOptions options;
  options.batch_size = kTestBatchSize;
  options.num_replicas = manager.world_size();  // a DistributedSampler without shuffle, padded
  options.rank = manager.rank();
  options.transform = run.inputs.transform;
  options.device = manager.device();
  return std::make_unique<data::DataLoader>(run.test_set, options);
}

Training build_model_and_loaders(CheckedRun& run, DistributedManager& manager) {
  Training training;
  prepare_model(run, manager, training);
  training.train_loader = make_train_loader(run, manager);
  training.test_loader = make_test_loader(run, manager);
  return training;
}

// The scheduler, and the hooks in the order they run.
void add_hooks(const CheckedRun& run, DistributedManager& manager, Training& training) {
  const TrainConfig& config = run.config;
  training.scheduler = make_scheduler(config.sched, *training.optimizer, run.total_steps);
  const std::string out_dir = config.dry_run ? "" : config.train.out_dir;
  std::vector<std::shared_ptr<Hook>>& hooks = training.hooks;
  training.checkpoint = std::make_shared<CheckpointHook>(
      CheckpointSettings{out_dir, config.train.resume, config.train.save_initial,
                         config.resolved_text(), config.train.keep_checkpoints},
      training.scheduler.get());
  hooks.push_back(training.checkpoint);
  // After CheckpointHook: at the end it restores the signal handlers only once the stop's
  // checkpoint is written.
  if (!config.dry_run) {
    training.preemption = std::make_shared<PreemptionHook>(
        PreemptionSettings{config.train.stop_signals, config.train.time_limit_s, training.started});
    hooks.push_back(training.preemption);
  }
  const bool loss_scaling = config.train.precision == nn::Precision::Float16;
  hooks.push_back(std::make_shared<DDPHook>(ddp_options(config.distributed, loss_scaling),
                                            DistributedSamplerSettings{}, nullptr,
                                            training.gradient_communicator.get()));
  if (training.scheduler) hooks.push_back(std::make_shared<LRSchedulerHook>(*training.scheduler));
  if (config.train.grad_accum_steps > 1) {
    hooks.push_back(std::make_shared<GradAccumulationHook>(config.train.grad_accum_steps));
  }
  if (loss_scaling) {  // before clipping: it unscales
    hooks.push_back(std::make_shared<LossScalingHook>(
        nn::GradScalerOptions{.growth_interval = config.train.loss_scale_growth_interval}));
  }
  if (config.train.clip_grad_norm > 0) {
    hooks.push_back(std::make_shared<GradClipHook>(config.train.clip_grad_norm));
  }
  if (config.train.ema_decay > 0) {
    // Evaluation runs on a second instance of the model holding the averaged weights.
    std::shared_ptr<nn::Module> averaged =
        make_stage_model(config.model, config.train, run.sample_shape, run.outputs);
    averaged->to(manager.device());
    hooks.push_back(std::make_shared<EMAHook>(*training.model, config.train.ema_decay, averaged));
  }
  // SupCon's validation: precision@1 and mAP@R of the test set's embeddings, set before
  // LoggingHook runs so they are logged (and reach every metrics consumer) like any test metric.
  if (config.train.stage == StageKind::SupCon) {
    hooks.push_back(std::make_shared<RetrievalMetricsHook>(config.data.x, config.data.y));
  }
  // SWA follows the scheduler (its lr wins) and precedes logging (which then shows it).
  if (config.train.swa_start > 0) {
    training.swa =
        std::make_shared<SWAHook>(SWASettings{config.train.swa_start, config.train.swa_lr});
    hooks.push_back(training.swa);
  }
  training.logging =
      std::make_shared<LoggingHook>(out_dir, config.train.log_every, config.train.tensorboard);
  hooks.push_back(training.logging);
}

// Rank 0 writes out_dir/config.ini (the resolved configuration) and prints what will run.
void report_start(const CheckedRun& run, const Training& training, DistributedManager& manager) {
  if (!manager.is_main_process()) return;
  const TrainConfig& config = run.config;
  const nn::Module& model = *training.model;
  std::string out_dir = config.dry_run ? "" : config.train.out_dir;
  if (!out_dir.empty()) {
    std::filesystem::create_directories(out_dir);
    write_atomically((std::filesystem::path(out_dir) / "config.ini").string(),
                     config.resolved_text());
  }
  std::printf(
      "mpigrad train: %s, %lld parameters, %lld training samples on %lld rank(s), "
      "batch %lld per rank, %lld steps per epoch\n",
      std::string(core::enum_name(config.model.name, kModelKindNames)).c_str(),
      static_cast<long long>(model.num_parameters()), static_cast<long long>(run.train_set->size()),
      static_cast<long long>(manager.world_size()), static_cast<long long>(config.train.batch_size),
      static_cast<long long>(run.steps_per_epoch));
  if (config.loss.name == LossKind::CrossEntropy) {
    std::printf("mpigrad train: inputs: %s; labels: field '%s', %lld classes\n",
                run.inputs.description.c_str(), config.data.y.c_str(),
                static_cast<long long>(config.data.num_classes));
  } else {
    std::printf("mpigrad train: inputs: %s; targets: field '%s', %s loss\n",
                run.inputs.description.c_str(), config.data.y.c_str(),
                std::string(core::enum_name(config.loss.name, kLossKindNames)).c_str());
  }
  const StageKind stage = config.train.stage;
  if (stage != StageKind::Supervised) {
    std::string detail = ", two views per sample";
    if (stage == StageKind::Classifier) {
      detail = std::string(config.train.freeze_encoder ? ", encoder frozen"
                                                       : ", encoder "
                                                         "fine-tuned") +
               " (loaded from " + config.train.init_from + ")";
    }
    std::printf("mpigrad train: stage %s, %lld trainable parameters%s\n",
                std::string(core::enum_name(stage, kStageKindNames)).c_str(),
                static_cast<long long>(model.num_parameters(/*trainable_only=*/true)),
                detail.c_str());
  }
  if (!config.data.augment.empty()) {
    std::printf("mpigrad train: training augmentations: %s\n",
                data::augment_text(config.data.augment).c_str());
  }
  if (config.train.precision != nn::Precision::Float32) {
    std::printf("mpigrad train: precision %s\n",
                nn::describe_precision(config.train.precision, manager.device()).c_str());
  }
  if (config.train.ema_decay > 0) {
    std::printf("mpigrad train: evaluation uses the EMA of the weights (decay %g)\n",
                config.train.ema_decay);
  }
  if (config.dry_run) describe_first_batch(run);
  std::fflush(stdout);
}

// The step and evaluation functions of [train] stage, over the hooks.
TrainingStrategy make_strategy(const CheckedRun& run, Training& training,
                               DistributedManager& manager) {
  const TrainConfig& config = run.config;
  StepFunction step = make_supervised_step(config.loss.name, config.data.x, config.data.y);
  EvalFunction evaluate = classification_metrics(config.data.x, config.data.y);
  if (config.loss.name != LossKind::CrossEntropy) {
    // A regression ([model] name = onnx): the target field holds the output's values.
    evaluate =
        regression_metrics(config.data.x, config.data.y, make_regression_loss(config.loss.name));
  }
  if (config.train.stage == StageKind::SupCon) {
    // base_temperature = temperature, as BioEncoder sets it.
    step = supcon_step(config.data.x, config.data.y,
                       nn::SupConOptions{.temperature = config.loss.temperature,
                                         .base_temperature = config.loss.temperature});
    evaluate = nullptr;  // RetrievalMetricsHook evaluates
  }
  step = with_precision(std::move(step), config.train.precision);
  evaluate = with_precision(std::move(evaluate), config.train.precision);
  return TrainingStrategy({training.model.get()}, {training.optimizer.get()}, step, evaluate,
                          manager, training.hooks, config.dry_run ? 1 : config.train.epochs,
                          config.dry_run ? 1 : config.train.max_steps);
}

// A dry run reads the test loader's first batch: a test file that would fail the run fails the
// dry run.
void read_first_test_batch(const CheckedRun& run, Training& training) {
  if (!training.test_loader) return;
  training.test_loader->start();
  std::optional<data::Batch> first = training.test_loader->next();
  MPIGRAD_CHECK(first.has_value(), "[data] test: ", run.test_set->describe(),
                " gave this rank no batch");
}

// Trains (a dry run: one step), then finishes SWA and writes the merged timeline when they were
// asked for. A dry run writes nothing, a timeline included.
void run_training(const CheckedRun& run, Training& training, TrainingStrategy& strategy,
                  DistributedManager& manager) {
  const TrainConfig& config = run.config;
  std::unique_ptr<Timeline> timeline;
  if (!config.train.trace.empty() && !config.dry_run) {
    timeline = std::make_unique<Timeline>();
    timeline->start(manager.world());
    strategy.context().timeline = timeline.get();
  }
  strategy.run(*training.train_loader, config.dry_run ? nullptr : training.test_loader.get());
  if (training.swa && !config.dry_run && !strategy.context().preempted) {
    finish_swa(run, *training.swa, manager, strategy.context());
  }
  if (timeline) {
    const int64_t spans = write_merged_timeline(*timeline, manager.world(), config.train.trace);
    if (manager.is_main_process()) {
      std::printf(
          "mpigrad train: timeline of %lld rank(s), %lld spans: %s (open it in "
          "ui.perfetto.dev)\n",
          static_cast<long long>(manager.world_size()), static_cast<long long>(spans),
          config.train.trace.c_str());
    }
  }
}

// Rank 0's last line: the dry run's verdict, or the run's length, speed and test metrics.
void report_end(const CheckedRun& run, const Training& training, const TrainingContext& context,
                DistributedManager& manager) {
  if (!manager.is_main_process()) return;
  if (run.config.dry_run) {
    std::printf("mpigrad train: dry run passed (config, data, model and one step%s)\n",
                training.test_loader ? "; the test loader's first batch" : "");
  } else {
    const auto& metrics = context.metrics;
    auto accuracy = metrics.find("val_accuracy");
    std::printf("mpigrad train: done after %lld epoch(s), %lld steps; throughput %.0f samples/s",
                static_cast<long long>(context.epoch + 1), static_cast<long long>(context.step),
                training.logging->samples_per_second());
    if (accuracy != metrics.end()) std::printf("; test accuracy %.4f", accuracy->second);
    auto precision = metrics.find("val_precision_at_1"), map = metrics.find("val_map_at_r");
    if (precision != metrics.end() && map != metrics.end()) {
      std::printf("; test precision@1 %.4f, mAP@R %.4f", precision->second, map->second);
    }
    std::printf("\n");
  }
  std::fflush(stdout);
}

// Rank 0's last line after a stop on a signal or the time limit: where it stopped, why, and
// what to run next.
void report_preempted(const Training& training, const TrainingContext& context,
                      DistributedManager& manager) {
  if (!manager.is_main_process()) return;
  const std::string& saved = training.checkpoint->preempted_checkpoint();
  std::printf(
      "mpigrad train: preempted (%s) in epoch %lld after step %lld; %s; exit status %d: run "
      "again with [train] resume = auto to continue\n",
      training.preemption->reason().c_str(), static_cast<long long>(context.epoch + 1),
      static_cast<long long>(context.step),
      saved.empty() ? "no out_dir, so no checkpoint" : ("saved " + saved).c_str(),
      kPreemptedExitStatus);
  std::fflush(stdout);
}

// The training phase; any exception escapes to run_subcommand, which ends the job.
int train(CheckedRun& run, DistributedManager& manager,
          std::chrono::steady_clock::time_point started) {
  Training training = build_model_and_loaders(run, manager);
  training.started = started;
  add_hooks(run, manager, training);
  report_start(run, training, manager);
  if (run.config.dry_run) read_first_test_batch(run, training);
  TrainingStrategy strategy = make_strategy(run, training, manager);
  run_training(run, training, strategy, manager);
  if (strategy.context().preempted) {
    report_preempted(training, strategy.context(), manager);
    return kPreemptedExitStatus;
  }
  report_end(run, training, strategy.context(), manager);
  return 0;
}

}  // namespace

int run_train_command(int argc, char** argv) {
  const auto started = std::chrono::steady_clock::now();
  CheckedRun run;
  return run_subcommand(
      argc, argv, "mpigrad train", train_config_help(),
      [&](DistributedManager& manager, const std::vector<std::string>& args) {
        run = check_run(args, manager.rank(), manager.world_size());
      },
      [&](DistributedManager& manager) {
        // Program_options also takes an abbreviation of --help ("--hel").
        if (run.config.help) {
          if (manager.is_main_process()) std::printf("%s", train_config_help().c_str());
          return 0;
        }
        return train(run, manager, started);
      });
}

}  // namespace mpigrad::launch
