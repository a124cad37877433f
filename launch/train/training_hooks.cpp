#include "mpigrad/launch/train/training_hooks.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/crc32c.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/data/multi_dataset.h"
#include "mpigrad/data/sampler.h"
#include "mpigrad/launch/observe/event_file_writer.h"
#include "mpigrad/launch/observe/timeline.h"
#include "mpigrad/nn/checkpoint.h"
#include "mpigrad/nn/optim/clip_grad.h"

namespace mpigrad::launch {

// ---- DDPHook -----------------------------------------------------------------------------------

DDPHook::DDPHook(DdpOptions options, DistributedSamplerSettings sampler,
                 BatchSamplerFactory custom_sampler, Communicator* communicator)
    : options_(options),
      sampler_(sampler),
      custom_sampler_(std::move(custom_sampler)),
      communicator_(communicator) {}

DDPHook::~DDPHook() = default;

void DDPHook::on(HookStage stage, TrainingContext& context) {
  DistributedManager& manager = *context.manager;
  if (manager.world_size() == 1) return;  // one process: plain training
  if (stage == HookStage::Setup) {
    nn::Module& model = context.model();
    for (auto& [name, tensor] : model.named_parameters()) {
      MPIGRAD_CHECK(tensor.device() == manager.device(), "DDPHook: parameter '", name, "' is on ",
                    tensor.device(), " but this rank's device is ", manager.device(),
                    "; move the model with to() before building the optimizer");
    }
    // The module form: frozen parameters are checked and broadcast from rank 0 too.
    Communicator& communicator = communicator_ ? *communicator_ : manager.world();
    ddp_ = std::make_unique<DistributedDataParallel>(model, communicator, options_);
    ddp_->set_timeline(context.timeline);
    context.ddp = ddp_.get();
    if (options_.zero) {
      MPIGRAD_CHECK(context.optimizers.size() == 1,
                    "[distributed] zero = 1 needs exactly one "
                    "optimizer, got ",
                    context.optimizers.size());
      // A checkpoint resumed before this point left its state in the optimizer: taken over here.
      zero_ = std::make_unique<ZeroRedundancyOptimizer>(*ddp_, context.optimizer());
      context.zero = zero_.get();
    }
    if (manager.is_main_process()) {
      std::printf("gradients: %d bucket(s) %s%s\n", ddp_->bucket_count(),
                  ddp_->transport_description().c_str(),
                  options_.zero ? "; ZeRO-1: reduce-scattered, optimizer state sharded" : "");
    }
    if (context.train_loader != nullptr) {
      install_sampler(*context.train_loader, manager.world_size(), manager.rank());
    }
  } else if (stage == HookStage::BeforeForward) {
    ddp_->prepare_for_backward();
  } else if (stage == HookStage::AfterOptimizerStep && context.step == 1 &&
             manager.is_main_process() && !context.optimizers.empty()) {
    // What ZeRO-1 saves, measured where it lives (docs/mixed-precision-and-zero.md's figures come
    // from this line).
    int64_t bytes = 0;
    if (zero_) {
      bytes = zero_->state_bytes();
    } else {
      for (const auto& entry : context.optimizer().state_dict().tensors()) {
        bytes += entry.second.numel() * int64_t(entry.second.element_size());
      }
    }
    std::printf("optimizer state: %.2f MiB on rank 0%s\n", double(bytes) / double(1 << 20),
                zero_ ? " (its ZeRO-1 shard)" : "");
  }
}

void DDPHook::install_sampler(data::DataLoader& loader, int64_t replicas, int64_t rank) {
  if (loader.batch_sampler().is_distributed()) return;  // the user's own: kept
  const data::DataLoaderOptions& options = loader.options();
  if (custom_sampler_) {
    loader.set_batch_sampler(custom_sampler_(loader, replicas, rank));
    return;
  }
  bool shuffle = sampler_.shuffle.value_or(options.shuffle);
  uint64_t seed = sampler_.seed.value_or(options.seed);
  bool drop_last = sampler_.drop_last.value_or(options.drop_last);
  if (const auto* multi = dynamic_cast<const data::MultiDataset*>(&loader.dataset())) {
    data::MultiDatasetBatchSamplerOptions multi_options;
    multi_options.batch_size = options.batch_size;
    multi_options.num_replicas = replicas;
    multi_options.rank = rank;
    multi_options.seed = seed;
    multi_options.drop_last = drop_last;
    loader.set_batch_sampler(
        std::make_shared<data::MultiDatasetBatchSampler>(*multi, multi_options));
    return;
  }
  auto sampler = std::make_shared<data::DistributedSampler>(loader.dataset().size(), replicas, rank,
                                                            shuffle, seed, drop_last);
  loader.set_batch_sampler(
      std::make_shared<data::BatchSampler>(sampler, options.batch_size, drop_last));
}

// ---- CheckpointHook ----------------------------------------------------------------------------

namespace {
// The digits of a checkpoint name's number, or -1: only the names CheckpointHook writes count,
// so a user's ckpt-epoch2-best.h5 is left be.
int64_t name_number(const std::string& digits) {
  if (digits.empty() || digits.size() > 18 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    return -1;
  }
  return std::stoll(digits);
}

std::string checkpoint_path(const std::string& out_dir, const std::string& name) {
  return (std::filesystem::path(out_dir) / name).string();
}

// The CRC-32C of the sample indices of every batch of the loader's current epoch, in order.
int64_t epoch_order_crc32c(const data::DataLoader& loader) {
  uint32_t crc = 0;
  for (const std::vector<int64_t>& batch : loader.batch_sampler().batches()) {
    crc = core::crc32c(batch.data(), batch.size() * sizeof(int64_t), crc);
    const int64_t end = -1;  // so that [1, 2][3] and [1][2, 3] differ
    crc = core::crc32c(&end, sizeof(end), crc);
  }
  return crc;
}
}  // namespace

std::vector<CheckpointFile> checkpoint_files(const std::string& out_dir) {
  namespace fs = std::filesystem;
  std::vector<CheckpointFile> found;
  std::error_code error;
  if (out_dir.empty() || !fs::is_directory(out_dir, error)) return found;
  const std::string prefix = "ckpt-epoch", suffix = ".h5", middle = "-step";
  for (const fs::directory_entry& entry : fs::directory_iterator(out_dir)) {
    std::string name = entry.path().filename().string();
    if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) ||
        !name.ends_with(suffix) || !entry.is_regular_file(error)) {
      continue;
    }
    std::string numbers = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    CheckpointFile file;
    file.path = entry.path().string();
    const size_t dash = numbers.find(middle);
    file.epochs = name_number(numbers.substr(0, dash));
    if (dash != std::string::npos) {
      file.step = name_number(numbers.substr(dash + middle.size()));
      if (file.step < 0) continue;
    }
    if (file.epochs < 0) continue;
    found.push_back(std::move(file));
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::string newest_checkpoint(const std::string& out_dir) {
  auto found = checkpoint_files(out_dir);
  return found.empty() ? std::string() : found.back().path;
}

CheckpointHook::CheckpointHook(CheckpointSettings settings, nn::LRScheduler* scheduler)
    : settings_(std::move(settings)), scheduler_(scheduler) {}

void CheckpointHook::save(TrainingContext& context, const std::string& path) const {
  // ZeRO-1 gathers the sharded optimizer state, every rank taking part, into the plain layout.
  nn::StateDict zero_state;
  if (context.zero != nullptr) {
    zero_state = context.zero->state_dict(context.manager->is_main_process());
  }
  if (!context.manager->is_main_process()) return;
  Span write(context.timeline, "checkpoint write");
  nn::CheckpointData data;
  nn::Module& model = context.model();
  data.model = model.state_dict();
  if (context.zero != nullptr) {
    data.optimizer = std::move(zero_state);
  } else if (!context.optimizers.empty()) {
    data.optimizer = context.optimizer().state_dict();
  }
  if (scheduler_ != nullptr) data.scheduler = scheduler_->state_dict();
  for (Hook* hook : context.hooks) {
    nn::StateDict state = hook->state_dict();
    if (state.empty()) continue;
    MPIGRAD_CHECK(data.hooks.count(hook->name()) == 0, "CheckpointHook: two hooks named '",
                  hook->name(), "' have state; hook names must be unique to be checkpointed");
    data.hooks.emplace(hook->name(), std::move(state));
  }
  for (const auto& [name, generator] : model.named_generators()) {
    data.rng.emplace_back("model." + name, *generator);
  }
  data.epoch = context.epoch;
  data.step = context.step;
  data.world_size = context.manager->world_size();
  data.config = settings_.config_text;
  // The loader's position is all a resumed run needs of the data: the sampler's order and every
  // augmentation draw are pure functions of (seed, epoch, sample), so nothing else advanced.
  data.batch_in_epoch = context.preempted ? context.batch_in_epoch : 0;
  data.micro_batches = context.micro_batches;
  data.epoch_batches = context.train_loader ? context.train_loader->size() : 0;
  if (context.preempted && context.train_loader != nullptr) {
    data.epoch_order_crc32c = epoch_order_crc32c(*context.train_loader);
  }
  nn::save_checkpoint(path, data);
}

// Gives every hook with state its part of the checkpoint. A hook whose state the file lacks
// (EMA turned on for the resumed run) starts afresh, and rank 0 says so.
void CheckpointHook::restore_hooks(TrainingContext& context, const nn::CheckpointData& data) const {
  for (Hook* hook : context.hooks) {
    if (hook->state_dict().empty()) continue;
    auto stored = data.hooks.find(hook->name());
    if (stored != data.hooks.end()) {
      try {
        hook->load_state_dict(stored->second);
      } catch (const core::Error& error) {
        core::fail("[train] resume: ", settings_.resume, ": the state of hook '", hook->name(),
                   "' does not fit this run: ", error.what());
      }
    } else if (context.manager->is_main_process()) {
      std::printf(
          "resume: %s holds no state for hook '%s'; it starts from the resumed "
          "weights\n",
          settings_.resume.c_str(), hook->name().c_str());
    }
  }
}

// resume = auto: the newest checkpoint that loads, or none when out_dir has none. When out_dir
// has checkpoints but none loads, starting afresh would quietly throw the run away (and then
// overwrite them): that is an error naming every file, for a person to look at.
std::optional<nn::CheckpointData> CheckpointHook::load_newest(bool main_process) {
  // Every rank looks and reads: rank 0 wrote the files before this run started, so all see the
  // same files and skip the same ones.
  auto found = checkpoint_files(settings_.out_dir);
  settings_.resume.clear();
  std::string skipped;
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    try {
      nn::CheckpointData data = nn::load_checkpoint(it->path);
      settings_.resume = it->path;
      if (main_process) std::printf("resume = auto: resuming from %s\n", it->path.c_str());
      return data;
    } catch (const core::Error& error) {
      if (main_process) {
        std::fprintf(stderr, "warning: resume = auto: skipping %s: %s\n", it->path.c_str(),
                     error.what());
      }
      skipped += (skipped.empty() ? "" : ", ") + it->path;
    }
  }
  MPIGRAD_CHECK(found.empty(), "[train] resume = auto: none of the ", found.size(),
                " checkpoint(s) in '", settings_.out_dir, "' can be loaded (", skipped,
                "); move or repair them, or set [train] resume to empty to start afresh");
  if (main_process) {
    std::printf("resume = auto: no checkpoint in '%s'; starting fresh\n",
                settings_.out_dir.c_str());
  }
  return std::nullopt;
}

