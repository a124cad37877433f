#include "mpigrad/launch/commands/swa_command.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/data/data_loader.h"
#include "mpigrad/launch/commands/checked_run.h"
#include "mpigrad/launch/commands/subcommand.h"
#include "mpigrad/launch/config/run.h"
#include "mpigrad/launch/config/train_setup.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/train/swa.h"
#include "mpigrad/nn/checkpoint.h"

namespace mpigrad::launch {

namespace {

constexpr const char* kUsage =
    "usage: mpigrad swa --config FILE.ini --checkpoints A.h5,B.h5,... [-o OUT.h5]\n"
    "                   [--section.key=value ...]\n\n"
    "Averages the weights of the checkpoints (written by mpigrad train with the same [model]),\n"
    "recomputes the BatchNorm statistics with one pass over [data] train, evaluates the\n"
    "averaged model on [data] test, and writes it as a checkpoint.\n\n"
    "  --checkpoints LIST   comma-separated checkpoints to average (required)\n"
    "  -o, --output FILE    where to write the averaged model (default: [train] out_dir/swa.h5)\n"
    "  --config FILE        the training config: its [model], [data] and [train] batch_size\n"
    "                       are used; the keys of mpigrad train --help apply\n";

std::vector<std::string> split_paths(const std::string& list) {
  std::vector<std::string> paths;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) paths.push_back(item);
  }
  return paths;
}

struct SwaJob {
  CheckedRun run;
  std::vector<std::string> checkpoints;
  std::string output;
};

SwaJob check_swa(std::vector<std::string> args, int64_t rank, int64_t ranks) {
  SwaJob job;
  std::optional<std::string> checkpoints = take_option(args, "checkpoints");
  std::optional<std::string> output = take_option(args, "output", "-o");
  job.run = check_run(args, rank, ranks);
  const TrainConfig& config = job.run.config;
  MPIGRAD_CHECK(checkpoints.has_value(),
                "--checkpoints: required (a comma-separated list of "
                "checkpoints to average)");
  job.checkpoints = split_paths(*checkpoints);
  MPIGRAD_CHECK(!job.checkpoints.empty(), "--checkpoints: the list is empty");
  for (const std::string& path : job.checkpoints) {
    MPIGRAD_CHECK(std::filesystem::is_regular_file(path), "--checkpoints: file '", path,
                  "' does not exist");
  }
  job.output = output.value_or((std::filesystem::path(config.train.out_dir) / "swa.h5").string());
  MPIGRAD_CHECK(!job.output.empty(), "-o: the output path is empty");
  // The average is evaluated as a classifier: a supervised model, or a stage-2 encoder + head
  // (whose checkpoints name encoder.* and head.*); a SupCon model has no classes to score.
  MPIGRAD_CHECK(config.loss.name == LossKind::CrossEntropy,
                "[loss] name = ", core::enum_name(config.loss.name, kLossKindNames),
                ": swa evaluates classifiers (cross_entropy)");
  MPIGRAD_CHECK(config.train.stage != StageKind::SupCon,
                "[train] stage = supcon: swa averages "
                "classifiers (stage = supervised or classifier)");
  // Checked here, in the checking phase, so a mismatched checkpoint stops every rank cleanly.
  // Every tensor of check_run's model is replaced (a classifier's init_from encoder too).
  load_averaged_checkpoints(job.checkpoints, *job.run.model);
  return job;
}

int swa(SwaJob& job, DistributedManager& manager) {
  const TrainConfig& config = job.run.config;
  const int64_t ranks = manager.world_size();
  Run run(config, job.run.run_inputs(), manager, RunKind::Evaluate);
  nn::Module& model = run.model();
  // A padded DistributedSampler: equal batches per rank.
  data::DataLoader& train_loader = *run.train_loader();
  recompute_bn_statistics(model, train_loader, config.data.x, manager);
  std::map<std::string, double> metrics;
  if (run.test_loader() != nullptr) {
    metrics = evaluate_classifier(model, *run.test_loader(), config.data.x, config.data.y, manager);
  }
  if (manager.is_main_process()) {
    const std::filesystem::path output(job.output);
    if (output.has_parent_path()) std::filesystem::create_directories(output.parent_path());
    nn::save_checkpoint(job.output, model, nullptr, nullptr, 0, 0, ranks, config.resolved_text());
    std::printf(
        "mpigrad swa: averaged %zu checkpoint(s); BatchNorm statistics recomputed over "
        "%lld training batch(es) per rank",
        job.checkpoints.size(), static_cast<long long>(train_loader.size()));
    if (!metrics.empty()) {
      std::printf("; test loss %.4f; test accuracy %.4f", metrics["val_loss"],
                  metrics["val_accuracy"]);
    }
    std::printf("; wrote %s\n", job.output.c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int run_swa_command(int argc, char** argv) {
  SwaJob job;
  return run_subcommand(
      argc, argv, "mpigrad swa", kUsage,
      [&](DistributedManager& manager, const std::vector<std::string>& args) {
        job = check_swa(args, manager.rank(), manager.world_size());
      },
      [&](DistributedManager& manager) { return swa(job, manager); });
}

}  // namespace mpigrad::launch
