#include "mpigrad/launch/commands/lr_find_command.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "mpigrad/core/atomic_file.h"
#include "mpigrad/core/error.h"
#include "mpigrad/launch/commands/checked_run.h"
#include "mpigrad/launch/commands/subcommand.h"
#include "mpigrad/launch/config/run.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/train/hooks/lr_finder_hook.h"
#include "mpigrad/launch/train/lr_finder.h"

namespace mpigrad::launch {

namespace {

constexpr const char* kUsage =
    "usage: mpigrad lr-find --config FILE.ini [--start 1e-7] [--end 10] [--steps 100]\n"
    "                       [--output lr_find.csv] [--section.key=value ...]\n\n"
    "The learning-rate range test: optimizer step i of N runs at start * (end/start)^(i/(N-1))\n"
    "on the config's model, training data and optimizer. The loss is smoothed (moving average,\n"
    "beta 0.98, bias-corrected) and the sweep stops once the smoothed loss exceeds 4x its\n"
    "minimum. Writes step,lr,loss,smoothed_loss per step and prints the suggested lr: the\n"
    "steepest descent of the smoothed loss against log(lr), leaving out the first 10 and last 5\n"
    "points. Writes nothing else; no checkpoint is read or changed.\n";

struct LRFindJob {
  CheckedRun run;
  LRFinderSettings settings;
  std::string output = "lr_find.csv";
};

double number_option(std::vector<std::string>& args, const std::string& name, double fallback) {
  std::optional<std::string> text = take_option(args, name);
  if (!text) return fallback;
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(*text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  MPIGRAD_CHECK(used == text->size() && !text->empty() && std::isfinite(value), "--", name,
                ": expected a number, got '", *text, "'");
  return value;
}

LRFindJob check_lr_find(std::vector<std::string> args, int64_t rank, int64_t ranks) {
  LRFindJob job;
  job.settings.start_lr = number_option(args, "start", job.settings.start_lr);
  job.settings.end_lr = number_option(args, "end", job.settings.end_lr);
  const double steps = number_option(args, "steps", double(job.settings.steps));
  MPIGRAD_CHECK(steps == std::floor(steps) && steps >= 2 && steps <= 1e9,
                "--steps: expected "
                "an integer >= 2, got ",
                steps);
  job.settings.steps = int64_t(steps);
  job.output = take_option(args, "output").value_or(job.output);
  MPIGRAD_CHECK(!job.output.empty(), "--output: the path is empty");
  LRFinder check(job.settings);  // throws on a bad range
  // The sweep replaces [sched]: it is not checked against a run it will not make.
  bool sched_given = false;
  for (const std::string& arg : args) sched_given = sched_given || arg.starts_with("--sched.name");
  if (!sched_given) args.push_back("--sched.name=none");
  job.run = check_run(args, rank, ranks);
  const TrainConfig& config = job.run.config;
  // The sweep trains the supervised classifier with cross-entropy; another stage's model and
  // loss would be swept as something it is not.
  MPIGRAD_CHECK(config.train.stage == StageKind::Supervised,
                "[train] stage = ", core::enum_name(config.train.stage, kStageKindNames),
                ": lr-find sweeps stage = supervised only");
  return job;
}

void write_curve(const std::string& path, const LRFinder& finder) {
  core::write_file_atomically(path, [&](std::ostream& out) {
    out.precision(9);
    out << "step,lr,loss,smoothed_loss\n";
    const auto& points = finder.points();
    for (size_t i = 0; i < points.size(); ++i) {
      out << i << ',' << points[i].lr << ',' << points[i].loss << ',' << points[i].smoothed_loss
          << '\n';
    }
  });
}

int lr_find(LRFindJob& job, DistributedManager& manager) {
  TrainConfig config = job.run.config;
  // The sweep runs in the run's precision (the best lr may differ in bf16), except fp16: that
  // needs the loss scaler, whose skipped steps would spoil the sweep, so fp16 sweeps in fp32.
  if (config.train.precision == nn::Precision::Float16) {
    config.train.precision = nn::Precision::Float32;
  }
  const int64_t steps = job.settings.steps;
  config.train.epochs = (steps + job.run.steps_per_epoch - 1) / job.run.steps_per_epoch;
  config.train.max_steps = steps;
  auto finder = std::make_shared<LRFinderHook>(job.settings);
  RunInputs inputs = job.run.run_inputs();
  job.run.model.reset();  // the run owns it now
  inputs.extra_hooks.push_back(finder);
  Run run(config, std::move(inputs), manager, RunKind::LrFind);
  if (manager.is_main_process()) {
    std::printf(
        "mpigrad lr-find: %lld steps from lr %g to %g (%lld epoch(s) of %lld steps), "
        "%lld rank(s), batch %lld per rank\n",
        static_cast<long long>(steps), job.settings.start_lr, job.settings.end_lr,
        static_cast<long long>(config.train.epochs),
        static_cast<long long>(job.run.steps_per_epoch),
        static_cast<long long>(manager.world_size()),
        static_cast<long long>(config.train.batch_size));
    std::fflush(stdout);
  }
  run.train();

  if (manager.is_main_process()) {
    const LRFinder& curve = finder->finder();
    write_curve(job.output, curve);
    const auto& points = curve.points();
    size_t best = 0;
    for (size_t i = 0; i < points.size(); ++i) {
      if (points[i].smoothed_loss < points[best].smoothed_loss) best = i;
    }
    std::printf(
        "mpigrad lr-find: %zu step(s)%s; minimum smoothed loss %.4f at lr %.3g; "
        "wrote %s\n",
        points.size(),
        curve.diverged() ? ", stopped early: the smoothed loss exceeded 4x "
                           "its minimum"
                         : "",
        points.empty() ? 0.0 : points[best].smoothed_loss, points.empty() ? 0.0 : points[best].lr,
        job.output.c_str());
    const LRSuggestion suggestion = suggest_lr(points);
    if (suggestion.found) {
      std::printf(
          "mpigrad lr-find: suggested lr %.3g (steepest descent of the smoothed loss "
          "against log(lr), step %lld; the minimum's lr / 10 is %.3g)\n",
          suggestion.lr, static_cast<long long>(suggestion.index), points[best].lr / 10);
    } else {
      std::printf(
          "mpigrad lr-find: too few steps for a suggestion; use more --steps or a "
          "smaller --start\n");
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int run_lr_find_command(int argc, char** argv) {
  LRFindJob job;
  return run_subcommand(
      argc, argv, "mpigrad lr-find", kUsage,
      [&](DistributedManager& manager, const std::vector<std::string>& args) {
        job = check_lr_find(args, manager.rank(), manager.world_size());
      },
      [&](DistributedManager& manager) { return lr_find(job, manager); });
}

}  // namespace mpigrad::launch
