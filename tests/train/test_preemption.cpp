// Preemption (launch/train/preemption.h), under mpirun -np 1, 2 and 4: the duration and signal
// parsers, handlers that only set a flag and are restored afterwards, the ranks' agreement (a
// signal on one rank stops every rank after the same step; only rank 0's clock counts for the
// time limit), and a stopped run that, resumed from its mid-epoch checkpoint, ends with the
// weights of an uninterrupted run, bit for bit.
#include <doctest/doctest.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "../error_message.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/data/data_loader.h"
#include "mpigrad/data/tensor_dataset.h"
#include "mpigrad/launch/train/hooks/checkpoint_hook.h"
#include "mpigrad/launch/train/hooks/ddp_hook.h"
#include "mpigrad/launch/train/hooks/preemption_hook.h"
#include "mpigrad/launch/train/preemption.h"
#include "mpigrad/launch/train/training_steps.h"
#include "mpigrad/launch/train/training_strategy.h"
#include "mpigrad/nn/models.h"
#include "mpigrad/nn/optim/sgd.h"

using namespace mpigrad;
using core::Tensor;
using mpigrad::test::error_message;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// 48 samples of x float32 [4] and y int64 in [0, 3).
std::shared_ptr<data::TensorDataset> test_data() {
  const int64_t n = 48;
  core::Generator generator(5);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back(i % 3);
  return std::make_shared<data::TensorDataset>(
      std::vector<std::pair<std::string, Tensor>>{{"x", core::randn({n, 4}, generator)},
                                                  {"y", Tensor::from_vector<int64_t>(labels, {n})}},
      "in-memory test data");
}

data::DataLoaderOptions shuffled_batches_of_2() {
  data::DataLoaderOptions options;
  options.batch_size = 2;
  options.shuffle = true;
  options.seed = 7;
  return options;
}

// A model with dropout, so that its generator's state matters, and its optimizer.
struct Run {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<nn::SGD> optimizer;
  Run() {
    core::Generator generator(1);
    model = nn::make_mlp({4}, {8}, 3, 0.25, generator);
    optimizer =
        std::make_unique<nn::SGD>(model->parameters(), nn::SGDOptions{.lr = 0.1, .momentum = 0.9});
  }
};

// Raises `signal` on `rank` at the end of optimizer step `step` (before PreemptionHook, which
// runs after it, looks at the flag).
class RaisingHook final : public launch::Hook {
 public:
  RaisingHook(int rank, int64_t step, int signal) : rank_(rank), step_(step), signal_(signal) {}
  std::string name() const override { return "raising"; }
  launch::HookStages stages() const override { return {launch::HookStage::AfterOptimizerStep}; }
  launch::HookPlace place() const override { return {150, {}, {"preemption"}}; }
  void on(launch::HookStage stage, launch::TrainingContext& context) override {
    if (stage == launch::HookStage::AfterOptimizerStep && context.step == step_ &&
        context.manager->rank() == rank_) {
      std::raise(signal_);
    }
  }

 private:
  int rank_;
  int64_t step_;
  int signal_;
};

void (*current_handler(int signal))(int) {
  struct sigaction now {};
  sigaction(signal, nullptr, &now);
  return now.sa_handler;
}

int g_counted = 0;
extern "C" void count_signal(int) {
  ++g_counted;
}

}  // namespace

TEST_CASE("time_limit durations: the accepted forms, and errors naming the key") {
  using launch::parse_duration;
  CHECK(parse_duration("3h50m", "k") == 3 * 3600 + 50 * 60);
  CHECK(parse_duration("90m", "k") == 5400);
  CHECK(parse_duration(" 45s ", "k") == 45);
  CHECK(parse_duration("1h", "k") == 3600);
  CHECK(parse_duration("2d", "k") == 2 * 86400);
  CHECK(parse_duration("1h30m15s", "k") == 5415);
  CHECK(parse_duration("0", "k") == 0);
  CHECK(parse_duration("", "k") == 0);
  CHECK(parse_duration("none", "k") == 0);
  for (const char* bad : {"90", "m", "30m2h", "1h1h", "3x", "-1h", "1.5h", "h1", "9999999999h"}) {
    CAPTURE(bad);
    const std::string message = error_message([&] { parse_duration(bad, "[train] time_limit"); });
    CHECK(message.starts_with(std::string("[train] time_limit: '") + bad + "' is not a duration"));
  }
  for (int64_t seconds : {int64_t(1), int64_t(59), int64_t(60), int64_t(13800), int64_t(90061)}) {
    CHECK(parse_duration(launch::format_duration(seconds), "k") == seconds);
  }
  CHECK(launch::format_duration(13800) == "3h50m");
  CHECK(launch::format_duration(0) == "0");
}

