// One run, built in one place from a TrainConfig, for every entry point: `mpigrad train`,
// `lr-find`, `swa` and `embed`, and the embedded models of the C API and the Fortran module. It
// builds the model on the rank's device, its gradient communicator and SyncBatchNorm, the
// optimizer, the scheduler, the loaders, the hooks and the TrainingStrategy that drives them, so
// a training feature ([train] grad_accum_steps, clip_grad_norm, precision, ema_decay,
// [distributed] zero, ...) is read from the config here and nowhere else. With [loss] name =
// energy_force the model is an interatomic potential and the step and evaluation are
// launch/train/atomistic_steps.h's (the neighbor list of [graph] comes in RunInputs::inputs).
//
// What a kind of run takes of the config:
//   Train     everything: both loaders, checkpoints (resume, keep, preemption), every hook the
//             config asks for, logging, the trace, the profile and SWA's final average; a dry
//             run takes one step and writes nothing
//   LrFind    the training loader, DDP, accumulation and clipping, and the caller's sweep hook;
//             no schedule, checkpoint or log (lr-find writes its own curve)
//   Embedded  no loaders and no files: the host hands in each batch (TrainingStrategy's
//             train_batch) and saves when it chooses; DDP, ZeRO-1, the schedule, accumulation,
//             loss scaling, clipping and CUDA graphs
//   Evaluate  the model on its device and evaluation loaders only (swa, embed)
// Each subcommand is then: parse, check (launch/commands/checked_run.h), build the run, run it,
// report.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mpigrad/core/shape.h"
#include "mpigrad/data/data_loader.h"
#include "mpigrad/data/dataset.h"
#include "mpigrad/launch/config/train_config.h"
#include "mpigrad/launch/config/train_setup.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/train/hook.h"
#include "mpigrad/launch/train/training_strategy.h"

namespace mpigrad::launch {

struct OpProfileReport;

enum class RunKind : uint8_t { Train, LrFind, Embedded, Evaluate };

// Evaluation reads the test set in batches of this many samples per rank.
constexpr int64_t kTestBatchSize = 256;

// What a run is made of besides its config, checked by the caller first (mpigrad's checking
// phase, or the embedded model's).
struct RunInputs {
  std::shared_ptr<nn::Module> model;  // built on the host, from the config's seed
  // Null without data: the embedded models', and [data] test when not given.
  std::shared_ptr<data::Dataset> train_set, test_set;
  InputTransform inputs;     // what the model sees of [data] x
  core::Shape sample_shape;  // one sample of the model's (first) input
  int64_t outputs = 0;       // the classes (a second instance of the model needs them)
  int64_t total_steps = 0;   // optimizer steps of the whole run (the schedule's length); 0: open
  // Null: the config's step and evaluation ([loss] name and [train] stage on [data] x and y).
  // Either way the step runs under [train] precision's autocast.
  StepFunction step;
  EvalFunction evaluate;
  std::vector<std::shared_ptr<Hook>> extra_hooks;  // the caller's own (lr-find's sweep)
  // [train] time_limit counts from here; unset: from the run's setup.
  std::chrono::steady_clock::time_point started{};
};

class Run {
 public:
  // Collective: every rank builds the same run (the communicator, SyncBatchNorm). Nothing is
  // trained yet, and no hook has run. On the manager's device.
  Run(TrainConfig config, RunInputs inputs, DistributedManager& manager, RunKind kind);
  // On `device`; `manager` may be null for an embedded model of one process without MPI.
  Run(TrainConfig config, RunInputs inputs, DistributedManager* manager, core::Device device,
      RunKind kind);
  ~Run();
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  // Train and LrFind: the epochs of the config (a dry run: one step), then, for Train, the
  // merged trace, the per-op profile ([train] profile: rank 0 prints it) and SWA's average.
  // Returns whether the run was preempted (stopped to resume).
  bool train();

  // A loader over `dataset` for evaluation: each rank its padded share, in order, with the
  // input transform, on the rank's device.
  std::unique_ptr<data::DataLoader> evaluation_loader(std::shared_ptr<data::Dataset> dataset,
                                                      int64_t batch_size) const;
  // The loaders' reader threads ([data] read_ahead; train_setup.h's loader_workers).
  int loader_workers() const;

  const TrainConfig& config() const { return config_; }
  RunKind kind() const { return kind_; }
  DistributedManager& manager();  // throws for a run without one
  core::Device device() const { return device_; }
  nn::Module& model() { return *model_; }
  std::shared_ptr<nn::Module> shared_model() { return model_; }
  nn::Optimizer* optimizer() { return optimizer_.get(); }
  nn::LRScheduler* scheduler() { return scheduler_.get(); }
  data::DataLoader* train_loader() { return train_loader_.get(); }
  data::DataLoader* test_loader() { return test_loader_.get(); }
  const RunInputs& inputs() const { return inputs_; }
  // Null for Evaluate.
  TrainingStrategy& strategy();
  const TrainingStrategy& strategy() const;
  // The run's hook of type H, or null.
  template <typename H>
  H* hook() const {
    for (const auto& hook : hooks_) {
      if (auto* found = dynamic_cast<H*>(hook.get())) return found;
    }
    return nullptr;
  }

 private:
  void prepare_model();
  void make_loaders();
  void add_hooks();
  void make_strategy();
  // The end of in-training SWA: the average in a second instance of the model, BatchNorm
  // recomputed over the training data, evaluated, written to out_dir/swa.h5.
  void finish_swa();
  // A dry run reads the test loader's first batch: a test file that would fail the run fails
  // the dry run.
  void read_first_test_batch();
  // Rank 0: the profile's table on stdout, and its JSON file when [train] profile_json is set.
  void report_profile(const OpProfileReport& profile) const;
  int world_size() const;
  bool is_main_process() const;

  TrainConfig config_;
  RunInputs inputs_;
  DistributedManager* manager_;
  core::Device device_;
  RunKind kind_;
  // Members are destroyed last to first: the gradient communicator outlives the model
  // (SyncBatchNorm layers refer to it, and the gradient buckets' memory was used on its
  // stream), and the strategy and hooks go before the scheduler and optimizer they step.
  std::unique_ptr<Communicator> gradient_communicator_;  // null on one rank
  std::shared_ptr<nn::Module> model_;
  std::unique_ptr<nn::Optimizer> optimizer_;    // null for Evaluate
  std::unique_ptr<nn::LRScheduler> scheduler_;  // null: none
  std::unique_ptr<data::DataLoader> train_loader_, test_loader_;
  std::vector<std::shared_ptr<Hook>> hooks_;
  std::unique_ptr<TrainingStrategy> strategy_;
};

}  // namespace mpigrad::launch
