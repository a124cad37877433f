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
#include "mpigrad/launch/commands/checked_run.h"
#include "mpigrad/launch/commands/subcommand.h"
#include "mpigrad/launch/config/run.h"
#include "mpigrad/launch/config/train_config.h"
#include "mpigrad/launch/config/train_setup.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/train/atomistic_steps.h"
#include "mpigrad/launch/train/hooks/checkpoint_hook.h"
#include "mpigrad/launch/train/hooks/logging_hook.h"
#include "mpigrad/launch/train/hooks/preemption_hook.h"
#include "mpigrad/launch/train/preemption.h"

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

// The same for atomic structures: the first batch's structures, atoms, edges and targets.
void describe_first_atomic_batch(const CheckedRun& run) {
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < std::min(run.config.train.batch_size, run.train_set->size()); ++i) {
    indices.push_back(i);
  }
  data::Batch batch = run.train_set->get_batch(indices);
  if (run.inputs.transform) batch = run.inputs.transform(std::move(batch));
  const std::vector<double> energy = batch["energy"].to(core::kFloat64).to_vector<double>();
  const std::vector<double> atoms =
      atoms_per_structure(batch).to(core::kFloat64).to_vector<double>();
  double lo = energy[0] / atoms[0], hi = lo, total_atoms = 0;
  for (size_t i = 0; i < energy.size(); ++i) {
    lo = std::min(lo, energy[i] / atoms[i]);
    hi = std::max(hi, energy[i] / atoms[i]);
    total_atoms += atoms[i];
  }
  std::printf(
      "mpigrad train: first batch: %lld structures, %.0f atoms, %lld edges; energy per atom "
      "%.4g to %.4g",
      static_cast<long long>(batch.size()), total_atoms,
      static_cast<long long>(batch.has("edge_index") ? batch["edge_index"].size(1) : 0), lo, hi);
  if (batch.has("forces")) {
    const std::vector<double> forces = batch["forces"].to(core::kFloat64).to_vector<double>();
    double largest = 0;
    for (double f : forces) largest = std::max(largest, std::abs(f));
    std::printf("; largest force component %.4g", largest);
  }
  std::printf("\n");
}

// What an energy_force run trains on, in one line.
std::string describe_energy_force(const TrainConfig& config) {
  const LossSection& loss = config.loss;
  std::ostringstream text;
  text << core::enum_name(loss.kind, kErrorKindNames);
  if (loss.kind == ErrorKind::Huber) text << " (delta " << loss.huber_delta << ")";
  text << " of energy" << (loss.per_atom_energy ? " per atom" : "") << " x " << loss.energy_weight
       << ", forces x " << loss.force_weight << ", stress x " << loss.stress_weight;
  if (loss.switch_step > 0) {
    const EnergyForceWeights after = energy_force_options(loss).weights_at(loss.switch_step);
    text << "; from step " << loss.switch_step << ": " << after.energy << ", " << after.force
         << ", " << after.stress;
  }
  return text.str();
}

// Rank 0 writes out_dir/config.ini (the resolved configuration) and prints what will run.
void report_start(const CheckedRun& run, Run& training, DistributedManager& manager) {
  if (!manager.is_main_process()) return;
  const TrainConfig& config = run.config;
  const nn::Module& model = training.model();
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
  if (is_atomistic(config)) {
    const std::string potential = model.type_name() + "(" + model.extra_repr() + ")";
    std::printf("mpigrad train: interatomic potential %s; %s; loss %s\n", potential.c_str(),
                run.inputs.description.c_str(), describe_energy_force(config).c_str());
  } else if (config.loss.name == LossKind::CrossEntropy) {
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
  if (config.dry_run) {
    if (is_atomistic(config)) {
      describe_first_atomic_batch(run);
    } else {
      describe_first_batch(run);
    }
  }
  std::fflush(stdout);
}

// Rank 0's last line: the dry run's verdict, or the run's length, speed and test metrics.
void report_end(const CheckedRun& run, Run& training, DistributedManager& manager) {
  if (!manager.is_main_process()) return;
  const TrainingContext& context = training.strategy().context();
  if (run.config.dry_run) {
    std::printf("mpigrad train: dry run passed (config, data, model and one step%s)\n",
                training.test_loader() ? "; the test loader's first batch" : "");
  } else {
    const auto& metrics = context.metrics;
    auto accuracy = metrics.find("val_accuracy");
    std::printf("mpigrad train: done after %lld epoch(s), %lld steps; throughput %.0f samples/s",
                static_cast<long long>(context.epoch + 1), static_cast<long long>(context.step),
                training.hook<LoggingHook>()->samples_per_second());
    if (accuracy != metrics.end()) std::printf("; test accuracy %.4f", accuracy->second);
    auto energy = metrics.find("val_energy_mae_per_atom");
    if (energy != metrics.end()) std::printf("; test energy MAE %.4g per atom", energy->second);
    auto force_mae = metrics.find("val_force_mae"), force_rmse = metrics.find("val_force_rmse");
    if (force_mae != metrics.end() && force_rmse != metrics.end()) {
      std::printf(", force MAE %.4g, RMSE %.4g", force_mae->second, force_rmse->second);
    }
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
void report_preempted(Run& training, DistributedManager& manager) {
  if (!manager.is_main_process()) return;
  const TrainingContext& context = training.strategy().context();
  const std::string& saved = training.hook<CheckpointHook>()->preempted_checkpoint();
  std::printf(
      "mpigrad train: preempted (%s) in epoch %lld after step %lld; %s; exit status %d: run "
      "again with [train] resume = auto to continue\n",
      training.hook<PreemptionHook>()->reason().c_str(), static_cast<long long>(context.epoch + 1),
      static_cast<long long>(context.step),
      saved.empty() ? "no out_dir, so no checkpoint" : ("saved " + saved).c_str(),
      kPreemptedExitStatus);
  std::fflush(stdout);
}

// The training phase; any exception escapes to run_subcommand, which ends the job.
int train(CheckedRun& checked, DistributedManager& manager,
          std::chrono::steady_clock::time_point started) {
  RunInputs inputs = checked.run_inputs();
  checked.model.reset();  // the run owns it now
  inputs.started = started;
  Run run(checked.config, std::move(inputs), manager, RunKind::Train);
  report_start(checked, run, manager);
  if (run.train()) {
    report_preempted(run, manager);
    return kPreemptedExitStatus;
  }
  report_end(checked, run, manager);
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