TEST_CASE("stop_signals: names with or without SIG, any case; others are errors") {
  using launch::parse_stop_signals;
  CHECK(parse_stop_signals("TERM,INT,USR1", "k") == std::vector<int>{SIGTERM, SIGINT, SIGUSR1});
  CHECK(parse_stop_signals("sigusr2, Hup", "k") == std::vector<int>{SIGUSR2, SIGHUP});
  CHECK(parse_stop_signals("none", "k").empty());
  CHECK(parse_stop_signals("", "k").empty());
  CHECK(contains(error_message([] { parse_stop_signals("TERM,KILL", "[train] stop_signals"); }),
                 "[train] stop_signals: 'KILL' is not a stop signal"));
  CHECK(contains(error_message([] { parse_stop_signals("SEGV", "k"); }), "not a stop signal"));
  CHECK(contains(error_message([] { parse_stop_signals("INT,SIGINT", "k"); }),
                 "INT is listed twice"));
  CHECK(launch::stop_signal_name(SIGUSR1) == "USR1");
}

TEST_CASE("the handlers only set a flag, one set at a time, and the previous ones come back") {
  struct sigaction mine {};
  mine.sa_handler = count_signal;
  sigemptyset(&mine.sa_mask);
  struct sigaction before {};
  REQUIRE(sigaction(SIGUSR2, &mine, &before) == 0);
  g_counted = 0;
  {
    launch::StopSignalHandlers handlers({SIGUSR2});
    CHECK(handlers.received() == 0);
    std::raise(SIGUSR2);
    std::raise(SIGUSR2);  // a second signal changes nothing more
    CHECK(handlers.received() == SIGUSR2);
    CHECK(g_counted == 0);
    CHECK(contains(error_message([] { launch::StopSignalHandlers again({SIGTERM}); }),
                   "already installed"));
  }
  CHECK((current_handler(SIGUSR2) == count_signal));
  std::raise(SIGUSR2);
  CHECK(g_counted == 1);
  sigaction(SIGUSR2, &before, nullptr);
}

TEST_CASE("a signal on one rank stops every rank after the same step, a step later") {
  launch::DistributedManager manager = launch::DistributedManager::initialize();
  const int last = manager.world_size() - 1;
  void (*before)(int) = current_handler(SIGUSR1);
  Run run;
  data::DataLoader loader(test_data(), shuffled_batches_of_2());
  auto preemption = std::make_shared<launch::PreemptionHook>(launch::PreemptionSettings{{SIGUSR1}});
  launch::TrainingStrategy strategy({run.model.get()}, {run.optimizer.get()},
                                    launch::classification_step("x", "y"), nullptr, manager,
                                    {std::make_shared<launch::DDPHook>(),
                                     std::make_shared<RaisingHook>(last, 3, SIGUSR1), preemption},
                                    3);
  strategy.run(loader, nullptr);
  const launch::TrainingContext& context = strategy.context();
  CHECK(context.preempted);
  CHECK(context.stop);
  // One rank reads its flag at once; more agree on it at the next step's end.
  CHECK(context.step == (manager.world_size() == 1 ? 3 : 4));
  CHECK(context.epoch == 0);
  CHECK(context.batch_in_epoch == context.step);
  CHECK(preemption->reason() == "signal USR1 on rank " + std::to_string(last));
  CHECK((current_handler(SIGUSR1) == before));
}

TEST_CASE("a stop that would come at the run's last step lets the run finish") {
  launch::DistributedManager manager = launch::DistributedManager::initialize();
  const int64_t ranks = manager.world_size(), total = 2 * 24 / ranks;
  Run run;
  data::DataLoader loader(test_data(), shuffled_batches_of_2());
  auto preemption = std::make_shared<launch::PreemptionHook>(launch::PreemptionSettings{{SIGUSR1}});
  launch::TrainingStrategy strategy(
      {run.model.get()}, {run.optimizer.get()}, launch::classification_step("x", "y"), nullptr,
      manager,
      {std::make_shared<launch::DDPHook>(),
       std::make_shared<RaisingHook>(0, ranks == 1 ? total : total - 1, SIGUSR1), preemption},
      2);
  strategy.run(loader, nullptr);
  CHECK_FALSE(strategy.context().preempted);
  CHECK(strategy.context().step == total);
  CHECK(preemption->reason().empty());
}

TEST_CASE("only rank 0's clock counts for the time limit") {
  launch::DistributedManager manager = launch::DistributedManager::initialize();
  const auto now = std::chrono::steady_clock::now();
  for (bool rank0_late : {false, true}) {
    CAPTURE(rank0_late);
    // Rank 0 is past the limit or not; every other rank is, which must not matter.
    const bool late = manager.rank() == 0 ? rank0_late : true;
    Run run;
    data::DataLoader loader(test_data(), shuffled_batches_of_2());
    auto preemption = std::make_shared<launch::PreemptionHook>(
        launch::PreemptionSettings{{}, 60, late ? now - std::chrono::minutes(2) : now});
    launch::TrainingStrategy strategy({run.model.get()}, {run.optimizer.get()},
                                      launch::classification_step("x", "y"), nullptr, manager,
                                      {std::make_shared<launch::DDPHook>(), preemption}, 2);
    strategy.run(loader, nullptr);
    const launch::TrainingContext& context = strategy.context();
    CHECK(context.preempted == rank0_late);
    if (rank0_late) {
      CHECK(context.step == (manager.world_size() == 1 ? 1 : 2));
      CHECK(preemption->reason() == "time_limit 1m on rank 0's clock");
    } else {
      CHECK(context.step == 2 * 48 / (2 * manager.world_size()));
      CHECK(preemption->reason().empty());
    }
  }
}

