#include "mpigrad/launch/train_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/data/data_loader.h"
#include "mpigrad/data/hdf5_dataset.h"
#include "mpigrad/data/transforms.h"
#include "mpigrad/launch/distributed_manager.h"
#include "mpigrad/launch/mpi_interop.h"
#include "mpigrad/launch/sync_batch_norm.h"
#include "mpigrad/launch/train_config.h"
#include "mpigrad/launch/training_hooks.h"
#include "mpigrad/launch/training_strategy.h"
#include "mpigrad/nn/loss.h"
#include "mpigrad/nn/models.h"
#include "mpigrad/nn/optim/adam.h"
#include "mpigrad/nn/optim/lr_scheduler.h"
#include "mpigrad/nn/optim/sgd.h"

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
  int64_t steps_per_epoch = 0;  // optimizer steps, equal on every rank
  int64_t total_steps = 0;
};

std::shared_ptr<data::Hdf5Dataset> open_dataset(const std::vector<std::string>& paths,
                                                const TrainConfig& config, const char* key) {
  auto dataset = std::make_shared<data::Hdf5Dataset>(
      paths, data::Hdf5DatasetOptions{.fields = {config.data.x, config.data.y}});
  const data::FieldInfo& labels = dataset->field(config.data.y);
  MPIGRAD_CHECK(labels.dtype == core::kInt64 || labels.dtype == core::kInt32 ||
                    labels.dtype == core::kUInt8,
                key, ": label field '", config.data.y, "' of ", dataset->describe(), " is ",
                labels.dtype, "; expected an integer type");
  MPIGRAD_CHECK(labels.sample_shape.numel() == 1, key, ": label field '", config.data.y, "' of ",
                dataset->describe(), " has per-sample shape ", labels.sample_shape,
                "; expected one label per sample");
  // Labels are small: check them all now, so a bad one fails before training on every rank
  // instead of in one rank's loss while the others wait.
  const int64_t chunk = 65536;
  for (int64_t begin = 0; begin < dataset->size(); begin += chunk) {
    std::vector<int64_t> indices;
    for (int64_t i = begin; i < std::min(dataset->size(), begin + chunk); ++i) indices.push_back(i);
    core::Tensor y = dataset->get_batch(indices)[config.data.y].to(core::kInt64).reshape({-1});
    int64_t lo = core::min(y).item<int64_t>(), hi = core::max(y).item<int64_t>();
    MPIGRAD_CHECK(lo >= 0 && hi < config.data.num_classes, key, ": ", dataset->describe(),
                  " field '", config.data.y, "' holds label ", lo < 0 ? lo : hi,
                  ", outside [0, ", config.data.num_classes, ") of [data] num_classes");
  }
  return dataset;
}

TrainingJob check_job(const std::vector<std::string>& args, int64_t ranks) {
  TrainingJob job;
  job.config = parse_train_config(args);
  if (job.config.help) return job;
  const TrainConfig& config = job.config;
  job.train_set = open_dataset(config.data.train, config, "[data] train");
  if (!config.data.test.empty()) job.test_set = open_dataset(config.data.test, config, "[data] test");
  job.sample_shape = job.train_set->field(config.data.x).sample_shape;
  if (job.test_set) {
    const data::FieldInfo& test_x = job.test_set->field(config.data.x);
    MPIGRAD_CHECK(test_x.sample_shape == job.sample_shape, "[data] test: field '", config.data.x,
                  "' has per-sample shape ", test_x.sample_shape, " but the training data has ",
                  job.sample_shape);
  }
  // The distributed sampler pads every rank to ceil(N / R) samples.
  int64_t per_rank = (job.train_set->size() + ranks - 1) / ranks;
  int64_t batches = (per_rank + config.train.batch_size - 1) / config.train.batch_size;
  job.steps_per_epoch =
      (batches + config.train.grad_accum_steps - 1) / config.train.grad_accum_steps;
  job.total_steps = config.train.epochs * job.steps_per_epoch;
  if (config.train.max_steps > 0) job.total_steps = std::min(job.total_steps, config.train.max_steps);
  if (config.dry_run) job.total_steps = 1;
  MPIGRAD_CHECK(config.sched.name != "cosine" || config.sched.warmup_steps < job.total_steps,
                "[sched] warmup_steps: ", config.sched.warmup_steps,
                " must be below the run's ", job.total_steps, " optimizer steps");
  core::Generator generator(config.train.seed);
  if (config.model.name == "mlp") {
    job.model = nn::make_mlp(job.sample_shape, config.model.hidden, config.data.num_classes,
                             config.model.dropout, generator);
  } else {
    job.model = nn::make_cnn(job.sample_shape, config.model.channels, config.model.hidden,
                             config.data.num_classes, config.model.dropout, generator);
  }
  return job;
}

// Writes text to path through a temporary file and a rename.
void write_atomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
    MPIGRAD_CHECK(out.good(), "cannot write ", tmp);
  }
  std::filesystem::rename(tmp, path);
}

data::BatchTransform input_transform(const TrainConfig& config) {
  double mean = config.data.normalize_mean.value_or(0.0);
  double std = config.data.normalize_std.value_or(1.0);
  return data::normalize_transform(config.data.x, 1.0 / 255.0, {mean}, {std});
}

