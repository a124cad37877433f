#include "mpigrad/launch/train/hooks/checkpoint_hook.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "mpigrad/core/atomic_file.h"
#include "mpigrad/core/crc32c.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/hdf5.h"
#include "mpigrad/launch/comm/rank_label.h"
#include "mpigrad/launch/ddp/zero_redundancy.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/observe/timeline.h"

namespace mpigrad::launch {

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
// Text from `root` to every rank of `communicator`.
std::string broadcast_text(Communicator& communicator, const std::string& text, int root) {
  core::Tensor size = core::Tensor::from_vector<int64_t>({int64_t(text.size())}, {1});
  communicator.broadcast(size, root);
  const int64_t length = size.item<int64_t>();
  if (length == 0) return "";
  core::Tensor bytes = core::zeros({length}, core::kUInt8);
  if (communicator.rank() == root) std::memcpy(bytes.data_ptr(), text.data(), text.size());
  communicator.broadcast(bytes, root);
  return std::string(static_cast<const char*>(bytes.data_ptr()), size_t(length));
}

// The error of the lowest rank whose `error` is not empty, on every rank, saying how many others
// failed too; "" when none failed.
std::string first_failure(Communicator& world, const std::string& error) {
  core::Tensor first =
      core::Tensor::from_vector<int64_t>({error.empty() ? world.size() : world.rank()}, {1});
  world.all_reduce(first, ReduceOp::Min);
  const int64_t failing = first.item<int64_t>();
  if (failing == world.size()) return "";
  core::Tensor count = core::Tensor::from_vector<int64_t>({error.empty() ? 0 : 1}, {1});
  world.all_reduce(count, ReduceOp::Sum);
  const int64_t others = count.item<int64_t>() - 1;
  return broadcast_text(world, error, int(failing)) +
         (others == 0 ? ""
                      : " (" + std::to_string(others) + " other rank" + (others == 1 ? "" : "s") +
                            " failed too)");
}

// The CRC-32C of its tensors a checkpoint stores (nn/checkpoint.h), which load_checkpoint has
// checked them against; -1 for a file written before checkpoints had one.
int64_t stored_crc32c(const std::string& path) {
  core::hdf5::File file = core::hdf5::File::open(path);
  return file.has_attribute("/", "checksum_crc32c")
             ? file.read_int_attribute("/", "checksum_crc32c")
             : -1;
}

core::Tensor file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  MPIGRAD_CHECK(in.good(), "cannot open ", path, " to send it");
  const int64_t size = in.tellg();
  core::Tensor bytes = core::zeros({size}, core::kUInt8);
  in.seekg(0);
  in.read(static_cast<char*>(bytes.data_ptr()), size);
  MPIGRAD_CHECK(in.good() || size == 0, "cannot read ", path, " to send it");
  return bytes;
}

