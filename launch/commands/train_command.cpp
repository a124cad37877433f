#include "mpigrad/launch/commands/train_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "mpigrad/core/atomic_file.h"
#include "mpigrad/core/checked_math.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/data/augment.h"
#include "mpigrad/data/data_loader.h"
#include "mpigrad/data/hdf5_dataset.h"
#include "mpigrad/data/transforms.h"
#include "mpigrad/launch/train/training_steps.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/train/embeddings.h"
#include "mpigrad/launch/mpi_interop.h"
#include "mpigrad/launch/train/swa.h"
#include "mpigrad/launch/ddp/sync_batch_norm.h"
#include "mpigrad/launch/observe/timeline.h"
#include "mpigrad/launch/config/train_config.h"
#include "mpigrad/launch/config/train_setup.h"
#include "mpigrad/launch/train/training_hooks.h"
#include "mpigrad/launch/train/training_strategy.h"
#include "mpigrad/nn/checkpoint.h"
#include "mpigrad/nn/optim/lr_scheduler.h"

namespace mpigrad::launch {

namespace {

// Everything the checking phase builds and the training phase uses.
struct TrainingJob {
  // Declared before the model so it is destroyed after it (see train()).
  std::unique_ptr<Communicator> gradient_communicator;
  TrainConfig config;
  std::shared_ptr<data::Hdf5Dataset> train_set, test_set;
  std::shared_ptr<nn::Module> model;
  core::Shape sample_shape;
  int64_t outputs = 0;          // the model's outputs: the classes
  int64_t steps_per_epoch = 0;  // optimizer steps, equal on every rank
  int64_t total_steps = 0;
};

// Labels are checked before training, so a bad one fails on every rank at once instead of in
// one rank's loss while the others wait. Each rank reads only its own share of the index space
// (together the ranks cover every sample), one bounded piece at a time.
void check_labels(const data::Hdf5Dataset& dataset, const TrainConfig& config, const char* key,
                  int64_t rank, int64_t ranks) {
  const std::string& y = config.data.y;
  const int64_t size = dataset.total_size();
  const int64_t begin = size * rank / ranks, end = size * (rank + 1) / ranks;
  constexpr int64_t kPiece = int64_t(1) << 20;  // labels per read: 8 MiB as int64
  for (int64_t first = begin; first < end; first += kPiece) {
    const int64_t count = std::min(kPiece, end - first);
    core::Tensor labels = dataset.read_field(y, first, count).to(core::kInt64);
    const int64_t* values = labels.data<int64_t>();
    for (int64_t i = 0; i < count; ++i) {
      MPIGRAD_CHECK(values[i] >= 0 && values[i] < config.data.num_classes, key, ": ",
                    dataset.describe(), " field '", y, "' holds label ", values[i], " at sample ",
                    first + i, ", outside [0, ", config.data.num_classes,
                    ") of [data] num_classes");
    }
  }
}

std::shared_ptr<data::Hdf5Dataset> open_dataset(const std::vector<std::string>& paths,
                                                const TrainConfig& config, const char* key,
                                                int64_t rank, int64_t ranks) {
  auto dataset = std::make_shared<data::Hdf5Dataset>(
      paths, data::Hdf5DatasetOptions{.fields = {config.data.x, config.data.y}});
  MPIGRAD_CHECK(dataset->size() > 0, key, ": ", dataset->describe(), " has no samples (N = 0 "
                "in field '", config.data.x, "'); nothing to ",
                std::string(key) == "[data] test" ? "evaluate on" : "train on");
  // The distributed samplers need one sample per rank; say so now, not in the training phase.
  MPIGRAD_CHECK(dataset->size() >= ranks, key, ": ", dataset->describe(), " has ",
                dataset->size(), " sample(s), fewer than the ", ranks,
                " ranks; every rank needs at least one");
  const data::FieldInfo& labels = dataset->field(config.data.y);
  MPIGRAD_CHECK(!core::is_floating(labels.dtype), key, ": label field '", config.data.y, "' of ",
                dataset->describe(), " is ", labels.dtype, "; class labels must be integers "
                "(any integer dtype)");
  MPIGRAD_CHECK(labels.sample_shape.numel() == 1, key, ": label field '", config.data.y, "' of ",
                dataset->describe(), " has per-sample shape ", labels.sample_shape,
                "; expected one label per sample");
  const data::FieldInfo& inputs = dataset->field(config.data.x);
  MPIGRAD_CHECK(inputs.dtype != core::kBool, key, ": input field '", config.data.x, "' of ",
                dataset->describe(), " is bool; inputs must be numbers");
  check_labels(*dataset, config, key, rank, ranks);
  return dataset;
}

// Channels are the first per-sample dimension ([C, H, W] images, [F] features).
int64_t input_channels(const core::Shape& sample_shape) {
  return sample_shape.size() >= 1 ? sample_shape[0] : 1;
}

void check_normalization(const TrainConfig& config, const data::FieldInfo& inputs) {
  const int64_t channels = input_channels(inputs.sample_shape);
  for (const auto* values : {&config.data.mean, &config.data.std}) {
    const size_t n = values->size();
    MPIGRAD_CHECK(n <= 1 || int64_t(n) == channels, "[data] ", values == &config.data.mean ?
                  "mean" : "std", ": ", n, " values, but field '", config.data.x,
                  "' has per-sample shape ", inputs.sample_shape, ", so ", channels,
                  " channel(s); give one value, or one per channel");
  }
}

// Evaluation reads the test set in batches of this many samples per rank.
constexpr int64_t kTestBatchSize = 256;

// A batch is allocated at every step, and with the read-ahead a few are alive at once: one that
// cannot fit in memory is refused now, naming the file, the field and the bytes.
void check_batch_memory(const data::Hdf5Dataset& dataset, const TrainConfig& config,
                        const char* key, int64_t batch) {
  int64_t bytes = 0;
  for (const data::FieldInfo& field : dataset.fields()) {
    const std::string what = std::string(key) + ": " + dataset.describe() + " field '" +
                             field.name + "' of per-sample shape " + field.sample_shape.str();
    bytes = core::checked_add(bytes, core::checked_mul(batch, field.sample_bytes(), what,
                                                       ": a batch of ", batch, " samples"),
                              what, ": a batch");
    check_fits_in_memory(bytes, what + ": a batch of " + std::to_string(batch) +
                                    " samples ([train] batch_size " +
                                    std::to_string(config.train.batch_size) + ")");
  }
}

// The file is written at the end of training: a path that cannot be written fails now instead.
// Its folder is created as out_dir is.
void check_writable(const std::string& path, const char* key) {
  namespace fs = std::filesystem;
  const fs::path parent = fs::path(path).parent_path();
  std::error_code error;
  if (!parent.empty()) fs::create_directories(parent, error);
  MPIGRAD_CHECK(!error, key, ": cannot create the folder '", parent.string(), "' of '", path,
                "': ", error.message());
  MPIGRAD_CHECK(!fs::is_directory(path), key, ": '", path, "' is a folder; give a file name");
  const std::string probe = path + ".tmp";
  {
    std::ofstream out(probe);
    MPIGRAD_CHECK(out.good(), key, ": cannot write '", probe, "'");
  }
  fs::remove(probe, error);
}

TrainingJob check_job(const std::vector<std::string>& args, int64_t rank, int64_t ranks) {
  TrainingJob job;
  job.config = parse_train_config(args);
  if (job.config.help) return job;
  const TrainConfig& config = job.config;
  job.train_set = open_dataset(config.data.train, config, "[data] train", rank, ranks);
  if (!config.data.test.empty()) {
    job.test_set = open_dataset(config.data.test, config, "[data] test", rank, ranks);
  }
  const data::FieldInfo& inputs = job.train_set->field(config.data.x);
  job.sample_shape = inputs.sample_shape;
  check_normalization(config, inputs);
  // A classifier: the model's outputs are the classes.
  MPIGRAD_CHECK(config.loss.name == LossKind::CrossEntropy, "[loss] name: mpigrad train trains "
                "classifiers (cross_entropy); mse and l1 are for regression through the C API "
                "(mpigrad/mpigrad_c.h)");
  MPIGRAD_CHECK(config.model.outputs == 0 || config.model.outputs == config.data.num_classes,
                "[model] outputs: ", config.model.outputs, " differs from [data] num_classes ",
                config.data.num_classes, "; leave it 0 for a classifier");
  job.outputs = config.data.num_classes;
  MPIGRAD_CHECK(config.model.input_shape.empty() ||
                    core::Shape(config.model.input_shape) == job.sample_shape,
                "[model] input_shape: ", core::Shape(config.model.input_shape), " but field '",
                config.data.x, "' has per-sample shape ", job.sample_shape);
  if (job.test_set) {
    const data::FieldInfo& test_x = job.test_set->field(config.data.x);
    MPIGRAD_CHECK(test_x.sample_shape == job.sample_shape, "[data] test: field '", config.data.x,
                  "' has per-sample shape ", test_x.sample_shape, " but the training data has ",
                  job.sample_shape);
  }
  // The distributed sampler pads every rank to ceil(N / R) samples. The config's sizes may be
  // anything up to int64's maximum: rounding up and multiplying are checked.
  const int64_t per_rank = core::ceil_div(job.train_set->size(), ranks);
  const int64_t batches = core::ceil_div(per_rank, config.train.batch_size);
  job.steps_per_epoch = core::ceil_div(batches, config.train.grad_accum_steps);
  job.total_steps = core::checked_mul(config.train.epochs, job.steps_per_epoch,
                                      "[train] epochs: the run's length in optimizer updates "
                                      "(epochs x ", job.steps_per_epoch, " per epoch)");
  check_batch_memory(*job.train_set, config, "[data] train", std::min(config.train.batch_size,
                                                                      per_rank));
  if (job.test_set) {
    check_batch_memory(*job.test_set, config, "[data] test",
                       std::min(kTestBatchSize, core::ceil_div(job.test_set->size(), ranks)));
  }
  // (A dry run takes one step of this schedule: the schedule is the run's, checked as such.)
  if (config.train.max_steps > 0) job.total_steps = std::min(job.total_steps, config.train.max_steps);
  check_schedule(config.sched, job.total_steps);
  MPIGRAD_CHECK(!config.data.augment.geometric() || job.sample_shape.size() == 3,
                "[data] augment: crop and flip need images of shape [channels, height, width], "
                "but field '", config.data.x, "' has per-sample shape ", job.sample_shape);
  job.model = make_stage_model(config.model, config.train, job.sample_shape, job.outputs);
  if (config.train.stage == StageKind::Classifier) {
    // Read here, in the checking phase, so a missing or mismatched tensor fails on every rank.
    load_encoder(dynamic_cast<nn::EncoderWithHead&>(*job.model), config.train.init_from,
                 "[train] init_from");
  }
  if (rank == 0 && !config.train.trace.empty() && !config.dry_run) {
    check_writable(config.train.trace, "[train] trace");
  }
  return job;
}

// Writes text to path through a temporary file and a rename.
void write_atomically(const std::string& path, const std::string& text) {
  core::write_file_atomically(path, [&](std::ostream& out) { out << text; });
}

// One line that shows what the model will see: the first batch after the input transform.
void describe_first_batch(const TrainingJob& job, const InputTransform& inputs) {
  const TrainConfig& config = job.config;
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < std::min(config.train.batch_size, job.train_set->size()); ++i) {
    indices.push_back(i);
  }
  data::Batch batch = job.train_set->get_batch(indices);
  if (inputs.transform) batch = inputs.transform(std::move(batch));
  const core::Tensor x = batch[config.data.x].to(core::kFloat64).contiguous();
  const std::vector<int64_t> y = batch[config.data.y].to(core::kInt64).to_vector<int64_t>();
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
  std::printf("mpigrad train: first batch: field '%s' %s after the input transform: mean %.4g, "
              "std %.4g, min %.4g, max %.4g; field '%s' labels %lld to %lld\n",
              config.data.x.c_str(), shape.str().c_str(), mean, std, lo, hi,
              config.data.y.c_str(), static_cast<long long>(*std::min_element(y.begin(), y.end())),
              static_cast<long long>(*std::max_element(y.begin(), y.end())));
}

// The end of in-training SWA (launch/train/swa.h): the averaged weights in a second instance of the
// model, BatchNorm recomputed over the training data, evaluated, written to out_dir/swa.h5.
void finish_swa(const TrainingJob& job, const SWAHook& swa, DistributedManager& manager,
                const TrainingContext& context) {
  const TrainConfig& config = job.config;
  const bool main_process = manager.is_main_process();
  if (swa.averager().count() == 0) {
    if (main_process) std::printf("mpigrad train: SWA averaged no epoch (training ended first)\n");
    return;
  }
  std::shared_ptr<nn::Module> averaged =
      make_model(config.model, job.sample_shape, job.outputs, config.train.seed);
  averaged->to(manager.device());
  swa.averager().copy_to(*averaged);
  const InputTransform inputs = input_transform(config, job.train_set->field(config.data.x));
  data::DataLoaderOptions options;
  options.batch_size = config.train.batch_size;
  options.num_replicas = manager.world_size();
  options.rank = manager.rank();
  options.num_workers = 1;
  options.transform = inputs.transform;
  options.device = manager.device();
  data::DataLoader train_loader(job.train_set, options);
  recompute_bn_statistics(*averaged, train_loader, config.data.x, manager);
  std::map<std::string, double> metrics;
  if (job.test_set) {
    options.batch_size = 256;
    data::DataLoader test_loader(job.test_set, options);
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

// The training phase; any exception escapes to the caller, which ends the job.
int train(TrainingJob& job, DistributedManager& manager) {
  const TrainConfig& config = job.config;
  const int64_t ranks = manager.world_size(), rank = manager.rank();
  const bool main_process = manager.is_main_process();
  nn::Module& model = *job.model;
  model.to(manager.device());

  // Gradients (and SyncBatchNorm's statistics) travel on a communicator of the configured
  // backend and timeout: NCCL for a model on a GPU. The job owns it, and it outlives the model:
  // SyncBatchNorm layers refer to it and the gradient buckets' memory was used on its stream.
  CollectiveConfig collectives = manager.collective_config();
  collectives.timeout_seconds = config.distributed.timeout_s;
  manager.set_collective_config(collectives);
  if (ranks > 1) {
    job.gradient_communicator = create_communicator(manager, config.distributed.backend,
                                                    manager.device(), "gradients");
  }
  Communicator* gradient_communicator = job.gradient_communicator.get();

  if (config.distributed.sync_bn && ranks > 1) {
    int64_t converted = convert_sync_batchnorm(model, *gradient_communicator);
    if (main_process) {
      std::printf("mpigrad train: %lld BatchNorm layer(s) synchronized across ranks\n",
                  static_cast<long long>(converted));
    }
  }
  std::unique_ptr<nn::Optimizer> optimizer = make_optimizer(config.optim, model);

  const InputTransform inputs = input_transform(config, job.train_set->field(config.data.x));
  const StageKind stage = config.train.stage;
  // Training batches only: crop and flip on the stored values into the views (two for SupCon),
  // then the input transform, then noise (data/augment.h). Test batches get the input transform.
  const data::AugmentSpec& augment = config.data.augment;
  const int64_t views = stage == StageKind::SupCon ? 2 : 1;
  std::vector<data::BatchTransform> train_transforms = {
      data::augment_views_transform(config.data.x, augment, config.train.seed, views),
      inputs.transform};
  if (augment.noise_std > 0) {
    train_transforms.push_back(
        data::gaussian_noise_transform(config.data.x, augment.noise_std, config.train.seed));
  }
  data::DataLoaderOptions train_options;
  train_options.batch_size = config.train.batch_size;
  train_options.shuffle = config.train.shuffle;
  train_options.seed = config.train.seed;
  train_options.num_workers = 1;  // one thread reads ahead; compute keeps the cores
  train_options.transform = augment.empty() && views == 1
                                ? inputs.transform
                                : data::compose_transforms(std::move(train_transforms));
  // On a GPU the loader stages batches in pinned memory and copies them on its own stream.
  train_options.device = manager.device();
  data::DataLoader train_loader(job.train_set, train_options);

  std::unique_ptr<data::DataLoader> test_loader;
  // A dry run builds the test loader too, and reads its first batch below: a test file that
  // would fail the run fails the dry run.
  if (job.test_set) {
    data::DataLoaderOptions test_options;
    test_options.batch_size = kTestBatchSize;
    test_options.num_replicas = ranks;  // a DistributedSampler without shuffle, padded
    test_options.rank = rank;
    test_options.transform = inputs.transform;
    test_options.device = manager.device();
    test_loader = std::make_unique<data::DataLoader>(job.test_set, test_options);
  }

  int64_t max_steps = config.dry_run ? 1 : config.train.max_steps;
  std::unique_ptr<nn::LRScheduler> scheduler =
      make_scheduler(config.sched, *optimizer, job.total_steps);

  std::string out_dir = config.dry_run ? "" : config.train.out_dir;
  const DdpOptions ddp = ddp_options(config.distributed);
  std::vector<std::shared_ptr<Hook>> hooks;
  hooks.push_back(std::make_shared<CheckpointHook>(
      CheckpointSettings{out_dir, config.train.resume, config.train.save_initial,
                         config.resolved_text()},
      scheduler.get()));
  hooks.push_back(std::make_shared<DDPHook>(ddp, DistributedSamplerSettings{}, nullptr,
                                            gradient_communicator));
  if (scheduler) hooks.push_back(std::make_shared<LRSchedulerHook>(*scheduler));
  if (config.train.grad_accum_steps > 1) {
    hooks.push_back(std::make_shared<GradAccumulationHook>(config.train.grad_accum_steps));
  }
  if (config.train.clip_grad_norm > 0) {
    hooks.push_back(std::make_shared<GradClipHook>(config.train.clip_grad_norm));
  }
  if (config.train.ema_decay > 0) {
    // Evaluation runs on a second instance of the model holding the averaged weights.
    std::shared_ptr<nn::Module> averaged =
        make_stage_model(config.model, config.train, job.sample_shape, job.outputs);
    averaged->to(manager.device());
    hooks.push_back(std::make_shared<EMAHook>(model, config.train.ema_decay, averaged));
  }
  // SupCon's validation: precision@1 and mAP@R of the test set's embeddings, set before
  // LoggingHook runs so they are logged (and reach every metrics consumer) like any test metric.
  if (stage == StageKind::SupCon) {
    hooks.push_back(std::make_shared<RetrievalMetricsHook>(config.data.x, config.data.y));
  }
  // SWA follows the scheduler (its lr wins) and precedes logging (which then shows it).
  std::shared_ptr<SWAHook> swa;
  if (config.train.swa_start > 0) {
    swa = std::make_shared<SWAHook>(SWASettings{config.train.swa_start, config.train.swa_lr});
    hooks.push_back(swa);
  }
  auto logging =
      std::make_shared<LoggingHook>(out_dir, config.train.log_every, config.train.tensorboard);
  hooks.push_back(logging);

  if (main_process) {
    if (!out_dir.empty()) {
      std::filesystem::create_directories(out_dir);
      write_atomically((std::filesystem::path(out_dir) / "config.ini").string(),
                       config.resolved_text());
    }
    std::printf("mpigrad train: %s, %lld parameters, %lld training samples on %lld rank(s), "
                "batch %lld per rank, %lld steps per epoch\n",
                std::string(core::enum_name(config.model.name, kModelKindNames)).c_str(),
                static_cast<long long>(model.num_parameters()),
                static_cast<long long>(job.train_set->size()), static_cast<long long>(ranks),
                static_cast<long long>(config.train.batch_size),
                static_cast<long long>(job.steps_per_epoch));
    std::printf("mpigrad train: inputs: %s; labels: field '%s', %lld classes\n",
                inputs.description.c_str(), config.data.y.c_str(),
                static_cast<long long>(config.data.num_classes));
    if (stage != StageKind::Supervised) {
      std::string detail = ", two views per sample";
      if (stage == StageKind::Classifier) {
        detail = std::string(config.train.freeze_encoder ? ", encoder frozen" : ", encoder "
                             "fine-tuned") + " (loaded from " + config.train.init_from + ")";
      }
      std::printf("mpigrad train: stage %s, %lld trainable parameters%s\n",
                  std::string(core::enum_name(stage, kStageKindNames)).c_str(),
                  static_cast<long long>(model.num_parameters(/*trainable_only=*/true)),
                  detail.c_str());
    }
    if (!augment.empty()) {
      std::printf("mpigrad train: training augmentations: %s\n",
                  data::augment_text(augment).c_str());
    }
    if (config.train.ema_decay > 0) {
      std::printf("mpigrad train: evaluation uses the EMA of the weights (decay %g)\n",
                  config.train.ema_decay);
    }
    if (config.dry_run) describe_first_batch(job, inputs);
    std::fflush(stdout);
  }

  if (config.dry_run && test_loader) {
    test_loader->start();
    std::optional<data::Batch> first = test_loader->next();
    MPIGRAD_CHECK(first.has_value(), "[data] test: ", job.test_set->describe(),
                  " gave this rank no batch");
  }

  StepFunction step = classification_step(config.data.x, config.data.y);
  EvalFunction evaluate = classification_metrics(config.data.x, config.data.y);
  if (stage == StageKind::SupCon) {
    // base_temperature = temperature, as BioEncoder sets it.
    step = supcon_step(config.data.x, config.data.y,
                       nn::SupConOptions{.temperature = config.loss.temperature,
                                         .base_temperature = config.loss.temperature});
    evaluate = nullptr;  // RetrievalMetricsHook evaluates
  }
  TrainingStrategy strategy({&model}, {optimizer.get()}, step, evaluate, manager, hooks,
                            config.dry_run ? 1 : config.train.epochs, max_steps);
  // A dry run writes nothing, a timeline included.
  std::unique_ptr<Timeline> timeline;
  if (!config.train.trace.empty() && !config.dry_run) {
    timeline = std::make_unique<Timeline>();
    timeline->start(manager.world());
    strategy.context().timeline = timeline.get();
  }
  strategy.run(train_loader, config.dry_run ? nullptr : test_loader.get());
  if (swa && !config.dry_run) finish_swa(job, *swa, manager, strategy.context());
  if (timeline) {
    const int64_t spans = write_merged_timeline(*timeline, manager.world(), config.train.trace);
    if (main_process) {
      std::printf("mpigrad train: timeline of %lld rank(s), %lld spans: %s (open it in "
                  "ui.perfetto.dev)\n", static_cast<long long>(ranks),
                  static_cast<long long>(spans), config.train.trace.c_str());
    }
  }

  if (main_process) {
    if (config.dry_run) {
      std::printf("mpigrad train: dry run passed (config, data, model and one step%s)\n",
                  test_loader ? "; the test loader's first batch" : "");
    } else {
      const auto& metrics = strategy.context().metrics;
      auto accuracy = metrics.find("val_accuracy");
      std::printf("mpigrad train: done after %lld epoch(s), %lld steps; throughput %.0f samples/s",
                  static_cast<long long>(strategy.context().epoch + 1),
                  static_cast<long long>(strategy.context().step), logging->samples_per_second());
      if (accuracy != metrics.end()) std::printf("; test accuracy %.4f", accuracy->second);
      auto precision = metrics.find("val_precision_at_1"), map = metrics.find("val_map_at_r");
      if (precision != metrics.end() && map != metrics.end()) {
        std::printf("; test precision@1 %.4f, mAP@R %.4f", precision->second, map->second);
      }
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

CheckedRun check_run(const std::vector<std::string>& args, int64_t rank, int64_t ranks) {
  TrainingJob job = check_job(args, rank, ranks);
  CheckedRun run;
  run.config = job.config;
  if (run.config.help) return run;
  run.train_set = job.train_set;
  run.test_set = job.test_set;
  run.sample_shape = job.sample_shape;
  run.outputs = job.outputs;
  run.steps_per_epoch = job.steps_per_epoch;
  const data::FieldInfo& inputs = job.train_set->field(job.config.data.x);
  run.input_transform = input_transform(job.config, inputs).transform;
  return run;
}

int run_train_command(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  DistributedManager manager = DistributedManager::initialize();
  const int rank = manager.rank(), ranks = manager.world_size();

  // Phase 1: every rank checks, then all agree on the outcome.
  std::optional<TrainingJob> job;
  std::string error;
  try {
    job = check_job(args, rank, ranks);
  } catch (const std::exception& e) {
    error = e.what();
  }
  core::Tensor first_failure = core::Tensor::from_vector<int64_t>({error.empty() ? ranks : rank}, {1});
  manager.world().all_reduce(first_failure, ReduceOp::Min);
  int64_t failing = first_failure.item<int64_t>();
  if (failing < ranks) {
    if (failing == rank) {
      std::fprintf(stderr, "[rank %d/%d] mpigrad train: error: %s\n", rank, ranks, error.c_str());
    }
    return 1;
  }
  if (job->config.help) {
    if (manager.is_main_process()) std::printf("%s", train_config_help().c_str());
    return 0;
  }

  // Phase 2: a failure anywhere ends the whole job.
  try {
    return train(*job, manager);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d/%d] mpigrad train: error: %s\n", rank, ranks, e.what());
    std::fflush(stderr);
    if (ranks > 1) MPI_Abort(native_communicator(manager.world()), 1);
    return 1;
  }
}

}  // namespace mpigrad::launch
