// TrainingStrategy and its hooks, under mpirun -np 1 and 2: stage order and frequency, hooks
// sorted by their declared place (a shared order key, a duplicate name or a broken after/before
// is an error naming both hooks), claims of the optimizer step and of forward and backward,
// stepping one batch at a time with accumulation, set_epoch every epoch, DDPHook (a no-op at
// world size 1), and validation that counts padded samples once.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "mpigrad/core/rng.h"
#include "mpigrad/data/data_loader.h"
#include "mpigrad/data/sampler.h"
#include "mpigrad/data/tensor_dataset.h"
#include "mpigrad/launch/train/hooks/checkpoint_hook.h"
#include "mpigrad/launch/train/hooks/ddp_hook.h"
#include "mpigrad/launch/train/hooks/grad_accumulation_hook.h"
#include "mpigrad/launch/train/hooks/grad_clip_hook.h"
#include "mpigrad/launch/train/hooks/logging_hook.h"
#include "mpigrad/launch/train/hooks/loss_scaling_hook.h"
#include "mpigrad/launch/train/training_steps.h"
#include "mpigrad/launch/train/training_strategy.h"
#include "mpigrad/nn/loss.h"
#include "mpigrad/nn/models.h"
#include "mpigrad/nn/optim/sgd.h"

using namespace mpigrad;
using core::Tensor;

namespace {

// n samples of x float32 [4] and y int64 in [0, 3), held in memory.
std::shared_ptr<data::TensorDataset> test_data(int64_t n) {
  core::Generator generator(5);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back(i % 3);
  return std::make_shared<data::TensorDataset>(
      std::vector<std::pair<std::string, Tensor>>{{"x", core::randn({n, 4}, generator)},
                                                  {"y", Tensor::from_vector<int64_t>(labels, {n})}},
      "in-memory test data");
}

data::DataLoaderOptions batches_of(int64_t batch_size, bool shuffle = false) {
  data::DataLoaderOptions options;
  options.batch_size = batch_size;
  options.shuffle = shuffle;
  return options;
}

struct Setup {
  launch::DistributedManager manager = launch::DistributedManager::initialize();
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<nn::SGD> optimizer;
  launch::StepFunction step = launch::classification_step("x", "y");
  launch::EvalFunction evaluate = launch::classification_metrics("x", "y");
  Setup() {
    core::Generator generator(1);
    model = nn::make_mlp({4}, {8}, 3, 0.0, generator);
    optimizer = std::make_unique<nn::SGD>(model->parameters(), nn::SGDOptions{.lr = 0.1});
  }
};

// Records every stage it sees, and where it ran among the hooks (into a shared log).
class RecordingHook final : public launch::Hook {
 public:
  RecordingHook(std::string name, int order, int64_t every = 1,
                std::vector<std::string>* shared_log = nullptr, launch::HookPlace place = {})
      : Hook(every), name_(std::move(name)), place_(std::move(place)), shared_log_(shared_log) {
    place_.order = order;
  }
  std::string name() const override { return name_; }
  launch::HookStages stages() const override { return launch::HookStages::all(); }
  launch::HookPlace place() const override { return place_; }
  void on(launch::HookStage stage, launch::TrainingContext& context) override {
    const std::string event = std::string(core::enum_name(stage, launch::kHookStageNames)) + "@" +
                              std::to_string(context.micro_batches);
    events.push_back(event);
    if (shared_log_ != nullptr) shared_log_->push_back(name_ + ":" + event);
  }
  std::vector<std::string> events;

 private:
  std::string name_;
  launch::HookPlace place_;
  std::vector<std::string>* shared_log_;
};

// Claims the optimizer step (counting its calls), or forward and backward, acting at `stages`.
class ClaimingHook final : public launch::Hook {
 public:
  enum class Claim { OptimizerStep, ForwardBackward };
  ClaimingHook(std::string name, int order, Claim claim, launch::HookStages stages = {})
      : name_(std::move(name)), order_(order), claim_(claim), stages_(stages) {}
  std::string name() const override { return name_; }
  launch::HookStages stages() const override { return stages_; }
  launch::HookPlace place() const override { return {order_}; }
  void on(launch::HookStage, launch::TrainingContext&) override {}
  bool replaces_optimizer_step() const override { return claim_ == Claim::OptimizerStep; }
  void optimizer_step(launch::TrainingContext& context) override {
    ++calls;
    context.optimizer().step();
    context.optimizer().zero_grad();
  }
  bool replaces_forward_backward() const override { return claim_ == Claim::ForwardBackward; }
  Tensor forward_backward(launch::TrainingContext&,
                          const std::function<Tensor()>& compute) override {
    ++calls;
    return compute();
  }
  int calls = 0;

