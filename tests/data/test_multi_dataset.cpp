// MultiDataset index mapping and batches, and MultiDatasetBatchSampler against the rules of
// ALCHEMI's MultiDatasetBatchSampler (data/multi_dataset.h): compositions (weights, counts,
// ratios, balanced), epoch policies with and without replacement and their errors, num_batches,
// the order of draws and within batches, the split of the global batch list across ranks,
// padding/truncation, and determinism.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include "data_test_util.h"
#include "mpigrad/data/hdf5_dataset.h"
#include "mpigrad/data/multi_dataset.h"

namespace {

using namespace mpigrad;        // NOLINT
using namespace mpigrad::data;  // NOLINT
using test::TempDir;

MultiDatasetBatchSamplerOptions with_counts(int64_t batch, std::vector<int64_t> counts) {
  MultiDatasetBatchSamplerOptions options;
  options.batch_size = batch;
  options.samples_per_dataset = BatchComposition::counts(std::move(counts));
  return options;
}

int64_t dataset_of(int64_t global, const std::vector<int64_t>& sizes) {
  int64_t d = 0;
  while (global >= sizes[size_t(d)]) global -= sizes[size_t(d++)];
  return d;
}

}  // namespace

TEST_CASE("MultiDataset joins children into one index space and tags samples") {
  TempDir dir;
  test::write_pattern_file(dir.file("a.h5"), 0, 5);
  test::write_pattern_file(dir.file("b.h5"), 100, 3);
  auto a = std::make_shared<Hdf5Dataset>(std::vector<std::string>{dir.file("a.h5")});
  auto b = std::make_shared<Hdf5Dataset>(std::vector<std::string>{dir.file("b.h5")});
  MultiDataset multi({a, b});
  CHECK(multi.size() == 8);
  CHECK(multi.to_global(1, 2) == 7);
  CHECK(multi.to_local(5) == std::pair<int, int64_t>{1, 0});
  CHECK(multi.to_local(4) == std::pair<int, int64_t>{0, 4});
  CHECK_THROWS_AS(multi.to_global(1, 3), core::Error);
  CHECK_THROWS_AS(multi.to_local(8), core::Error);
  Batch batch = multi.get_batch(std::vector<int64_t>{6, 0, 7, 4, 6});
  CHECK(batch["y"].to_vector<int64_t>() == std::vector<int64_t>{101, 0, 102, 4, 101});
  CHECK(batch.dataset_index.to_vector<int64_t>() == std::vector<int64_t>{1, 0, 1, 0, 1});
  CHECK(test::batch_matches(batch, {101, 0, 102, 4, 101}));

  // Children must agree on their fields.
  const std::string other = dir.file("other.h5");
  test::write_pattern_file(other, 0, 3, "x", "labels");
  Hdf5DatasetOptions options;
  options.fields = {"x", "labels"};
  auto c = std::make_shared<Hdf5Dataset>(std::vector<std::string>{other}, options);
  CHECK_THROWS_WITH_AS(MultiDataset({a, c}), doctest::Contains("labels"), core::Error);
}

TEST_CASE("BatchComposition: counts are exact, any float makes ratios, largest remainder rounds") {
  CHECK(largest_remainder({1, 1}, 5) == std::vector<int64_t>{3, 2});  // tie to the lower index
  CHECK(largest_remainder({0.7, 0.3}, 10) == std::vector<int64_t>{7, 3});
  CHECK(largest_remainder({1, 1, 1}, 8) == std::vector<int64_t>{3, 3, 2});
  CHECK(largest_remainder({1, 1, 6}, 9) == std::vector<int64_t>{1, 1, 7});  // 1.125, 1.125, 6.75
  CHECK(BatchComposition::parse("3,1").resolve(4, 2) == std::vector<int64_t>{3, 1});
  CHECK(BatchComposition::parse("2, 1.0").resolve(6, 2) == std::vector<int64_t>{4, 2});  // ratios
  CHECK(BatchComposition::parse("0.5,0.5").resolve(5, 2) == std::vector<int64_t>{3, 2});
  CHECK(BatchComposition::parse("balanced").resolve(8, 3) == std::vector<int64_t>{3, 3, 2});
  CHECK(BatchComposition::from_values({int64_t(1), 2.0}).resolve(3, 2) ==
        std::vector<int64_t>{1, 2});
  CHECK_THROWS_WITH_AS(BatchComposition::parse("3,2").resolve(4, 2), doctest::Contains("sum to 5"),
                       core::Error);
  CHECK_THROWS_WITH_AS(BatchComposition::parse("3,1").resolve(4, 3),
                       doctest::Contains("3 datasets"), core::Error);
  CHECK_THROWS_AS(BatchComposition::parse("a,b"), core::Error);
  CHECK_THROWS_AS(BatchComposition::parse("0.0,0.0").resolve(4, 2), core::Error);
  CHECK_THROWS_AS(BatchComposition::parse("-1,5").resolve(4, 2), core::Error);
  // text() reads back as the same composition (a config file's value).
  CHECK(BatchComposition::parse("16, 16").text() == "16,16");
  CHECK(BatchComposition::parse("0.7,0.3").text() == "0.7,0.3");
  CHECK(BatchComposition::parse("2, 1.0").text() == "2.0,1.0");  // still ratios
  CHECK(BatchComposition::parse("2, 1.0").resolve(6, 2) ==
        BatchComposition::parse(BatchComposition::parse("2, 1.0").text()).resolve(6, 2));
  CHECK(BatchComposition::balanced().text() == "balanced");
}

