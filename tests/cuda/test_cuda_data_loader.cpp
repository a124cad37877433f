// The DataLoader's device option (data/device_batch_copier.h): batches arrive on the GPU with
// the same content, in the same order, as the host loader's, with and without worker threads,
// and ops on the caller's stream (the default one, or a stream of its own) see the copied data
// without the caller waiting for the copies.
#include <doctest/doctest.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cuda_test.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/stream.h"
#include "mpigrad/data/data_loader.h"
#include "mpigrad/data/dataset.h"
#include "mpigrad/data/transforms.h"

namespace {

using namespace mpigrad;  // NOLINT
using core::Tensor;

// Sample i: x[j] = (3 i + j) % 251, uint8 [3, 4, 4]; y = i % 10.
class CountingDataset final : public data::Dataset {
 public:
  explicit CountingDataset(int64_t n)
      : n_(n),
        fields_{{"x", core::kUInt8, core::Shape{3, 4, 4}}, {"y", core::kInt64, core::Shape{}}} {}
  int64_t size() const override { return n_; }
  const std::vector<data::FieldInfo>& fields() const override { return fields_; }
  std::string describe() const override { return "counting dataset"; }
  data::Batch get_batch(std::span<const int64_t> indices) const override {
    data::check_indices(indices, n_, describe());
    const int64_t count = int64_t(indices.size());
    std::vector<uint8_t> x(static_cast<size_t>(count * 48));
    std::vector<int64_t> y(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      for (int64_t j = 0; j < 48; ++j) x[size_t(i * 48 + j)] = uint8_t((indices[i] * 3 + j) % 251);
      y[size_t(i)] = indices[size_t(i)] % 10;
    }
    data::Batch batch;
    batch.indices.assign(indices.begin(), indices.end());
    batch.set("x", Tensor::from_vector(x, {count, 3, 4, 4}));
    batch.set("y", Tensor::from_vector(y, {count}));
    return batch;
  }

 private:
  int64_t n_;
  std::vector<data::FieldInfo> fields_;
};

// Every batch of one epoch, on the host.
std::vector<data::Batch> host_epoch(data::DataLoader& loader) {
  std::vector<data::Batch> batches;
  for (data::Batch& batch : loader) {
    data::Batch copy = batch;
    for (auto& [name, tensor] : copy.fields) tensor = tensor.to(core::kCPU);
    batches.push_back(copy);
  }
  return batches;
}

}  // namespace

MPIGRAD_CUDA_TEST_CASE("DataLoader device option: same batches on the GPU, workers or not") {
  auto dataset = std::make_shared<CountingDataset>(203);
  data::DataLoaderOptions options;
  options.batch_size = 16;
  options.shuffle = true;
  options.seed = 5;
  options.transform = data::normalize_transform("x", 1.0 / 255.0, {0.5}, {0.25});
  data::DataLoader reference(dataset, options);
  reference.set_epoch(1);
  const std::vector<data::Batch> expected = host_epoch(reference);

  for (int workers : {0, 3}) {
    INFO("num_workers ", workers);
    data::DataLoaderOptions gpu = options;
    gpu.num_workers = workers;
    gpu.device = core::cuda(0);
    data::DataLoader loader(dataset, gpu);
    loader.set_epoch(1);
    size_t seen = 0;
    for (data::Batch& batch : loader) {
      REQUIRE(seen < expected.size());
      CHECK(batch.indices == expected[seen].indices);
      for (const auto& [name, tensor] : batch.fields) {
        INFO("field ", name);
        CHECK(tensor.device() == core::cuda(0));
        // Queued on the default stream right away: the loader made it wait for the copy.
        CHECK(tensor.to(core::kCPU).to_vector<double>() ==
              expected[seen][name].to_vector<double>());
      }
      ++seen;
    }
    CHECK(seen == expected.size());
  }
}

MPIGRAD_CUDA_TEST_CASE("DataLoader device option: a compute stream of the caller's own waits") {
  auto dataset = std::make_shared<CountingDataset>(96);
  data::DataLoaderOptions options;
  options.batch_size = 32;
  options.num_workers = 2;
  options.device = core::cuda(0);
  data::DataLoader loader(dataset, options);
  core::Stream compute(core::cuda(0));
  double total = 0;
  {
    core::StreamGuard on_compute(compute);
    for (int epoch = 0; epoch < 3; ++epoch) {
      loader.set_epoch(epoch);
      for (data::Batch& batch : loader) {
        // Queued on `compute`, which the loader ordered after the copy of this batch.
        total += core::sum(batch["y"].to(core::kFloat64)).item<double>();
      }
    }
  }
  double expected = 0;
  for (int64_t i = 0; i < 96; ++i) expected += double(i % 10);
  CHECK(total == doctest::Approx(3 * expected));
}
