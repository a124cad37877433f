// DataLoader: the identical batch sequence whatever the number of worker threads, epochs and
// resuming mid-epoch, sampler options and their conflicts, transforms, worker errors, and
// leaving an epoch early.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "data_test_util.h"
#include "mpigrad/core/cuda.h"
#include "mpigrad/data/data_loader.h"
#include "mpigrad/data/hdf5_dataset.h"
#include "mpigrad/data/multi_dataset.h"
#include "mpigrad/data/transforms.h"

namespace {

using namespace mpigrad;        // NOLINT
using namespace mpigrad::data;  // NOLINT
using test::TempDir;

struct Recorded {
  std::vector<std::vector<int64_t>> indices;
  std::vector<std::vector<uint8_t>> x_bytes;
  bool operator==(const Recorded& other) const {
    return indices == other.indices && x_bytes == other.x_bytes;
  }
};

Recorded run_epoch(DataLoader& loader) {
  Recorded recorded;
  for (Batch& batch : loader) {
    recorded.indices.push_back(batch.indices);
    const core::Tensor& x = batch["x"];
    const auto* bytes = static_cast<const uint8_t*>(x.data_ptr());
    recorded.x_bytes.emplace_back(bytes, bytes + x.nbytes());
    CHECK(test::batch_matches(batch, batch.indices));
  }
  return recorded;
}

// A dataset that fails on one index, to check worker errors reach the trainer.
class FailingDataset : public Dataset {
 public:
  explicit FailingDataset(std::shared_ptr<Dataset> inner) : inner_(std::move(inner)) {}
  int64_t size() const override { return inner_->size(); }
  const std::vector<FieldInfo>& fields() const override { return inner_->fields(); }
  std::string describe() const override { return "failing"; }
  Batch get_batch(std::span<const int64_t> indices) const override {
    for (int64_t i : indices) MPIGRAD_CHECK(i != 13, "FailingDataset: cannot read sample 13");
    return inner_->get_batch(indices);
  }

 private:
  std::shared_ptr<Dataset> inner_;
};

}  // namespace

TEST_CASE("DataLoader: the same batches in the same order with 0, 1 and 4 worker threads") {
  TempDir dir;
  auto dataset = std::make_shared<Hdf5Dataset>(test::write_pattern_shards(dir, {40, 23, 37}));
  std::vector<Recorded> runs;
  for (int workers : {0, 1, 4}) {
    for (int prefetch : {1, 3}) {
      DataLoaderOptions options;
      options.batch_size = 7;
      options.shuffle = true;
      options.seed = 5;
      options.num_workers = workers;
      options.prefetch_factor = prefetch;
      DataLoader loader(dataset, options);
      CHECK(loader.size() == 15);
      loader.set_epoch(2);
      runs.push_back(run_epoch(loader));
      CHECK(runs.back().indices.size() == 15);
      CHECK(runs.back().indices.back().size() == 2);  // 100 = 14 * 7 + 2
    }
  }
  for (size_t i = 1; i < runs.size(); ++i) CHECK(runs[i] == runs[0]);
}

TEST_CASE("DataLoader: epochs reshuffle, set_epoch_step resumes mid-epoch") {
  TempDir dir;
  auto dataset = std::make_shared<Hdf5Dataset>(test::write_pattern_shards(dir, {50}));
  DataLoaderOptions options;
  options.batch_size = 8;
  options.shuffle = true;
  options.drop_last = true;
  options.num_workers = 2;
  DataLoader loader(dataset, options);
  CHECK(loader.size() == 6);
  loader.set_epoch(0);
  Recorded epoch0 = run_epoch(loader);
  Recorded again = run_epoch(loader);
  CHECK(again == epoch0);  // no set_epoch: the same order, as in PyTorch
  loader.set_epoch(1);
  Recorded epoch1 = run_epoch(loader);
  CHECK(epoch1.indices != epoch0.indices);
  loader.set_epoch_step(4);
  Recorded resumed = run_epoch(loader);
  REQUIRE(resumed.indices.size() == 2);
  CHECK(resumed.indices[0] == epoch1.indices[4]);
  CHECK(resumed.indices[1] == epoch1.indices[5]);
  CHECK(run_epoch(loader).indices.size() == 6);  // the step applies once
  CHECK_THROWS_AS(loader.set_epoch_step(7), core::Error);
}

TEST_CASE("DataLoader: samplers, batch samplers, distribution and option conflicts") {
  TempDir dir;
  auto dataset = std::make_shared<Hdf5Dataset>(test::write_pattern_shards(dir, {21}));
  DataLoaderOptions both;
  both.sampler = std::make_shared<SequentialSampler>(21);
  both.batch_sampler = std::make_shared<BatchSampler>(both.sampler, 4, false);
  CHECK_THROWS_WITH_AS(DataLoader(dataset, both), doctest::Contains("not both"), core::Error);

  // num_replicas > 1 builds a DistributedSampler; a distributed sampler given is kept.
  DataLoaderOptions distributed;
  distributed.batch_size = 4;
  distributed.num_replicas = 2;
  distributed.rank = 1;
  DataLoader rank1(dataset, distributed);
  CHECK(rank1.size() == 3);  // ceil(21 / 2) = 11 samples
  CHECK(rank1.batch_sampler().is_distributed());
  Recorded got = run_epoch(rank1);
  CHECK(got.indices[0] == std::vector<int64_t>{1, 3, 5, 7});
  CHECK(got.indices[2] == std::vector<int64_t>{17, 19, 0});  // padded from the start

  auto given = std::make_shared<DistributedSampler>(21, 2, 1, false);
  distributed.sampler = given;
  DataLoader keeps(dataset, distributed);
  CHECK(run_epoch(keeps).indices == got.indices);
  distributed.sampler = std::make_shared<SequentialSampler>(21);
  CHECK_THROWS_WITH_AS(DataLoader(dataset, distributed), doctest::Contains("not distributed"),
                       core::Error);

  DataLoaderOptions too_many;
  too_many.num_replicas = 30;
  CHECK_THROWS_WITH_AS(DataLoader(dataset, too_many), doctest::Contains("fewer than the 30 ranks"),
                       core::Error);

  // A GPU target that this machine cannot serve fails when the loader is built, saying why
  // (tests/cuda/test_cuda_data_loader.cpp runs the device option where a GPU is).
  if (!core::cuda_is_available()) {
    DataLoaderOptions cuda;
    cuda.device = core::cuda(0);
    CHECK_THROWS_WITH_AS(DataLoader(dataset, cuda),
                         doctest::Contains("target device: DeviceBatchCopier: cuda:0 is not "
                                           "available: no GPU visible"),
                         core::Error);
  }
}