TEST_CASE("MultiDatasetBatchSampler: composition of every batch") {
  const std::vector<int64_t> sizes = {60, 20};
  MultiDatasetBatchSamplerOptions defaults;  // weights = sizes
  defaults.batch_size = 8;
  defaults.replacement = false;
  MultiDatasetBatchSampler by_size(sizes, defaults);
  CHECK(by_size.samples_per_batch() == std::vector<int64_t>{6, 2});
  CHECK(by_size.size() == 10);  // dataset_size without replacement: min(60 / 6, 20 / 2)
  std::set<int64_t> seen;
  for (const auto& batch : by_size.batches()) {
    REQUIRE(batch.size() == 8);
    int from_first = 0;
    for (int64_t index : batch) from_first += dataset_of(index, sizes) == 0;
    CHECK(from_first == 6);
    seen.insert(batch.begin(), batch.end());
  }
  CHECK(seen.size() == 80);  // without replacement: every sample exactly once

  auto weights = defaults;
  weights.weights = std::vector<double>{1, 3};
  weights.epoch_policy = EpochPolicy::MinSize;
  CHECK(MultiDatasetBatchSampler(sizes, weights).samples_per_batch() == std::vector<int64_t>{2, 6});
  CHECK(MultiDatasetBatchSampler(sizes, weights).size() == 3);  // 20 / 6

  auto both = weights;
  both.samples_per_dataset = BatchComposition::balanced();
  CHECK_THROWS_WITH_AS(MultiDatasetBatchSampler(sizes, both), doctest::Contains("not both"),
                       core::Error);
  auto balanced = defaults;
  balanced.samples_per_dataset = BatchComposition::balanced();
  balanced.epoch_policy = EpochPolicy::MinSize;
  CHECK(MultiDatasetBatchSampler(sizes, balanced).samples_per_batch() ==
        std::vector<int64_t>{4, 4});
}

TEST_CASE("MultiDatasetBatchSampler: epoch policies, replacement and their errors") {
  const std::vector<int64_t> sizes = {100, 10};
  auto options = with_counts(10, {5, 5});
  options.replacement = false;
  options.epoch_policy = EpochPolicy::MinSize;
  CHECK(MultiDatasetBatchSampler(sizes, options).size() == 2);

  options.epoch_policy = EpochPolicy::MaxSize;
  CHECK_THROWS_WITH_AS(MultiDatasetBatchSampler(sizes, options),
                       doctest::Contains("impossible without replacement"), core::Error);
  // ALCHEMI: without replacement, dataset_size is min_size's count.
  options.epoch_policy = EpochPolicy::DatasetSize;
  CHECK(MultiDatasetBatchSampler(sizes, options).size() == 2);

  options.replacement = true;
  options.epoch_policy = EpochPolicy::MaxSize;
  MultiDatasetBatchSampler max_size(sizes, options);
  CHECK(max_size.size() == 20);
  for (const auto& batch : max_size.batches()) {
    int from_first = 0;
    for (int64_t index : batch) {
      from_first += dataset_of(index, sizes) == 0;
      CHECK(index < 110);
    }
    CHECK(from_first == 5);
  }
  options.epoch_policy = EpochPolicy::DatasetSize;
  CHECK(MultiDatasetBatchSampler(sizes, options).size() == 11);

  CHECK(parse_epoch_policy("max_size") == EpochPolicy::MaxSize);
  CHECK_THROWS_WITH_AS(parse_epoch_policy("longest"), doctest::Contains("dataset_size"),
                       core::Error);
  CHECK_THROWS_AS(MultiDatasetBatchSampler({0, 10}, with_counts(4, {2, 2})),
                  core::Error);  // empty child
}