// The training phase; any exception escapes to the caller, which ends the job.
int train(TrainingJob& job, DistributedManager& manager) {
  const TrainConfig& config = job.config;
  const int64_t ranks = manager.world_size(), rank = manager.rank();
  nn::Module& model = *job.model;
  model.to(manager.device());

  // Gradients (and SyncBatchNorm's statistics) travel on a communicator of the configured
  // backend and timeout: NCCL for a model on a GPU. The job owns it, and it outlives the model:
  // SyncBatchNorm layers refer to it and the gradient buckets' memory was used on its stream.
  CollectiveConfig collectives = manager.collective_config();
  collectives.timeout_seconds = config.distributed.timeout_s;
  manager.set_collective_config(collectives);
  if (ranks > 1) {
    job.gradient_communicator = create_communicator(
        manager, parse_backend(config.distributed.backend), manager.device(), "gradients");
  }
  Communicator* gradient_communicator = job.gradient_communicator.get();

  if (config.distributed.sync_bn && ranks > 1) {
    int64_t converted = convert_sync_batchnorm(model, *gradient_communicator);
    if (manager.is_main_process()) {
      std::printf("mpigrad train: %lld BatchNorm layer(s) synchronized across ranks\n",
                  static_cast<long long>(converted));
    }
  }

  std::unique_ptr<nn::Optimizer> optimizer;
  if (config.optim.name == "sgd") {
    optimizer = std::make_unique<nn::SGD>(
        model.parameters(), nn::SGDOptions{.lr = config.optim.lr, .momentum = config.optim.momentum,
                                           .weight_decay = config.optim.weight_decay});
  } else {
    nn::AdamOptions options;
    options.lr = config.optim.lr;
    options.weight_decay = config.optim.weight_decay;
    optimizer = std::make_unique<nn::AdamW>(model.parameters(), options);
  }

  data::DataLoaderOptions train_options;
  train_options.batch_size = config.train.batch_size;
  train_options.shuffle = config.train.shuffle;
  train_options.seed = config.train.seed;
  train_options.num_workers = 1;  // one thread reads ahead; compute keeps the cores
  train_options.transform = input_transform(config);
  data::DataLoader train_loader(job.train_set, train_options);

  std::unique_ptr<data::DataLoader> test_loader;
  if (job.test_set && !config.dry_run) {
    data::DataLoaderOptions test_options;
    test_options.batch_size = 256;
    test_options.num_replicas = ranks;  // a DistributedSampler without shuffle, padded
    test_options.rank = rank;
    test_options.transform = input_transform(config);
    test_loader = std::make_unique<data::DataLoader>(job.test_set, test_options);
  }

  int64_t max_steps = config.dry_run ? 1 : config.train.max_steps;
  std::unique_ptr<nn::LRScheduler> scheduler;
  if (config.sched.name == "cosine") {
    scheduler = std::make_unique<nn::WarmupCosineLR>(*optimizer, config.sched.warmup_steps,
                                                     job.total_steps);
  }

  std::string out_dir = config.dry_run ? "" : config.train.out_dir;
  DdpOptions ddp;
  ddp.bucket_cap_mb = config.distributed.bucket_cap_mb;
  ddp.find_unused_parameters = config.distributed.find_unused_parameters;
  ddp.compression = parse_grad_compression(config.distributed.compression);
  ddp.shared_memory = config.distributed.shared_memory;
  ddp.timeout_seconds = config.distributed.timeout_s;
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
  auto logging = std::make_shared<LoggingHook>(out_dir, config.train.log_every);
  hooks.push_back(logging);

  if (manager.is_main_process()) {
    if (!out_dir.empty()) {
      std::filesystem::create_directories(out_dir);
      write_atomically((std::filesystem::path(out_dir) / "config.ini").string(),
                       config.resolved_text());
    }
    std::printf("mpigrad train: %s, %lld parameters, %lld training samples on %lld rank(s), "
                "batch %lld per rank, %lld steps per epoch\n",
                config.model.name.c_str(), static_cast<long long>(model.num_parameters()),
                static_cast<long long>(job.train_set->size()), static_cast<long long>(ranks),
                static_cast<long long>(config.train.batch_size),
                static_cast<long long>(job.steps_per_epoch));
    std::fflush(stdout);
  }

  nn::CrossEntropyLoss loss;
  const std::string labels = config.data.y;
  TrainingStrategy strategy(
      {&model}, {optimizer.get()},
      [&](const core::Tensor& output, const data::Batch& batch) {
        return loss(output, batch[labels].to(core::kInt64));
      },
      manager, hooks, config.dry_run ? 1 : config.train.epochs, max_steps);
  strategy.run(train_loader, test_loader.get());

  if (manager.is_main_process()) {
    if (config.dry_run) {
      std::printf("mpigrad train: dry run passed (config, data, model and one step)\n");
    } else {
      const auto& metrics = strategy.context().metrics;
      auto accuracy = metrics.find("val_accuracy");
      std::printf("mpigrad train: done after %lld epoch(s), %lld steps; throughput %.0f samples/s",
                  static_cast<long long>(strategy.context().epoch + 1),
                  static_cast<long long>(strategy.context().step), logging->samples_per_second());
      if (accuracy != metrics.end()) std::printf("; test accuracy %.4f", accuracy->second);
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int run_train_command(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  DistributedManager manager = DistributedManager::initialize();
  const int rank = manager.rank(), ranks = manager.world_size();

  // Phase 1: every rank checks, then all agree on the outcome.
  std::optional<TrainingJob> job;
  std::string error;
  try {
    job = check_job(args, ranks);
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