// A mid-epoch position means batch k of this rank's shard: it holds only for the same ranks and
// the same batches per epoch (batch size, data, drop_last). Checked once DDPHook has installed the
// distributed sampler.
void CheckpointHook::check_resumed_position(TrainingContext& context) const {
  if (resumed_batch_ == 0) return;
  const int64_t ranks = context.manager->world_size();
  MPIGRAD_CHECK(resumed_world_size_ == ranks, "[train] resume: ", settings_.resume,
                " was taken mid-epoch by ", resumed_world_size_,
                " rank(s); its data position holds only on as many, and this run has ", ranks);
  const int64_t batches = context.train_loader ? context.train_loader->size() : 0;
  MPIGRAD_CHECK(resumed_epoch_batches_ == batches, "[train] resume: ", settings_.resume,
                " was taken mid-epoch with ", resumed_epoch_batches_,
                " batches per epoch per rank; this run has ", batches,
                " (a different batch size or data?), so its position would not be the same batch");
  if (resumed_order_ == 0 || context.train_loader == nullptr) return;
  // The order itself (seed, shuffle, data): rank 0 wrote its own, so rank 0 compares, and every
  // rank learns the verdict (once, before the first step) so that all fail together.
  context.train_loader->set_epoch(context.epoch);
  const bool same = !context.manager->is_main_process() ||
                    epoch_order_crc32c(*context.train_loader) == resumed_order_;
  core::Tensor verdict = core::Tensor::from_vector<int64_t>({same ? 1 : 0}, {1});
  if (ranks > 1) context.manager->world().all_reduce(verdict, ReduceOp::Min);
  MPIGRAD_CHECK(verdict.item<int64_t>() == 1, "[train] resume: ", settings_.resume,
                " was taken mid-epoch, but this run's order of batches for epoch ",
                context.epoch + 1,
                " differs from the one it stopped in (another seed, shuffle or data?), so it "
                "would not continue with the batches that were next");
}