TEST_CASE("MultiDatasetBatchSampler: whole batches split across ranks, padded or truncated") {
  const std::vector<int64_t> sizes = {30, 12};
  for (int64_t ranks : {1, 2, 3, 4, 5}) {
    for (bool drop_last : {false, true}) {
      CAPTURE(ranks);
      CAPTURE(drop_last);
      auto options = with_counts(4, {3, 1});  // min_size: 10 batches
      options.epoch_policy = EpochPolicy::MinSize;
      options.num_replicas = ranks;
      options.drop_last = drop_last;
      options.seed = 9;
      const int64_t global = 10;
      const int64_t per_rank = drop_last ? global / ranks : (global + ranks - 1) / ranks;
      std::vector<std::vector<int64_t>> reference;
      {
        auto single = options;
        single.num_replicas = 1;
        single.rank = 0;
        single.drop_last = false;
        reference = MultiDatasetBatchSampler(sizes, single).batches();  // the unsplit global order
        REQUIRE(int64_t(reference.size()) == global);
      }
      for (int64_t r = 0; r < ranks; ++r) {
        options.rank = r;
        MultiDatasetBatchSampler sampler(sizes, options);
        CHECK(sampler.is_distributed() == (ranks > 1));
        auto mine = sampler.batches();
        REQUIRE(int64_t(mine.size()) == per_rank);
        CHECK(sampler.size() == per_rank);
        for (int64_t i = 0; i < per_rank; ++i) {
          CHECK(mine[size_t(i)] ==
                reference[size_t((r + i * ranks) % global)]);  // r, r+R, ...; pad from start
        }
      }
    }
  }
  auto too_few = with_counts(4, {3, 1});
  too_few.epoch_policy = EpochPolicy::MinSize;
  too_few.num_replicas = 16;
  too_few.drop_last = true;
  CHECK_THROWS_WITH_AS(MultiDatasetBatchSampler(sizes, too_few),
                       doctest::Contains("fewer than the 16 ranks"), core::Error);
}

TEST_CASE("MultiDatasetBatchSampler: the order is a function of seed + epoch") {
  auto options = with_counts(6, {4, 2});
  options.epoch_policy = EpochPolicy::MinSize;
  options.seed = 3;
  MultiDatasetBatchSampler a({40, 40}, options), b({40, 40}, options);
  CHECK(a.batches() == b.batches());
  auto epoch0 = a.batches();
  a.set_epoch(1);
  CHECK(a.batches() != epoch0);
  b.set_epoch(1);
  CHECK(a.batches() == b.batches());
  options.replacement = true;
  MultiDatasetBatchSampler c({40, 40}, options), d({40, 40}, options);
  CHECK(c.batches() == d.batches());
  options.shuffle = false;
  options.replacement = false;
  MultiDatasetBatchSampler ordered({40, 40}, options);
  CHECK(ordered.batches()[0] == std::vector<int64_t>{0, 1, 2, 3, 40, 41});
}

