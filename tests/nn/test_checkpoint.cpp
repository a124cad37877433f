// Checkpoint tests: a bitwise-identical round trip of model, optimizer, scheduler and RNG state
// (training resumed from it continues exactly), the atomic write, and the errors for a corrupt
// or truncated file, a non-checkpoint file and mismatched shapes or dtypes.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/nn/checkpoint.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/batch_norm.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/layers/dropout.h"
#include "mpigrad/nn/layers/linear.h"
#include "mpigrad/nn/loss.h"
#include "mpigrad/nn/optim/adam.h"
#include "mpigrad/nn/optim/lr_scheduler.h"

namespace {

using namespace mpigrad;  // NOLINT
using core::Tensor;
namespace fs = std::filesystem;

std::shared_ptr<nn::Sequential> make_mlp(uint64_t seed) {
  core::Generator g(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 8, g), std::make_shared<nn::BatchNorm1d>(8),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Dropout>(0.3, nullptr, seed),
      std::make_shared<nn::Linear>(8, 3, g)});
}

struct Trainer {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<nn::AdamW> optimizer;
  std::unique_ptr<nn::CosineAnnealingLR> scheduler;
  explicit Trainer(uint64_t seed) : model(make_mlp(seed)) {
    optimizer = std::make_unique<nn::AdamW>(model->parameters());
    scheduler = std::make_unique<nn::CosineAnnealingLR>(*optimizer, 20);
  }
  double step(int i) {
    core::Generator data(100 + uint64_t(i));
    Tensor x = core::randn({5, 6}, data);
    Tensor y = Tensor::from_vector<int64_t>({0, 1, 2, 1, 0}, {5});
    optimizer->zero_grad();
    Tensor loss = nn::cross_entropy((*model)(x), y);
    loss.backward();
    optimizer->step();
    scheduler->step();
    return loss.item<double>();
  }
};

fs::path scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("mpigrad-test-nn-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

}  // namespace

TEST_CASE("checkpoint round trip is bitwise identical and resumes training exactly") {
  const fs::path path = scratch("round_trip.h5");
  Trainer original(1);
  for (int i = 0; i < 3; ++i) original.step(i);
  nn::save_checkpoint(path.string(), *original.model, original.optimizer.get(),
                      original.scheduler.get(), 2, 3, 4, "[optim]\nlr = 0.001\n");
  CHECK(fs::exists(path));
  for (const auto& entry : fs::directory_iterator(path.parent_path())) {
    CHECK(entry.path().string().find(".tmp") == std::string::npos);  // no temp left behind
  }

  Trainer resumed(99);  // different init, different dropout seed
  nn::CheckpointData info = nn::load_checkpoint_into(
      path.string(), *resumed.model, resumed.optimizer.get(), resumed.scheduler.get());
  CHECK(info.epoch == 2);
  CHECK(info.step == 3);
  CHECK(info.world_size == 4);
  CHECK(info.config == "[optim]\nlr = 0.001\n");
  const nn::StateDict a = original.model->state_dict(), b = resumed.model->state_dict();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a.tensors()[i].first == b.tensors()[i].first);
    CHECK(a.tensors()[i].second.dtype() == b.tensors()[i].second.dtype());
    CHECK(a.tensors()[i].second.to_vector<double>() == b.tensors()[i].second.to_vector<double>());
  }
  const nn::StateDict oa = original.optimizer->state_dict(), ob = resumed.optimizer->state_dict();
  CHECK(oa.size() == ob.size());
  for (const auto& [key, t] : oa.tensors())
    CHECK(ob.at(key).to_vector<double>() == t.to_vector<double>());
  for (const auto& [key, v] : oa.scalars()) CHECK(ob.scalar(key) == v);
  CHECK(resumed.scheduler->last_epoch() == 3);
  // Same weights, optimizer moments, lr and dropout stream: the next losses agree exactly.
  for (int i = 3; i < 6; ++i) CHECK(resumed.step(i) == original.step(i));

  // The raw reader sees PyTorch names and layouts.
  nn::CheckpointData raw = nn::load_checkpoint(path.string());
  CHECK(raw.model.at("0.weight").shape() == core::Shape({8, 6}));
  CHECK(raw.model.at("1.num_batches_tracked").dtype() == core::kInt64);
  CHECK(raw.optimizer.contains("state/0/exp_avg"));
  CHECK(raw.rng.size() == 1);
  CHECK(raw.rng[0].first == "model.3.generator");
  fs::remove_all(path.parent_path());
}