void CheckpointHook::remove_old_checkpoints(TrainingContext& context) const {
  // Only after the new checkpoint is complete: a crash here leaves one too many, never none.
  if (settings_.keep_checkpoints <= 0 || !context.manager->is_main_process()) return;
  auto found = checkpoint_files(settings_.out_dir);
  auto keep = static_cast<size_t>(settings_.keep_checkpoints);
  for (size_t i = 0; i + keep < found.size(); ++i) {
    std::error_code error;
    std::filesystem::remove(found[i].path, error);
    if (error) {
      std::fprintf(stderr, "keep_checkpoints: cannot remove %s: %s\n", found[i].path.c_str(),
                   error.message().c_str());
    }
  }
}

// Rank 0 writes; the others wait for the rename before they go on to exit, so that a launcher
// ending the job at the first rank's exit cannot cut the write short.
void CheckpointHook::save_preempted(TrainingContext& context) {
  if (settings_.out_dir.empty()) return;
  preempted_path_ =
      checkpoint_path(settings_.out_dir, "ckpt-epoch" + std::to_string(context.epoch) + "-step" +
                                             std::to_string(context.step) + ".h5");
  save(context, preempted_path_);
  remove_old_checkpoints(context);
  if (context.manager->world_size() > 1) context.manager->world().barrier();
}

