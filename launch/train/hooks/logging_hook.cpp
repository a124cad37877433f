#include "mpigrad/launch/train/hooks/logging_hook.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/observe/event_file_writer.h"

namespace mpigrad::launch {

namespace {
std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  std::ostringstream out;
  out.precision(8);
  out << value;
  return out.str();
}
}  // namespace

std::string tensorboard_tag(const std::string& metric) {
  if (metric.starts_with("test_")) return "test/" + metric.substr(5);
  return "train/" + metric;
}

LoggingHook::LoggingHook(std::string out_dir, int64_t every, bool tensorboard)
    : Hook(1),
      out_dir_(std::move(out_dir)),
      log_every_(every < 1 ? 1 : every),
      tensorboard_wanted_(tensorboard) {}

LoggingHook::~LoggingHook() = default;

std::string LoggingHook::tensorboard_path() const {
  return tensorboard_ ? tensorboard_->path() : std::string();
}

void LoggingHook::write_record(const std::vector<std::pair<std::string, int64_t>>& counters,
                               const std::vector<std::pair<std::string, double>>& scalars,
                               int64_t step) {
  if (metrics_.is_open()) {
    std::string json;
    for (const auto& [name, value] : counters) {
      json += (json.empty() ? "{\"" : ", \"") + name + "\": " + std::to_string(value);
    }
    for (const auto& [name, value] : scalars) {
      json += (json.empty() ? "{\"" : ", \"") + name + "\": " + json_number(value);
    }
    metrics_ << json << "}\n";
    metrics_.flush();
  }
  if (tensorboard_) {
    std::vector<TensorBoardScalar> values;
    for (const auto& [name, value] : scalars) values.push_back({tensorboard_tag(name), value});
    tensorboard_->add_scalars(step, values);
  }
}

double LoggingHook::samples_per_second() const {
  return train_seconds_ > 0 ? double(samples_) / train_seconds_ : 0.0;
}

void LoggingHook::setup(TrainingContext& context) {
  DistributedManager& manager = *context.manager;
  main_process_ = manager.is_main_process();
  // Launchers hand ranks a pseudo-terminal even when mpirun's own output is a pipe or a log
  // file, so the bar is drawn only for a plain ./program on a terminal, or when
  // MPIGRAD_PROGRESS_BAR=1 asks for it.
  const char* forced = std::getenv("MPIGRAD_PROGRESS_BAR");
  bool launched = manager.launcher() != Launcher::SingleProcess;
  tty_ = main_process_ && isatty(fileno(stdout)) &&
         (forced != nullptr ? std::string(forced) == "1" : !launched);
  if (main_process_ && !out_dir_.empty()) {
    std::filesystem::create_directories(out_dir_);
    std::string path = (std::filesystem::path(out_dir_) / "metrics.jsonl").string();
    // A resumed run appends to the metrics of the run it continues.
    metrics_.open(path, context.step > 0 || context.epoch > 0 ? std::ios::app : std::ios::trunc);
    MPIGRAD_CHECK(metrics_.good(), "LoggingHook: cannot write ", path);
    // A resumed run adds a file of its own; TensorBoard reads every file of the folder.
    if (tensorboard_wanted_) {
      tensorboard_ =
          std::make_unique<EventFileWriter>((std::filesystem::path(out_dir_) / "tb").string());
    }
  }
}

