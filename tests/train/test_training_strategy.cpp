// TrainingStrategy and its hooks, under mpirun -np 1 and 2: stage order and frequency, backward
// claims, set_epoch every epoch, DDPHook (a no-op at world size 1), and validation that counts
// padded samples once.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "mpigrad/core/rng.h"
#include "mpigrad/data/data_loader.h"
#include "mpigrad/data/sampler.h"
#include "mpigrad/data/tensor_dataset.h"
#include "mpigrad/launch/train/training_hooks.h"
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

// Records every stage it sees.
class RecordingHook final : public launch::Hook {
 public:
  explicit RecordingHook(int64_t every) : Hook(every) {}
  std::string name() const override { return "recording"; }
  void on(launch::HookStage stage, launch::TrainingContext& context) override {
    events.push_back(std::string(launch::hook_stage_name(stage)) + "@" +
                     std::to_string(context.micro_batches));
  }
  std::vector<std::string> events;
};

class ClaimingHook final : public launch::Hook {
 public:
  explicit ClaimingHook(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  void on(launch::HookStage, launch::TrainingContext&) override {}
  bool replaces_backward() const override { return true; }
  void backward(launch::TrainingContext& context) override {
    ++calls;
    context.loss.backward();
  }
  int calls = 0;

 private:
  std::string name_;
};

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
  auto every = std::make_shared<RecordingHook>(1);
  auto second = std::make_shared<RecordingHook>(2);
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

TEST_CASE("a hook may replace backward, but not two") {
  Setup s;
  auto claim = std::make_shared<ClaimingHook>("mine");
  auto dataset = test_data(4);
  data::DataLoader loader(dataset, batches_of(2));
  launch::TrainingStrategy strategy({s.model.get()}, {s.optimizer.get()}, s.step, s.evaluate,
                                    s.manager, {claim}, 1);
  strategy.run(loader, nullptr);
  CHECK(claim->calls == 2);
  auto other = std::make_shared<ClaimingHook>("theirs");
  try {
    launch::TrainingStrategy twice({s.model.get()}, {s.optimizer.get()}, s.step, s.evaluate,
                                   s.manager, {claim, other}, 1);
    FAIL("two backward claims were accepted");
  } catch (const core::Error& error) {
    std::string message = error.what();
    CHECK(message.find("'mine'") != std::string::npos);
    CHECK(message.find("'theirs'") != std::string::npos);
  }
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