TEST_CASE("DataLoader over a MultiDataset with its batch sampler carries dataset_index") {
  TempDir dir;
  test::write_pattern_file(dir.file("a.h5"), 0, 30);
  test::write_pattern_file(dir.file("b.h5"), 30, 10);
  auto multi = std::make_shared<MultiDataset>(std::vector<std::shared_ptr<Dataset>>{
      std::make_shared<Hdf5Dataset>(std::vector<std::string>{dir.file("a.h5")}),
      std::make_shared<Hdf5Dataset>(std::vector<std::string>{dir.file("b.h5")})});
  MultiDatasetBatchSamplerOptions sampler_options;
  sampler_options.batch_size = 4;
  sampler_options.samples_per_dataset = BatchComposition::counts({3, 1});
  sampler_options.epoch_policy = EpochPolicy::MinSize;
  DataLoaderOptions options;
  options.batch_sampler = std::make_shared<MultiDatasetBatchSampler>(*multi, sampler_options);
  options.num_workers = 3;
  DataLoader loader(multi, options);
  int batches = 0;
  for (Batch& batch : loader) {
    ++batches;
    std::vector<int64_t> sources = batch.dataset_index.to_vector<int64_t>();
    std::sort(sources.begin(), sources.end());  // the batch's samples are shuffled among them
    CHECK(sources == std::vector<int64_t>{0, 0, 0, 1});
    CHECK(test::batch_matches(batch, batch.indices));
  }
  CHECK(batches == 10);
}

TEST_CASE("DataLoader: transforms run per batch; worker errors reach the trainer; early exit") {
  TempDir dir;
  auto dataset = std::make_shared<Hdf5Dataset>(test::write_pattern_shards(dir, {30}));
  DataLoaderOptions options;
  options.batch_size = 5;
  options.num_workers = 2;
  options.transform = normalize_transform("x", 1.0 / 255, {0.5}, {0.25});
  DataLoader loader(dataset, options);
  for (Batch& batch : loader) {
    const core::Tensor& x = batch["x"];
    REQUIRE(x.dtype() == core::kFloat32);
    CHECK(x.shape() == core::Shape{5, 2, 3});
    std::vector<float> values = x.to_vector<float>();
    for (int64_t i = 0; i < 5; ++i) {
      for (int64_t j = 0; j < test::kSampleElements; ++j) {
        float expected =
            (float(test::pattern(batch.indices[size_t(i)], j)) / 255.0f - 0.5f) / 0.25f;
        CHECK(values[size_t(i * test::kSampleElements + j)] ==
              doctest::Approx(expected).epsilon(1e-5));
      }
    }
  }
  auto per_channel = normalize_transform("x", 1.0, {1.0, 2.0}, {1.0, 4.0});
  Batch one = per_channel(dataset->get_batch(std::vector<int64_t>{0}));
  CHECK(one["x"].to_vector<float>() ==
        std::vector<float>{-1.0f, 12.0f, 25.0f, (39 - 2) / 4.0f, (52 - 2) / 4.0f, (65 - 2) / 4.0f});
  // Channel planes repeat per sample: sample 1's first plane takes channel 0's mean and std.
  std::vector<float> two =
      per_channel(dataset->get_batch(std::vector<int64_t>{0, 1}))["x"].to_vector<float>();
  REQUIRE(two.size() == size_t(2 * test::kSampleElements));
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < test::kSampleElements; ++j) {
      const bool second = j >= test::kSampleElements / 2;
      const float expected =
          (float(test::pattern(i, j)) - (second ? 2.0f : 1.0f)) / (second ? 4.0f : 1.0f);
      CHECK(two[size_t(i * test::kSampleElements + j)] == doctest::Approx(expected));
    }
  }

  DataLoaderOptions failing_options;
  failing_options.batch_size = 4;
  failing_options.num_workers = 3;
  DataLoader failing(std::make_shared<FailingDataset>(dataset), failing_options);
  int delivered = 0;
  CHECK_THROWS_WITH_AS(
      [&] {
        for (Batch& batch : failing) {
          (void)batch;
          ++delivered;
        }
      }(),
      doctest::Contains("sample 13"), core::Error);
  CHECK(delivered == 3);  // batches 0..2 come first, in order; batch 3 holds sample 13

  // Leaving an epoch early joins the workers without hanging.
  for (int repeat = 0; repeat < 3; ++repeat) {
    DataLoader early(dataset, options);
    for (Batch& batch : early) {
      (void)batch;
      break;
    }
  }
}
