// Two-stage training under mpirun (1, 2 and 4 ranks): embeddings gathered across uneven shards,
// retrieval metrics split over ranks, the SupCon step, loading an encoder by name, and a
// classifier with a frozen encoder trained through DDP (no hang, encoder untouched).
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/data/tensor_dataset.h"
#include "mpigrad/launch/config/train_setup.h"
#include "mpigrad/launch/train/embeddings.h"
#include "mpigrad/launch/train/hooks/ddp_hook.h"
#include "mpigrad/launch/train/hooks/logging_hook.h"
#include "mpigrad/launch/train/training_steps.h"
#include "mpigrad/nn/checkpoint.h"
#include "mpigrad/nn/encoder_with_head.h"
#include "mpigrad/nn/optim/sgd.h"

using namespace mpigrad;  // NOLINT
using core::Tensor;

namespace {

// n samples of x float32 [6] (class means apart, so a model can learn them) and y = i % 3.
std::shared_ptr<data::TensorDataset> feature_data(int64_t n) {
  core::Generator generator(5);
  std::vector<float> noise = core::randn({n, 6}, generator).to_vector<float>();
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < n; ++i) {
    labels.push_back(i % 3);
    noise[size_t(i * 6 + i % 3)] += 3.0f;
  }
  return std::make_shared<data::TensorDataset>(
      std::vector<std::pair<std::string, Tensor>>{{"x", Tensor::from_vector<float>(noise, {n, 6})},
                                                  {"y", Tensor::from_vector<int64_t>(labels, {n})}},
      "in-memory features");
}

data::DataLoaderOptions shard_of(launch::DistributedManager& manager, int64_t batch_size) {
  data::DataLoaderOptions options;
  options.batch_size = batch_size;
  options.num_replicas = manager.world_size();
  options.rank = manager.rank();
  return options;
}

launch::ModelSection mlp_encoder_section() {
  launch::ModelSection model;
  model.name = launch::ModelKind::Mlp;
  model.hidden = {8};
  model.projection = 4;
  return model;
}

// A file name every rank agrees on (rank 0's pid).
std::string shared_path(launch::DistributedManager& manager, const std::string& name) {
  Tensor pid = Tensor::from_vector<int64_t>({int64_t(::getpid())}, {1});
  manager.world().broadcast(pid, 0);
  return (std::filesystem::temp_directory_path() /
          ("mpigrad-two-stage-" + std::to_string(pid.item<int64_t>()) + "-" + name))
      .string();
}

}  // namespace

TEST_CASE("gather_embeddings: every sample once, in dataset order, from uneven shards") {
  auto manager = launch::DistributedManager::initialize();
  // 11 samples: 2 and 4 ranks pad their shards with repeats, which must be dropped.
  auto dataset = feature_data(11);
  data::DataLoader loader(dataset, shard_of(manager, 2));
  // The embedding: 2 * x, so each row is recognisable.
  launch::Embeddings table =
      launch::gather_embeddings([](const Tensor& x) { return x * 2.0; }, loader, "x", "y", manager);
  REQUIRE(table.embeddings.shape() == core::Shape({11, 6}));
  const std::vector<float> expected = dataset->tensor("x").to_vector<float>();
  const std::vector<float> got = table.embeddings.to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == 2.0f * expected[i]);
  const std::vector<int64_t> indices = table.indices.to_vector<int64_t>();
  const std::vector<int64_t> labels = table.labels.to_vector<int64_t>();
  for (int64_t i = 0; i < 11; ++i) {
    CHECK(indices[size_t(i)] == i);
    CHECK(labels[size_t(i)] == i % 3);
  }
  // Split over the ranks, the metrics equal the serial ones.
  const nn::RetrievalMetrics serial = nn::retrieval_metrics(table.embeddings, table.labels);
  const nn::RetrievalMetrics split = launch::distributed_retrieval_metrics(table, manager);
  CHECK(split.queries == serial.queries);
  CHECK(split.precision_at_1 == doctest::Approx(serial.precision_at_1));
  CHECK(split.map_at_r == doctest::Approx(serial.map_at_r));
  CHECK(serial.precision_at_1 > 0.9);  // the classes are 3 standard deviations apart
}