// A new file in the node's temporary directory ($TMPDIR, else /tmp) holding `bytes`.
std::string write_temporary(const core::Tensor& bytes) {
  std::string name = (std::filesystem::temp_directory_path() / "mpigrad-resume-XXXXXX.h5").string();
  const int fd = mkstemps(name.data(), 3);
  MPIGRAD_CHECK(fd >= 0, "cannot create a temporary file ", name, ": ", std::strerror(errno));
  const char* from = static_cast<const char*>(bytes.data_ptr());
  int64_t left = bytes.numel();
  while (left > 0) {
    const ssize_t wrote = ::write(fd, from, size_t(std::min<int64_t>(left, int64_t(1) << 30)));
    if (wrote <= 0) {
      const int cause = errno;
      ::close(fd);
      std::filesystem::remove(name);
      core::fail("cannot write the temporary file ", name, ": ", std::strerror(cause));
    }
    from += wrote;
    left -= wrote;
  }
  MPIGRAD_CHECK(::close(fd) == 0, "cannot write the temporary file ", name, ": ",
                std::strerror(errno));
  return name;
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

std::optional<nn::CheckpointData> gather_training_state(TrainingContext& context,
                                                        const std::string& config_text) {
  // ZeRO-1 gathers the sharded optimizer state, every rank taking part, into the plain layout.
  nn::StateDict zero_state;
  if (context.zero != nullptr) {
    zero_state = context.zero->state_dict(context.is_main_process());
  }
  if (!context.is_main_process()) return std::nullopt;
  nn::CheckpointData data;
  nn::Module& model = context.model();
  data.model = model.state_dict();
  if (context.zero != nullptr) {
    data.optimizer = std::move(zero_state);
  } else if (!context.optimizers.empty()) {
    data.optimizer = context.optimizer().state_dict();
  }
  if (context.scheduler != nullptr) data.scheduler = context.scheduler->state_dict();
  for (Hook* hook : context.hooks) {
    nn::StateDict state = hook->state_dict();
    if (!state.empty()) data.hooks.emplace(hook->name(), std::move(state));
  }
  for (const auto& [name, generator] : model.named_generators()) {
    data.rng.emplace_back("model." + name, *generator);
  }
  data.epoch = context.epoch;
  data.step = context.step;
  data.world_size = context.world_size();
  data.config = config_text;
  // The loader's position is all a resumed run needs of the data: the sampler's order and every
  // augmentation draw are pure functions of (seed, epoch, sample), so nothing else advanced.
  data.batch_in_epoch = context.preempted ? context.batch_in_epoch : 0;
  data.micro_batches = context.micro_batches;
  data.epoch_batches = context.train_loader ? context.train_loader->size() : 0;
  if (context.preempted && context.train_loader != nullptr) {
    data.epoch_order_crc32c = epoch_order_crc32c(*context.train_loader);
  }
  return data;
}

void restore_training_state(TrainingContext& context, const nn::CheckpointData& data,
                            const std::string& path, const std::string& what) {
  nn::Optimizer* optimizer = context.optimizers.empty() ? nullptr : &context.optimizer();
  nn::apply_checkpoint(data, path, context.model(), optimizer, context.scheduler);
  // Each rank takes its shard of what the optimizer just loaded (a resume at setup runs before
  // DDPHook builds ZeRO-1, which then takes the state over itself).
  if (context.zero != nullptr && optimizer != nullptr) {
    context.zero->load_state_dict(optimizer->state_dict());
  }
  for (Hook* hook : context.hooks) {
    if (hook->state_dict().empty()) continue;
    auto stored = data.hooks.find(hook->name());
    if (stored != data.hooks.end()) {
      try {
        hook->load_state_dict(stored->second);
      } catch (const core::Error& error) {
        core::fail(what, path, ": the state of hook '", hook->name(),
                   "' does not fit this run: ", error.what());
      }
    } else if (context.reports()) {
      std::printf("resume: %s holds no state for hook '%s'; it starts from the resumed weights\n",
                  path.c_str(), hook->name().c_str());
    }
  }
  // `epoch` counts finished epochs, so it is also the next one to run; a mid-epoch checkpoint
  // also says how far into it.
  context.epoch = data.epoch;
  context.step = data.step;
  context.batch_in_epoch = data.batch_in_epoch;
  context.micro_batches = data.micro_batches;
}

CheckpointHook::CheckpointHook(CheckpointSettings settings) : settings_(std::move(settings)) {}

void CheckpointHook::save(TrainingContext& context, const std::string& path) const {
  std::optional<nn::CheckpointData> data = gather_training_state(context, settings_.config_text);
  if (!data) return;
  Span write(context.timeline, "checkpoint write");
  nn::save_checkpoint(path, *data);
}

// resume = auto, on rank 0: the newest checkpoint that loads, or none when out_dir has none. When
// out_dir has checkpoints but none loads, starting afresh would quietly throw the run away (and
// then overwrite them): that is an error naming every file, for a person to look at.
std::optional<nn::CheckpointData> CheckpointHook::load_newest() {
  auto found = checkpoint_files(settings_.out_dir);
  settings_.resume.clear();
  std::string skipped;
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    try {
      nn::CheckpointData data = nn::load_checkpoint(it->path);
      settings_.resume = it->path;
      std::printf("resume = auto: resuming from %s\n", it->path.c_str());
      return data;
    } catch (const core::Error& error) {
      std::fprintf(stderr, "warning: resume = auto: skipping %s: %s\n", it->path.c_str(),
                   error.what());
      skipped += (skipped.empty() ? "" : ", ") + it->path;
    }
  }
  MPIGRAD_CHECK(found.empty(), "[train] resume = auto: none of the ", found.size(),
                " checkpoint(s) in '", settings_.out_dir, "' can be loaded (", skipped,
                "); move or repair them, or set [train] resume to empty to start afresh");
  std::printf("resume = auto: no checkpoint in '%s'; starting fresh\n", settings_.out_dir.c_str());
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

// checkpoint_scope = node_local: rank 0 sends the file it chose to one rank of every other node
// (the lowest, which MPI's shared-memory split makes local rank 0), which writes it to a
// temporary file of its node; each rank learns where its node holds the file (rank 0's node: the
// file itself). Collective over the world; returns this rank's failure ("" when none), which the
// caller's agreement reports. A failed send still takes part in every collective, so no rank
// waits for one that gave up.
std::string CheckpointHook::receive_checkpoint(TrainingContext& context, std::string& readable_path,
                                               std::string& temporary) const {
  DistributedManager& manager = *context.manager;
  Communicator& node = manager.node_local();
  const bool leader = node.rank() == 0;
  std::unique_ptr<Communicator> leaders =
      manager.world().split(leader ? 0 : 1, manager.rank(), "checkpoint leaders");
  std::string failure;
  if (leader && leaders->size() > 1) {
    core::Tensor bytes;
    if (manager.is_main_process()) {
      try {
        bytes = file_bytes(readable_path);
      } catch (const std::exception& error) {
        failure = error.what();
      }
    }
    core::Tensor size =
        core::Tensor::from_vector<int64_t>({bytes.defined() ? bytes.numel() : -1}, {1});
    leaders->broadcast(size, 0);
    const int64_t total = size.item<int64_t>();
    if (total < 0 && failure.empty()) failure = "rank 0 could not read it again to send it";
    if (total >= 0) {
      if (!bytes.defined()) bytes = core::zeros({total}, core::kUInt8);
      // In pieces whose counts fit MPI's int.
      constexpr int64_t kPiece = int64_t(256) << 20;
      for (int64_t offset = 0; offset < total; offset += kPiece) {
        leaders->broadcast(bytes.narrow(0, offset, std::min(kPiece, total - offset)), 0);
      }
      if (!manager.is_main_process()) {
        try {
          temporary = write_temporary(bytes);
          readable_path = temporary;
        } catch (const std::exception& error) {
          failure = error.what();
        }
      }
    }
  }
  leaders.reset();
  std::string where = broadcast_text(node, failure.empty() ? readable_path : "", 0);
  if (failure.empty() && where.empty()) failure = "its node's copy could not be written";
  readable_path = where;
  return failure;
}

void CheckpointHook::resume(TrainingContext& context) {
  const bool automatic = settings_.resume == "auto";
  if (!automatic && settings_.resume.empty()) return;  // the same settings on every rank
  DistributedManager& manager = *context.manager;
  const bool main = manager.is_main_process();
  const bool several = manager.world_size() > 1;
  // Rank 0 chooses, and reads what it chose; its error is every rank's.
  std::optional<nn::CheckpointData> data;
  std::string error;
  if (main) {
    try {
      data = automatic ? load_newest() : nn::load_checkpoint(settings_.resume);
    } catch (const std::exception& failure) {
      error = failure.what();
    }
  }
  if (several) {
    if (std::string failed = first_failure(manager.world(), error); !failed.empty()) {
      core::fail(failed);
    }
  } else if (!error.empty()) {
    core::fail(error);
  }
  // The choice: a path (empty: start afresh) and the CRC-32C its tensors have.
  std::string choice;
  if (main && data) {
    choice = std::to_string(stored_crc32c(settings_.resume)) + " " + settings_.resume;
  }
  if (several) choice = broadcast_text(manager.world(), choice, 0);
  if (choice.empty()) return;
  const size_t space = choice.find(' ');
  const int64_t crc = std::stoll(choice.substr(0, space));
  settings_.resume = choice.substr(space + 1);
  if (!several) {
    restore_resumed(context, *data);
    return;
  }
  // Every other rank gets that same file, or says why it cannot.
  std::string readable_path = settings_.resume, temporary, failure;
  if (settings_.scope == CheckpointScope::NodeLocal) {
    failure = receive_checkpoint(context, readable_path, temporary);
  }
  if (!main && failure.empty()) {
    try {
      data = nn::load_checkpoint(readable_path);
      const int64_t found = stored_crc32c(readable_path);
      MPIGRAD_CHECK(found == crc, "it holds tensors with CRC-32C ", found,
                    ", and the file rank 0 chose has ", crc, " (another file of the same name)");
    } catch (const std::exception& cannot) {
      failure = cannot.what();
    }
  }
  if (!failure.empty()) {
    failure = "[train] resume: rank " + std::to_string(manager.rank()) + " on " + host_name() +
              " cannot read " + settings_.resume + ", the checkpoint rank 0 chose" +
              (readable_path != settings_.resume && !readable_path.empty()
                   ? " (sent to its node as " + readable_path + ")"
                   : "") +
              ": " + failure +
              (settings_.scope == CheckpointScope::Shared
                   ? ". Every rank reads that file from its own view of out_dir; if out_dir is "
                     "not shared by the nodes, set [train] checkpoint_scope = node_local and "
                     "rank 0 sends it to them"
                   : "");
  }
  const std::string failed = first_failure(manager.world(), failure);
  // Every rank has read its node's copy (or failed) before the agreement: it may go now.
  if (!temporary.empty()) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
  }
  if (!failed.empty()) core::fail(failed);
  if (main && settings_.scope == CheckpointScope::NodeLocal && manager.node_count() > 1) {
    std::printf("resume: rank 0 sent %s to the other %d node(s)\n", settings_.resume.c_str(),
                manager.node_count() - 1);
  }
  restore_resumed(context, *data);
}