TEST_CASE("MultiDatasetBatchSampler: ALCHEMI's epoch lengths, rule by rule") {
  // Children of 10 and 7 samples, 3 and 2 per batch: floor 3 and 3, ceil 4 and 4; or with
  // 4 and 1 per batch: floor 2 and 7, ceil 3 and 7.
  auto make = [](std::vector<int64_t> counts, EpochPolicy policy, bool replacement) {
    auto options = with_counts(counts[0] + counts[1], counts);
    options.epoch_policy = policy;
    options.replacement = replacement;
    return MultiDatasetBatchSampler({10, 7}, options).size();
  };
  // Without replacement: floor(n_d / k_d); dataset_size is min_size's.
  CHECK(make({4, 1}, EpochPolicy::MinSize, false) == 2);
  CHECK(make({4, 1}, EpochPolicy::DatasetSize, false) == 2);
  CHECK(make({3, 2}, EpochPolicy::MaxSize, false) == 3);  // equal counts: allowed
  CHECK_THROWS_WITH_AS(make({4, 1}, EpochPolicy::MaxSize, false), doctest::Contains("max_size"),
                       core::Error);
  // With replacement: ceil(n_d / k_d); dataset_size is ceil(sum n_d / batch_size).
  CHECK(make({4, 1}, EpochPolicy::MinSize, true) == 3);
  CHECK(make({4, 1}, EpochPolicy::MaxSize, true) == 7);
  CHECK(make({4, 1}, EpochPolicy::DatasetSize, true) == 4);  // ceil(17 / 5)
  CHECK(make({3, 2}, EpochPolicy::DatasetSize, true) == 4);

  // num_batches replaces the policy; without replacement it may not pass the complete batches.
  auto options = with_counts(5, {4, 1});
  options.num_batches = 9;
  CHECK(MultiDatasetBatchSampler({10, 7}, options).size() == 9);
  options.replacement = false;
  CHECK_THROWS_WITH_AS(MultiDatasetBatchSampler({10, 7}, options),
                       doctest::Contains("only 2 complete batches"), core::Error);
  options.num_batches = 2;
  CHECK(MultiDatasetBatchSampler({10, 7}, options).size() == 2);
}

TEST_CASE("MultiDatasetBatchSampler: weights, ratios and counts may not favour an empty child") {
  MultiDatasetBatchSamplerOptions options;
  options.batch_size = 4;
  options.weights = std::vector<double>{1.0, 0.01};  // dataset 1's share rounds to 0
  CHECK_THROWS_WITH_AS(MultiDatasetBatchSampler({10, 0}, options),
                       doctest::Contains("dataset 1 has weight 0.01 but no samples"), core::Error);
  options.weights = std::vector<double>{1.0, 0.0};
  CHECK(MultiDatasetBatchSampler({10, 0}, options).samples_per_batch() ==
        std::vector<int64_t>{4, 0});
  options.weights.reset();
  options.samples_per_dataset = BatchComposition::parse("1.0, 0.01");
  CHECK_THROWS_WITH_AS(MultiDatasetBatchSampler({10, 0}, options),
                       doctest::Contains("has ratio 0.01 but no samples"), core::Error);
  options.samples_per_dataset = BatchComposition::counts({3, 1});
  CHECK_THROWS_WITH_AS(MultiDatasetBatchSampler({10, 0}, options),
                       doctest::Contains("contributes 1 samples per batch but has no samples"),
                       core::Error);
}

TEST_CASE("MultiDatasetBatchSampler: draws, walks and the order within each batch") {
  const std::vector<int64_t> sizes = {5, 3};
  // Replacement without shuffle walks each child in order, wrapping around.
  auto walk = with_counts(3, {2, 1});
  walk.shuffle = false;
  walk.num_batches = 4;
  CHECK(MultiDatasetBatchSampler(sizes, walk).batches() ==
        std::vector<std::vector<int64_t>>{{0, 1, 5}, {2, 3, 6}, {4, 0, 7}, {1, 2, 5}});

  // Shuffle: the composition holds, the datasets are interleaved within a batch.
  auto shuffled = with_counts(4, {2, 2});
  shuffled.replacement = false;
  shuffled.seed = 5;
  MultiDatasetBatchSampler sampler({40, 40}, shuffled);
  bool interleaved = false;
  std::set<int64_t> seen;
  for (const auto& batch : sampler.batches()) {
    int first = 0;
    for (int64_t index : batch) first += index < 40;
    CHECK(first == 2);
    interleaved = interleaved || !(batch[0] < 40 && batch[1] < 40);
    seen.insert(batch.begin(), batch.end());
  }
  CHECK(interleaved);
  CHECK(seen.size() == 80);

  // Replacement with shuffle: uniform draws, each batch's composition kept.
  auto drawn = with_counts(4, {3, 1});
  drawn.num_batches = 50;
  for (const auto& batch : MultiDatasetBatchSampler(sizes, drawn).batches()) {
    int first = 0;
    for (int64_t index : batch) {
      CHECK(index < 8);
      first += index < 5;
    }
    CHECK(first == 3);
  }
}