 private:
  std::string name_;
  int order_;
  Claim claim_;
  launch::HookStages stages_;
};

// The message of the core::Error that building a strategy of `hooks` throws ("" if none).
std::string strategy_error(Setup& s, std::vector<std::shared_ptr<launch::Hook>> hooks) {
  try {
    launch::TrainingStrategy strategy({s.model.get()}, {s.optimizer.get()}, s.step, s.evaluate,
                                      s.manager, std::move(hooks), 1);
  } catch (const core::Error& error) {
    return error.what();
  }
  return "";
}

// A distributed-looking batch sampler that records set_epoch.
class EpochRecordingSampler final : public data::BatchSamplerBase {
 public:
  int64_t size() const override { return 2; }
  std::vector<std::vector<int64_t>> batches() const override { return {{0, 1}, {2, 3}}; }
  void set_epoch(int64_t epoch) override { epochs.push_back(epoch); }
  bool is_distributed() const override { return true; }
  std::vector<int64_t> epochs;
};

}  // namespace

TEST_CASE("stages run in order, and per-batch stages honour the hook's frequency") {
  Setup s;
  auto every = std::make_shared<RecordingHook>("every", 10, 1);
  auto second = std::make_shared<RecordingHook>("second", 20, 2);
  auto dataset = test_data(8);
  data::DataLoader loader(dataset, batches_of(2));
  launch::TrainingStrategy strategy({s.model.get()}, {s.optimizer.get()}, s.step, s.evaluate,
                                    s.manager, {every, second}, /*epochs=*/1);
  strategy.run(loader, nullptr);
  std::vector<std::string> expected_start = {"setup@0",
                                             "before_training@0",
                                             "before_epoch@0",
                                             "before_batch@0",
                                             "before_forward@0",
                                             "after_loss@0",
                                             "before_backward@0",
                                             "after_backward@0",
                                             "before_optimizer_step@0",
                                             "after_optimizer_step@0",
                                             "after_batch@0",
                                             "before_batch@1"};
  REQUIRE(every->events.size() > expected_start.size());
  CHECK(std::vector<std::string>(every->events.begin(),
                                 every->events.begin() + std::ptrdiff_t(expected_start.size())) ==
        expected_start);
  CHECK(every->events.back() == "after_training@4");
  CHECK(strategy.context().step == 4);
  // The every-2 hook sees micro-batches 0 and 2 only.
  for (const std::string& event : second->events) {
    CHECK((event.ends_with("@0") || event.ends_with("@2") || event.ends_with("@4")));
  }
  CHECK(std::count(second->events.begin(), second->events.end(), "before_batch@2") == 1);
  CHECK(std::count(second->events.begin(), second->events.end(), "before_batch@1") == 0);
}

TEST_CASE("hooks run by their declared order, whatever order they were given in") {
  Setup s;
  std::vector<std::string> log;
  auto late = std::make_shared<RecordingHook>("late", 30, 1, &log);
  auto early = std::make_shared<RecordingHook>("early", 10, 1, &log);
  auto middle = std::make_shared<RecordingHook>("middle", 20, 1, &log);
  auto dataset = test_data(2);
  data::DataLoader loader(dataset, batches_of(2));
  launch::TrainingStrategy strategy({s.model.get()}, {s.optimizer.get()}, s.step, s.evaluate,
                                    s.manager, {late, early, middle}, 1);
  REQUIRE(strategy.hooks().size() == 3);
  CHECK(strategy.hooks()[0]->name() == "early");
  CHECK(strategy.hooks()[2]->name() == "late");
  strategy.run(loader, nullptr);
  REQUIRE(log.size() >= 3);
  CHECK(std::vector<std::string>(log.begin(), log.begin() + 3) ==
        std::vector<std::string>{"early:setup@0", "middle:setup@0", "late:setup@0"});
}