TEST_CASE("checkpoint errors: corrupt, truncated, foreign, mismatched shape and dtype") {
  const fs::path path = scratch("errors.h5");
  Trainer trainer(2);
  nn::save_checkpoint(path.string(), *trainer.model, nullptr, nullptr, 0, 0);

  // Mismatched shape: a model with a different hidden size.
  core::Generator g(3);
  nn::Sequential other{std::make_shared<nn::Linear>(6, 9, g), std::make_shared<nn::BatchNorm1d>(9),
                       std::make_shared<nn::ReLU>(), std::make_shared<nn::Dropout>(0.3),
                       std::make_shared<nn::Linear>(9, 3, g)};
  CHECK_THROWS_WITH_AS(
      nn::load_checkpoint_into(path.string(), other, nullptr, nullptr),
      doctest::Contains("'/model/0.weight' has shape [8, 6], the model expects [9, 6]"),
      core::Error);
  auto wide = make_mlp(2);
  wide->to(core::kFloat64);
  CHECK_THROWS_WITH_AS(nn::load_checkpoint_into(path.string(), *wide, nullptr, nullptr),
                       doctest::Contains("has dtype float32, the model expects float64"),
                       core::Error);

  // Truncated: half the bytes.
  const fs::path truncated = scratch("truncated.h5");
  fs::copy_file(path, truncated, fs::copy_options::overwrite_existing);
  fs::resize_file(truncated, fs::file_size(path) / 2);
  CHECK_THROWS_WITH_AS(nn::load_checkpoint(truncated.string()),
                       doctest::Contains(truncated.string().c_str()), core::Error);
  // Corrupt: not HDF5 at all.
  const fs::path garbage = scratch("garbage.h5");
  std::ofstream(garbage) << "this is not an HDF5 file";
  CHECK_THROWS_WITH_AS(nn::load_checkpoint(garbage.string()),
                       doctest::Contains(garbage.string().c_str()), core::Error);
  CHECK_THROWS_AS(nn::load_checkpoint(scratch("missing.h5").string()), core::Error);
  fs::remove_all(path.parent_path());
}

TEST_CASE("checkpoint checksum: a flipped bit in a tensor's bytes is an error naming the file") {
  const fs::path path = scratch("flipped.h5");
  Trainer trainer(4);
  // A value whose bytes occur once in the file, so the test can find and change them.
  const float marker = 1234567.125f;
  static_cast<float*>(trainer.model->parameters()[0].data_ptr())[0] = marker;
  nn::save_checkpoint(path.string(), *trainer.model, nullptr, nullptr, 0, 0);
  CHECK_NOTHROW(nn::load_checkpoint(path.string()));

  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  char pattern[sizeof(float)];
  std::memcpy(pattern, &marker, sizeof(float));
  const size_t at = bytes.find(std::string(pattern, sizeof(float)));
  REQUIRE(at != std::string::npos);
  bytes[at] = static_cast<char>(bytes[at] ^ 1);  // the lowest mantissa bit: still a valid float
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  CHECK_THROWS_WITH_AS(nn::load_checkpoint(path.string()),
                       doctest::Contains("does not match its checksum"), core::Error);
  CHECK_THROWS_WITH_AS(nn::load_checkpoint(path.string()), doctest::Contains(path.string().c_str()),
                       core::Error);
  fs::remove_all(path.parent_path());
}