TEST_CASE("supcon_step: the views, view-major, become SupConLoss's [batch, views, dim]") {
  core::Generator generator(8);
  const Tensor projections = nn::l2_normalize(core::randn({8, 3}, generator));  // 2 views x 4
  data::Batch batch;
  batch.indices = {0, 1, 2, 3};
  batch.set("x", projections);
  batch.set("y", Tensor::from_vector<int64_t>({0, 1, 0, 1}, {4}));
  nn::Identity identity;
  const nn::SupConOptions options{.temperature = 0.1, .base_temperature = 0.1};
  const double loss = launch::supcon_step("x", "y", options)(identity, batch).item<double>();
  // By hand: sample i's views are rows i and 4 + i.
  std::vector<float> rows = projections.to_vector<float>(), grouped;
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t v = 0; v < 2; ++v) {
      const auto row = rows.begin() + (v * 4 + i) * 3;
      grouped.insert(grouped.end(), row, row + 3);
    }
  }
  const double expected =
      nn::supcon_loss(Tensor::from_vector<float>(grouped, {4, 2, 3}), batch["y"], Tensor(), options)
          .item<double>();
  CHECK(loss == doctest::Approx(expected).epsilon(1e-6));
  // One view only is an error naming the field.
  data::Batch single = batch;
  single.set("x", projections.narrow(0, 0, 4));
  CHECK_THROWS_WITH_AS(launch::supcon_step("x", "y", options)(identity, single),
                       doctest::Contains("field 'x'"), core::Error);
}

TEST_CASE("classifier stage: the encoder loads by name, frozen through DDP, without a hang") {
  auto manager = launch::DistributedManager::initialize();
  const launch::ModelSection model_section = mlp_encoder_section();
  launch::TrainSection stage1;
  stage1.stage = launch::StageKind::SupCon;
  stage1.seed = 4;
  auto supcon = launch::make_stage_model(model_section, stage1, {6}, 3);
  const std::string path = shared_path(manager, "stage1.h5");
  if (manager.is_main_process()) nn::save_checkpoint(path, *supcon, nullptr, nullptr, 1, 1);
  manager.world().barrier();

  launch::TrainSection stage2;
  stage2.stage = launch::StageKind::Classifier;
  stage2.seed = 9;  // another seed: the encoder must come from the file
  auto model = std::dynamic_pointer_cast<nn::EncoderWithHead>(
      launch::make_stage_model(model_section, stage2, {6}, 3));
  REQUIRE(model != nullptr);
  launch::load_encoder(*model, path, "[train] init_from");
  const std::vector<float> loaded = model->state_dict().at("encoder.1.weight").to_vector<float>();
  CHECK(loaded == supcon->state_dict().at("encoder.1.weight").to_vector<float>());

  // Frozen: the optimizer holds the head only, DDP buckets only the head's gradients.
  std::unique_ptr<nn::Optimizer> optimizer =
      launch::make_optimizer(launch::OptimSection{.lr = 0.1}, *model);
  size_t optimized = 0;
  for (const auto& group : optimizer->param_groups()) optimized += group.params.size();
  CHECK(optimized == model->head().parameters().size());
  auto dataset = feature_data(60);
  data::DataLoaderOptions options;
  options.batch_size = 8;
  options.shuffle = true;
  data::DataLoader loader(dataset, options);
  auto ddp = std::make_shared<launch::DDPHook>();
  launch::TrainingStrategy strategy({model.get()}, {optimizer.get()},
                                    launch::classification_step("x", "y"),
                                    launch::classification_metrics("x", "y"), manager, {ddp}, 3);
  const std::vector<float> head_before = model->state_dict().at("head.0.weight").to_vector<float>();
  strategy.run(loader, nullptr);
  CHECK(model->state_dict().at("encoder.1.weight").to_vector<float>() == loaded);
  const std::vector<float> head_after = model->state_dict().at("head.0.weight").to_vector<float>();
  CHECK(head_after != head_before);
  // Every rank holds the same head (the averaged gradients).
  Tensor mine = Tensor::from_vector<float>(head_after, {int64_t(head_after.size())});
  Tensor rank0 = mine.clone();
  manager.world().broadcast(rank0, 0);
  CHECK(rank0.to_vector<float>() == head_after);

  // A checkpoint without the encoder's tensors, or with other shapes: errors naming the tensor.
  launch::ModelSection wider = model_section;
  wider.hidden = {5};
  auto other = std::dynamic_pointer_cast<nn::EncoderWithHead>(
      launch::make_stage_model(wider, stage2, {6}, 3));
  CHECK_THROWS_WITH_AS(launch::load_encoder(*other, path, "[train] init_from"),
                       doctest::Contains("tensor 'encoder.1.weight' has shape [8, 6]"),
                       core::Error);
  const std::string plain = shared_path(manager, "plain.h5");
  if (manager.is_main_process()) {
    core::Generator generator(1);
    nn::save_checkpoint(plain, *nn::make_mlp({6}, {8}, 3, 0.0, generator), nullptr, nullptr, 1, 1);
  }
  manager.world().barrier();
  CHECK_THROWS_WITH_AS(launch::load_encoder(*model, plain, "[train] init_from"),
                       doctest::Contains("holds no encoder.* tensors"), core::Error);
  manager.world().barrier();
  if (manager.is_main_process()) {
    std::filesystem::remove(path);
    std::filesystem::remove(plain);
  }
}