TEST_CASE("the built-in hooks take their places, given in any order") {
  Setup s;
  auto logging = std::make_shared<launch::LoggingHook>("", 1);
  auto clip = std::make_shared<launch::GradClipHook>(1.0);
  auto scaler = std::make_shared<launch::LossScalingHook>();
  auto accumulate = std::make_shared<launch::GradAccumulationHook>(2);
  auto ddp = std::make_shared<launch::DDPHook>();
  auto checkpoint = std::make_shared<launch::CheckpointHook>(launch::CheckpointSettings{});
  launch::TrainingStrategy strategy({s.model.get()}, {s.optimizer.get()}, s.step, s.evaluate,
                                    s.manager, {logging, clip, scaler, accumulate, ddp, checkpoint},
                                    1);
  std::vector<std::string> names;
  for (const auto& hook : strategy.hooks()) names.push_back(hook->name());
  CHECK(names == std::vector<std::string>{"checkpoint", "ddp", "grad_accumulation", "loss_scaler",
                                          "grad_clip", "logging"});
}

TEST_CASE("two hooks that claim the same place, or the same name, are an error naming both") {
  Setup s;
  const std::string same_order = strategy_error(s, {std::make_shared<RecordingHook>("mine", 10),
                                                    std::make_shared<RecordingHook>("theirs", 10)});
  CHECK(same_order.find("'mine'") != std::string::npos);
  CHECK(same_order.find("'theirs'") != std::string::npos);
  CHECK(same_order.find("order 10") != std::string::npos);
  // A user's hook at the place of a built-in one.
  const std::string built_in =
      strategy_error(s, {std::make_shared<launch::GradClipHook>(1.0),
                         std::make_shared<RecordingHook>("mine", launch::GradClipHook::kOrder)});
  CHECK(built_in.find("'grad_clip'") != std::string::npos);
  CHECK(built_in.find("'mine'") != std::string::npos);
  const std::string same_name = strategy_error(s, {std::make_shared<RecordingHook>("twin", 10),
                                                   std::make_shared<RecordingHook>("twin", 20)});
  CHECK(same_name.find("two hooks are named 'twin'") != std::string::npos);
}

TEST_CASE("a broken after or before constraint is an error naming both hooks") {
  Setup s;
  // "clipper" wants to run after the loss scaler but takes an order before it.
  const std::string after =
      strategy_error(s, {std::make_shared<launch::LossScalingHook>(),
                         std::make_shared<RecordingHook>("clipper", 650, 1, nullptr,
                                                         launch::HookPlace{0, {"loss_scaler"}})});
  CHECK(after.find("hook 'clipper' (order 650) must run after 'loss_scaler' (order 700)") !=
        std::string::npos);
  const std::string before =
      strategy_error(s, {std::make_shared<launch::LoggingHook>("", 1),
                         std::make_shared<RecordingHook>("metrics", 1300, 1, nullptr,
                                                         launch::HookPlace{0, {}, {"logging"}})});
  CHECK(before.find("hook 'metrics' (order 1300) must run before 'logging' (order 1200)") !=
        std::string::npos);
  // A constraint on a hook that is not there holds.
  CHECK(strategy_error(s, {std::make_shared<RecordingHook>(
                              "alone", 5, 1, nullptr, launch::HookPlace{0, {"nobody"}})}) == "");
}

TEST_CASE("a hook may replace the optimizer step, or forward and backward, but not two") {
  Setup s;
  using Claim = ClaimingHook::Claim;
  auto claim = std::make_shared<ClaimingHook>("mine", 10, Claim::OptimizerStep);
  auto dataset = test_data(4);
  data::DataLoader loader(dataset, batches_of(2));
  launch::TrainingStrategy strategy({s.model.get()}, {s.optimizer.get()}, s.step, s.evaluate,
                                    s.manager, {claim}, 1);
  strategy.run(loader, nullptr);
  CHECK(claim->calls == 2);
  const std::string twice = strategy_error(
      s, {claim, std::make_shared<ClaimingHook>("theirs", 20, Claim::OptimizerStep)});
  CHECK(twice.find("'mine' and 'theirs' both replace the optimizer step") != std::string::npos);

  auto graph = std::make_shared<ClaimingHook>("graph", 10, Claim::ForwardBackward);
  data::DataLoader again(dataset, batches_of(2));
  launch::TrainingStrategy claimed({s.model.get()}, {s.optimizer.get()}, s.step, s.evaluate,
                                   s.manager, {graph}, 1);
  claimed.run(again, nullptr);
  CHECK(graph->calls == 2);
  CHECK(claimed.context().step == 2);
  // Nothing may act between a claimed forward and backward.
  const std::string inside =
      strategy_error(s, {std::make_shared<ClaimingHook>("graph", 10, Claim::ForwardBackward),
                         std::make_shared<launch::GradAccumulationHook>(2)});
  CHECK(inside.find("hook 'graph' runs forward and backward as one, so hook "
                    "'grad_accumulation' cannot act at before_backward") != std::string::npos);
}