void LoggingHook::log_step(TrainingContext& context) {
  DistributedManager& manager = *context.manager;
  using clock = std::chrono::steady_clock;
  if (context.step % log_every_ != 0) return;
  // Every rank takes part: the logged loss is the mean over ranks of their mean losses.
  const double loss_sum = loss_sum_.defined() ? loss_sum_.item<double>() : 0.0;
  core::Tensor stats = core::Tensor::from_vector<double>(
      {loss_sum, double(loss_count_), double(samples_since_log_)}, {3});
  manager.world().all_reduce(stats, ReduceOp::Sum);
  std::vector<double> totals = stats.to_vector<double>();
  auto now = clock::now();
  double seconds = std::chrono::duration<double>(now - last_log_).count();
  double rate = seconds > 0 ? totals[2] / seconds : 0.0;
  double loss = totals[1] > 0 ? totals[0] / totals[1] : 0.0;
  double lr = context.optimizers.empty() ? 0.0 : context.optimizer().param_groups()[0].lr;
  if (main_process_) {
    write_record({{"step", context.step}, {"epoch", context.epoch}},
                 {{"loss", loss}, {"lr", lr}, {"samples_per_s", rate}}, context.step);
    int64_t batches = context.train_loader ? context.train_loader->size() : 0;
    std::printf(
        tty_ ? "\repoch %lld  step %lld  batch %lld/%lld  loss %.4f  lr %.4g  %.0f samples/s  "
             : "epoch %lld  step %lld  batch %lld/%lld  loss %.4f  lr %.4g  %.0f samples/s\n",
        static_cast<long long>(context.epoch), static_cast<long long>(context.step),
        static_cast<long long>(context.batch_in_epoch + 1), static_cast<long long>(batches), loss,
        lr, rate);
    std::fflush(stdout);
  }
  loss_sum_ = core::Tensor();
  loss_count_ = 0;
  samples_ += int64_t(totals[2]);
  train_seconds_ += seconds;
  samples_since_log_ = 0;
  last_log_ = now;
}

void LoggingHook::log_validation(TrainingContext& context) {
  if (!main_process_) return;
  // test_<metric> for every val_<metric>, the loss first.
  std::vector<std::pair<std::string, double>> shown;
  for (const auto& [name, value] : context.metrics) {
    if (!name.starts_with("val_") || name == "val_samples") continue;
    std::string metric = "test_" + name.substr(4);
    if (metric == "test_loss") {
      shown.insert(shown.begin(), {metric, value});
    } else {
      shown.emplace_back(metric, value);
    }
  }
  std::string text = "epoch " + std::to_string(context.epoch);
  for (const auto& [metric, value] : shown) {
    char number[32];
    std::snprintf(number, sizeof(number), "%.4f", value);
    text += "  " + metric + " " + number;
  }
  write_record({{"epoch", context.epoch}}, shown, context.step);
  if (tensorboard_) tensorboard_->flush();
  auto samples = context.metrics.find("val_samples");
  std::printf("%s  (%.0f samples)\n", text.c_str(),
              samples != context.metrics.end() ? samples->second : 0.0);
  std::fflush(stdout);
}

void LoggingHook::on(HookStage stage, TrainingContext& context) {
  using clock = std::chrono::steady_clock;
  switch (stage) {
    case HookStage::Setup:
      setup(context);
      break;
    case HookStage::BeforeEpoch:
      last_log_ = clock::now();
      start_ = last_log_;
      break;
    case HookStage::AfterLoss: {
      core::NoGradGuard no_grad;
      core::Tensor loss = context.loss.detach().reshape({});
      loss_sum_ = loss_sum_.defined() ? loss_sum_ + loss : loss.to(core::kFloat64);
      ++loss_count_;
      // Counted per micro-batch, not as batch x accumulation_steps at the step: that product is
      // the config's and may overflow, and an epoch's last accumulation may be short.
      samples_since_log_ += context.batch->size();
      break;
    }
    case HookStage::AfterOptimizerStep:
      log_step(context);
      break;
    case HookStage::AfterEpoch: {
      // Count the tail since the last log in the throughput without another collective.
      double seconds = std::chrono::duration<double>(clock::now() - last_log_).count();
      samples_ += samples_since_log_ * context.manager->world_size();
      train_seconds_ += seconds;
      samples_since_log_ = 0;
      if (tty_) std::printf("\n");
      if (tensorboard_) tensorboard_->flush();
      break;
    }
    case HookStage::AfterValidation:
      log_validation(context);
      break;
    case HookStage::AfterTraining:
      if (tensorboard_) tensorboard_->close();
      break;
    default:
      break;
  }
}

}  // namespace mpigrad::launch
