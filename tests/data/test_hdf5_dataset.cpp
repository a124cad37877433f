// Hdf5Dataset: fields and shapes from the files, batches of arbitrary indices across shards
// (runs, duplicates, reversed order), the open-file cap, chunked files, and slice mode.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>

#include "data_test_util.h"
#include "mpigrad/data/hdf5_dataset.h"
#include "mpigrad/data/sampler.h"

namespace {

using namespace mpigrad;        // NOLINT
using namespace mpigrad::data;  // NOLINT
using test::batch_matches;
using test::TempDir;

std::vector<int64_t> slice_globals(IndexSlice slice, int64_t total,
                                   const std::vector<int64_t>& local) {
  std::vector<int64_t> globals;
  for (int64_t i : local) globals.push_back((slice.begin + i) % total);
  return globals;
}

}  // namespace

TEST_CASE("Hdf5Dataset: fields, dtypes and per-sample shapes come from the files") {
  TempDir dir;
  auto paths = test::write_pattern_shards(dir, {5, 7});
  Hdf5Dataset dataset(paths);
  CHECK(dataset.size() == 12);
  CHECK(dataset.num_shards() == 2);
  CHECK(dataset.shard_size(1) == 7);
  REQUIRE(dataset.fields().size() == 2);
  CHECK(dataset.field("x").dtype == core::kUInt8);
  CHECK(dataset.field("x").sample_shape == core::Shape{2, 3});
  CHECK(dataset.field("y").dtype == core::kInt64);
  CHECK(dataset.field("y").sample_shape == core::Shape{});

  // Configurable names, and a subset of the fields.
  const std::string renamed = dir.file("renamed.h5");
  test::write_pattern_file(renamed, 0, 4, "images", "labels");
  Hdf5DatasetOptions options;
  options.fields = {"labels"};
  Hdf5Dataset labels_only({renamed}, options);
  Batch batch = labels_only.get_batch(std::vector<int64_t>{3, 1});
  CHECK(batch.fields.size() == 1);
  CHECK(batch["labels"].to_vector<int64_t>() == std::vector<int64_t>{3, 1});
}

TEST_CASE("Hdf5Dataset: batches of arbitrary indices across shards, layouts and access patterns") {
  TempDir dir;
  const std::vector<core::hdf5::DatasetLayout> layouts = {{}, {4, 0}, {3, 4}};
  for (size_t l = 0; l < layouts.size(); ++l) {
    auto paths = test::write_pattern_shards(dir, {10, 1, 13, 6}, layouts[l],
                                            "layout" + std::to_string(l) + "_");
    for (AccessPattern access : {AccessPattern::Random, AccessPattern::Sequential}) {
      CAPTURE(l);
      Hdf5DatasetOptions options;
      options.access = access;
      Hdf5Dataset dataset(paths, options);
      REQUIRE(dataset.size() == 30);
      const std::vector<std::vector<int64_t>> requests = {
          {0, 1, 2, 3},            // one run, in order: read straight into the batch
          {8, 9, 10, 11, 12},      // a run crossing two shard boundaries
          {29, 0, 15, 14, 13, 5},  // reversed runs and scattered samples
          {7, 7, 3, 7, 3},         // duplicates
          {11},                    // the one-sample shard
          {}};
      for (const auto& request : requests) {
        CAPTURE(request.size());
        CHECK(batch_matches(dataset.get_batch(request), request));
      }
      // A whole shuffled epoch in batches of 7.
      std::vector<int64_t> order = random_permutation(30, 3);
      for (size_t start = 0; start < order.size(); start += 7) {
        std::vector<int64_t> batch(
            order.begin() + std::ptrdiff_t(start),
            order.begin() + std::ptrdiff_t(std::min(order.size(), start + 7)));
        CHECK(batch_matches(dataset.get_batch(batch), batch));
      }
    }
  }
}

TEST_CASE("Hdf5Dataset: at most max_open_files shards are open at once") {
  TempDir dir;
  auto paths = test::write_pattern_shards(dir, {3, 4, 5, 3, 2, 6});
  Hdf5DatasetOptions options;
  options.max_open_files = 2;
  Hdf5Dataset dataset(paths, options);
  CHECK(dataset.open_files() <= 2);
  std::vector<int64_t> order = random_permutation(dataset.size(), 11);
  for (size_t start = 0; start < order.size(); start += 5) {
    std::vector<int64_t> batch(order.begin() + std::ptrdiff_t(start),
                               order.begin() + std::ptrdiff_t(std::min(order.size(), start + 5)));
    CHECK(batch_matches(dataset.get_batch(batch), batch));
    CHECK(dataset.open_files() <= 2);
  }
}

TEST_CASE("rank_slice follows DistributedSampler's counts") {
  // 10 samples, 4 ranks: ceil = 3 each, the last rank wrapping; drop_last: 2 each.
  CHECK(rank_slice(10, 4, 0, false).begin == 0);
  CHECK(rank_slice(10, 4, 3, false).begin == 9);
  CHECK(rank_slice(10, 4, 3, false).length == 3);
  CHECK(rank_slice(10, 4, 2, true).begin == 4);
  CHECK(rank_slice(10, 4, 2, true).length == 2);
  CHECK(rank_slice(8, 4, 3, true).begin == 6);
  CHECK_THROWS_AS(rank_slice(3, 4, 0, false), core::Error);
  CHECK_THROWS_AS(rank_slice(10, 4, 4, false), core::Error);
}

TEST_CASE("Hdf5Dataset slice mode: on demand and in memory agree, wrapping past the end") {
  TempDir dir;
  auto paths = test::write_pattern_shards(dir, {4, 5, 2});  // 11 samples
  for (bool drop_last : {false, true}) {
    for (int64_t rank = 0; rank < 3; ++rank) {
      CAPTURE(rank);
      CAPTURE(drop_last);
      Hdf5Dataset on_demand(paths), in_memory(paths);
      on_demand.set_rank_slice(3, rank, drop_last, false);
      in_memory.set_rank_slice(3, rank, drop_last, true);
      CHECK(in_memory.in_memory());
      CHECK(in_memory.open_files() == 0);
      const int64_t length = drop_last ? 3 : 4;
      REQUIRE(on_demand.size() == length);
      REQUIRE(in_memory.size() == length);
      std::vector<int64_t> all(static_cast<size_t>(length));
      std::iota(all.begin(), all.end(), 0);
      std::vector<int64_t> shuffled = all;
      std::reverse(shuffled.begin(), shuffled.end());
      shuffled.push_back(0);
      for (const auto& local : {all, shuffled}) {
        auto expected = slice_globals(*on_demand.slice(), 11, local);
        CHECK(batch_matches(on_demand.get_batch(local), expected));
        CHECK(batch_matches(in_memory.get_batch(local), expected));
      }
      CHECK_THROWS_AS(on_demand.get_batch(std::vector<int64_t>{length}), core::Error);
    }
  }
  // Without drop_last the last rank's slice wraps to the start: 8, 9, 10, 0.
  Hdf5Dataset last(paths);
  last.set_rank_slice(3, 2, false, true);
  CHECK(last.get_batch(std::vector<int64_t>{0, 1, 2, 3})["y"].to_vector<int64_t>() ==
        std::vector<int64_t>{8, 9, 10, 0});
}