void CheckpointHook::restore_resumed(TrainingContext& context, const nn::CheckpointData& data) {
  restore_training_state(context, data, settings_.resume, "[train] resume: ");
  resumed_batch_ = data.batch_in_epoch;
  resumed_epoch_batches_ = data.epoch_batches;
  resumed_world_size_ = data.world_size;
  resumed_order_ = data.epoch_order_crc32c;
  if (resumed_batch_ == 0 || !context.manager->is_main_process()) return;
  const auto epoch = static_cast<long long>(data.epoch + 1);
  const auto batches = static_cast<long long>(resumed_epoch_batches_);
  const auto step = static_cast<long long>(data.step);
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

void CheckpointHook::on(HookStage stage, TrainingContext& context) {
  namespace fs = std::filesystem;
  if (stage == HookStage::Setup) {
    if (context.manager->is_main_process() && !settings_.out_dir.empty()) {
      fs::create_directories(settings_.out_dir);
    }
    resume(context);
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
    const std::string epoch_file =
        checkpoint_path(settings_.out_dir, "ckpt-epoch" + std::to_string(finished) + ".h5");
    const std::string last = checkpoint_path(settings_.out_dir, "last.h5");
    save(context, epoch_file);
    // last.h5 holds the same bytes: rank 0 makes it another name of the epoch's file (GPT-2 124M
    // with its Adam state is 1.5 GB, written once instead of twice; neither file is ever written
    // in place). Where the link cannot be made the bytes are written again, and under ZeRO-1
    // every rank gathers its shard for that write, so every rank learns whether it was made.
    bool linked = context.is_main_process() && core::link_file_atomically(epoch_file, last);
    if (context.zero != nullptr && context.world_size() > 1) {
      core::Tensor made = core::Tensor::from_vector<int64_t>({linked ? 1 : 0}, {1});
      context.manager->world().broadcast(made, 0);
      linked = made.item<int64_t>() == 1;
    }
    if (!linked) save(context, last);
    context.epoch = current;
    remove_old_checkpoints(context);
  } else if (stage == HookStage::AfterTraining) {
    if (context.preempted) save_preempted(context);
  }
}

}  // namespace mpigrad::launch