TEST_CASE("stopped mid-epoch and resumed from its checkpoint, a run ends as an uninterrupted one") {
  namespace fs = std::filesystem;
  launch::DistributedManager manager = launch::DistributedManager::initialize();
  const fs::path dir = fs::temp_directory_path() /
                       ("mpigrad-test-preemption-" + std::to_string(manager.world_size()));
  if (manager.is_main_process()) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  manager.world().barrier();
  auto train = [&](const std::string& resume, int64_t stop_at, const std::string& out_dir) {
    auto run = std::make_unique<Run>();
    data::DataLoader loader(test_data(), shuffled_batches_of_2());
    std::vector<std::shared_ptr<launch::Hook>> hooks = {
        std::make_shared<launch::CheckpointHook>(
            launch::CheckpointSettings{out_dir, resume, false, "", 0}),
        std::make_shared<launch::DDPHook>()};
    if (stop_at > 0) hooks.push_back(std::make_shared<RaisingHook>(0, stop_at, SIGUSR1));
    hooks.push_back(
        std::make_shared<launch::PreemptionHook>(launch::PreemptionSettings{{SIGUSR1}}));
    launch::TrainingStrategy strategy({run->model.get()}, {run->optimizer.get()},
                                      launch::classification_step("x", "y"), nullptr, manager,
                                      hooks, 3);
    strategy.run(loader, nullptr);
    CHECK(strategy.context().preempted == (stop_at > 0));
    return run;
  };
  auto full = train("", 0, (dir / "full").string());
  if (manager.is_main_process()) {
    // last.h5 is the newest epoch's file under a second name, not a second write of it.
    CHECK(fs::equivalent(dir / "full" / "last.h5", dir / "full" / "ckpt-epoch3.h5"));
    CHECK_FALSE(fs::equivalent(dir / "full" / "last.h5", dir / "full" / "ckpt-epoch2.h5"));
  }
  const int64_t ranks = manager.world_size(), epoch_steps = 24 / ranks;
  // Step 14 is in the first epoch on 1 rank (24 batches an epoch), the second on 2 (12) and the
  // third on 4 (6); the other stop is at the end of the first epoch, before its checkpoint.
  for (int64_t stop_step : {int64_t(14), epoch_steps}) {
    CAPTURE(stop_step);
    const std::string part_dir = (dir / ("part" + std::to_string(stop_step))).string();
    train("", ranks == 1 ? stop_step : stop_step - 1, part_dir);
    const std::vector<launch::CheckpointFile> saved = launch::checkpoint_files(part_dir);
    REQUIRE(!saved.empty());
    CHECK(saved.back().step == stop_step);
    CHECK(saved.back().epochs == (stop_step - 1) / epoch_steps);
    auto resumed = train("auto", 0, part_dir);
    manager.world().barrier();  // rank 0 writes the last epoch's checkpoint on its own
    CHECK(launch::newest_checkpoint(part_dir) == (fs::path(part_dir) / "ckpt-epoch3.h5").string());
    const auto a = full->model->named_parameters(), b = resumed->model->named_parameters();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      CAPTURE(a[i].first);
      CHECK(a[i].second.to_vector<float>() == b[i].second.to_vector<float>());
    }
  }
  manager.world().barrier();
  if (manager.is_main_process()) fs::remove_all(dir);
}

TEST_CASE("checkpoint files order mid-epoch ones after their epoch's start") {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("mpigrad-test-checkpoint-names-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* name :
       {"ckpt-epoch2.h5", "ckpt-epoch1-step30.h5", "ckpt-epoch1.h5", "ckpt-epoch0-step7.h5",
        "ckpt-epoch2-step5x.h5", "ckpt-epoch1-best.h5", "ckpt-epoch10.h5", "last.h5"}) {
    std::ofstream(dir / name) << "x";
  }
  std::vector<std::string> names;
  for (const auto& file : launch::checkpoint_files(dir.string())) {
    names.push_back(fs::path(file.path).filename().string());
  }
  CHECK(names == std::vector<std::string>{"ckpt-epoch0-step7.h5", "ckpt-epoch1.h5",
                                          "ckpt-epoch1-step30.h5", "ckpt-epoch2.h5",
                                          "ckpt-epoch10.h5"});
  fs::remove_all(dir);
}