void CheckpointHook::on(HookStage stage, TrainingContext& context) {
  namespace fs = std::filesystem;
  if (stage == HookStage::Setup) {
    if (context.manager->is_main_process() && !settings_.out_dir.empty()) {
      fs::create_directories(settings_.out_dir);
    }
    nn::Optimizer* optimizer = context.optimizers.empty() ? nullptr : &context.optimizer();
    std::optional<nn::CheckpointData> data;
    if (settings_.resume == "auto") {
      data = load_newest(context.manager->is_main_process());
      if (!data) return;
    } else {
      if (settings_.resume.empty()) return;
      // Every rank reads the file: the model, optimizer and scheduler come back identical
      // everywhere.
      data = nn::load_checkpoint(settings_.resume);
    }
    nn::apply_checkpoint(*data, settings_.resume, context.model(), optimizer, scheduler_);
    restore_hooks(context, *data);
    // `epoch` counts finished epochs, so it is also the next one to run; a mid-epoch checkpoint
    // also says how far into it.
    context.epoch = data->epoch;
    context.step = data->step;
    context.batch_in_epoch = data->batch_in_epoch;
    context.micro_batches = data->micro_batches;
    resumed_batch_ = data->batch_in_epoch;
    resumed_epoch_batches_ = data->epoch_batches;
    resumed_world_size_ = data->world_size;
    resumed_order_ = data->epoch_order_crc32c;
    if (resumed_batch_ > 0 && context.manager->is_main_process()) {
      const auto epoch = static_cast<long long>(data->epoch + 1);
      const auto batches = static_cast<long long>(resumed_epoch_batches_);
      const auto step = static_cast<long long>(data->step);
      if (resumed_batch_ < resumed_epoch_batches_) {
        std::printf("resume: epoch %lld continues at batch %lld of %lld (after step %lld)\n", epoch,
                    static_cast<long long>(resumed_batch_ + 1), batches, step);
      } else {
        std::printf(
            "resume: epoch %lld had all its %lld batches (after step %lld); its end "
            "(checkpoint, validation) comes next\n",
            epoch, batches, step);
      }
    }
  } else if (stage == HookStage::BeforeTraining) {
    check_resumed_position(context);
    if (settings_.save_initial && context.step == 0 && !settings_.out_dir.empty()) {
      save(context, checkpoint_path(settings_.out_dir, "ckpt-step0.h5"));
    }
  } else if (stage == HookStage::AfterEpoch) {
    if (settings_.out_dir.empty()) return;
    int64_t finished = context.epoch + 1;
    int64_t current = context.epoch;
    context.epoch = finished;  // what a resume should start from
    save(context,
         checkpoint_path(settings_.out_dir, "ckpt-epoch" + std::to_string(finished) + ".h5"));
    save(context, checkpoint_path(settings_.out_dir, "last.h5"));
    context.epoch = current;
    remove_old_checkpoints(context);
  } else if (stage == HookStage::AfterTraining) {
    if (context.preempted) save_preempted(context);
  }
}