TEST_CASE("begin, train_batch and end step the optimizer every accumulation_steps batches") {
  Setup s;
  auto recording = std::make_shared<RecordingHook>("recording", 10);
  auto accumulate = std::make_shared<launch::GradAccumulationHook>(3);
  launch::TrainingStrategy strategy({s.model.get()}, {s.optimizer.get()}, s.step, s.evaluate,
                                    s.manager, {recording, accumulate}, 1);
  strategy.begin();
  auto dataset = test_data(2);
  const std::vector<int64_t> both = {0, 1};
  for (int i = 0; i < 7; ++i) {
    data::Batch batch = dataset->get_batch(both);
    strategy.train_batch(batch);
    CHECK(strategy.context().step == (i + 1) / 3);
    CHECK(strategy.context().loss.defined());
  }
  strategy.end();
  CHECK(strategy.context().micro_batches == 7);
  CHECK(std::count(recording->events.begin(), recording->events.end(), "after_optimizer_step@2") ==
        1);
  CHECK(std::count(recording->events.begin(), recording->events.end(), "after_optimizer_step@5") ==
        1);
  CHECK(recording->events.front() == "setup@0");
  CHECK(recording->events.back() == "after_training@7");
}

TEST_CASE("the sampler's set_epoch is called every epoch, and a distributed sampler is kept") {
  Setup s;
  auto sampler = std::make_shared<EpochRecordingSampler>();
  auto dataset = test_data(4);
  data::DataLoaderOptions options;
  options.batch_sampler = sampler;
  data::DataLoader loader(dataset, options);
  launch::TrainingStrategy strategy({s.model.get()}, {s.optimizer.get()}, s.step, s.evaluate,
                                    s.manager, {std::make_shared<launch::DDPHook>()}, 3);
  strategy.run(loader, nullptr);
  CHECK(&loader.batch_sampler() == sampler.get());
  // The loader forwards set_epoch at construction (epoch 0) and then once per epoch.
  REQUIRE(sampler->epochs.size() >= 3);
  CHECK(std::vector<int64_t>(sampler->epochs.end() - 3, sampler->epochs.end()) ==
        std::vector<int64_t>{0, 1, 2});
}

TEST_CASE("DDPHook does nothing at world size 1 and wraps the model and loader otherwise") {
  Setup s;
  // A frozen parameter that differs between ranks: DDP's module form broadcasts rank 0's.
  Tensor frozen = s.model->named_parameters().back().second;
  frozen.set_requires_grad(false);
  frozen.fill_(0.25 + s.manager.rank());
  auto dataset = test_data(12);
  data::DataLoader loader(dataset, batches_of(2, true));
  auto ddp = std::make_shared<launch::DDPHook>();
  launch::TrainingStrategy strategy({s.model.get()}, {s.optimizer.get()}, s.step, s.evaluate,
                                    s.manager, {ddp}, 1);
  strategy.run(loader, nullptr);
  if (s.manager.world_size() == 1) {
    CHECK(ddp->ddp() == nullptr);
    CHECK(strategy.context().ddp == nullptr);
    CHECK_FALSE(loader.batch_sampler().is_distributed());
    CHECK(loader.size() == 6);
  } else {
    CHECK(ddp->ddp() != nullptr);
    CHECK(frozen.to_vector<float>() == std::vector<float>(size_t(frozen.numel()), 0.25f));
    CHECK(loader.batch_sampler().is_distributed());
    CHECK(loader.size() == 6 / s.manager.world_size());
  }
}

TEST_CASE("validation counts every sample once, even when ranks are padded") {
  Setup s;
  auto dataset = test_data(5);  // odd: 2 ranks pad one repeat
  data::DataLoaderOptions options;
  options.batch_size = 2;
  options.num_replicas = s.manager.world_size();
  options.rank = s.manager.rank();
  data::DataLoader loader(dataset, options);
  launch::TrainingStrategy strategy({s.model.get()}, {s.optimizer.get()}, s.step, s.evaluate,
                                    s.manager, {}, 1);
  auto metrics = strategy.validate(loader);
  CHECK(metrics.at("val_samples") == 5.0);
  CHECK(metrics.at("val_accuracy") >= 0.0);
  CHECK(metrics.at("val_accuracy") <= 1.0);
}