// ---- LRSchedulerHook, GradAccumulationHook, GradClipHook, EMAHook ------------------------------

void LRSchedulerHook::on(HookStage stage, TrainingContext&) {
  if (stage == HookStage::AfterOptimizerStep) scheduler_.step();
}

GradAccumulationHook::GradAccumulationHook(int64_t steps) : steps_(steps) {
  MPIGRAD_CHECK(steps >= 1, "GradAccumulationHook: steps must be at least 1, got ", steps);
}

void GradAccumulationHook::on(HookStage stage, TrainingContext& context) {
  if (stage == HookStage::Setup) context.accumulation_steps = steps_;
}

void GradAccumulationHook::backward(TrainingContext& context) {
  core::Tensor scaled = context.loss / double(steps_);
  if (context.ddp != nullptr && !context.sync_step) {
    auto local_only = context.ddp->no_sync();
    scaled.backward();
  } else {
    scaled.backward();
  }
}

void GradClipHook::on(HookStage stage, TrainingContext& context) {
  if (stage == HookStage::BeforeOptimizerStep) {
    // Under ZeRO-1 each rank's gradients are averaged in its shard only.
    last_norm_ = context.zero != nullptr
                     ? context.zero->clip_grad_norm(max_norm_)
                     : nn::clip_grad_norm_(context.model().parameters(), max_norm_);
  }
}

void EMAHook::on(HookStage stage, TrainingContext& context) {
  if (stage == HookStage::BeforeTraining && ema_->num_updates() == 0) {
    // Start from the weights training starts from: after a resume without EMA state, and after
    // DDP's broadcast of rank 0's weights.
    ema_ = std::make_unique<nn::ModelEMA>(context.model(), ema_->decay());
  } else if (stage == HookStage::AfterOptimizerStep) {
    ema_->update(context.model());
  }
}

nn::Module* EMAHook::evaluation_model(TrainingContext&) {
  if (evaluation_copy_ == nullptr) return nullptr;
  ema_->copy_to(*evaluation_copy_);
  return evaluation_copy_.get();
}

// ---- LoggingHook -------------------------------------------------------------------------------

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

void LoggingHook::on(HookStage stage, TrainingContext& context) {
  DistributedManager& manager = *context.manager;
  using clock = std::chrono::steady_clock;
  switch (stage) {
    case HookStage::Setup: {
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
        metrics_.open(path,
                      context.step > 0 || context.epoch > 0 ? std::ios::app : std::ios::trunc);
        MPIGRAD_CHECK(metrics_.good(), "LoggingHook: cannot write ", path);
        // A resumed run adds a file of its own; TensorBoard reads every file of the folder.
        if (tensorboard_wanted_) {
          tensorboard_ =
              std::make_unique<EventFileWriter>((std::filesystem::path(out_dir_) / "tb").string());
        }
      }
      break;
    }
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
    case HookStage::AfterOptimizerStep: {
      if (context.step % log_every_ != 0) break;
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
            static_cast<long long>(context.batch_in_epoch + 1), static_cast<long long>(batches),
            loss, lr, rate);
        std::fflush(stdout);
      }
      loss_sum_ = core::Tensor();
      loss_count_ = 0;
      samples_ += int64_t(totals[2]);
      train_seconds_ += seconds;
      samples_since_log_ = 0;
      last_log_ = now;
      break;
    }
    case HookStage::AfterEpoch: {
      // Count the tail since the last log in the throughput without another collective.
      double seconds = std::chrono::duration<double>(clock::now() - last_log_).count();
      samples_ += samples_since_log_ * manager.world_size();
      train_seconds_ += seconds;
      samples_since_log_ = 0;
      if (tty_) std::printf("\n");
      if (tensorboard_) tensorboard_->flush();
      break;
    }
    case HookStage::AfterValidation: {
      if (!main_process_) break;
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
      break;
    }
    case HookStage::AfterTraining:
      if (tensorboard_) tensorboard_->close();
      break;
    default:
      break;
  }
}

}  // namespace mpigrad::launch
