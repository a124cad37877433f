// Concurrent slice reads under mpirun: every rank opens the same shards at the same time and
// reads its own slice (on demand, in memory, and through a DataLoader with a DistributedSampler);
// together the ranks cover the dataset exactly as the samplers promise.
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "data_test_util.h"
#include "mpigrad/data/data_loader.h"
#include "mpigrad/data/hdf5_dataset.h"

namespace {

using namespace mpigrad;        // NOLINT
using namespace mpigrad::data;  // NOLINT

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// Rank 0 makes the directory and the files; every rank learns the path.
std::string shared_directory(std::unique_ptr<test::TempDir>& owner,
                             const std::vector<int64_t>& shard_sizes,
                             std::vector<std::string>& paths) {
  std::string path;
  if (world_rank() == 0) {
    owner = std::make_unique<test::TempDir>();
    paths = test::write_pattern_shards(*owner, shard_sizes);
    path = owner->path();
  }
  int length = int(path.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  path.resize(size_t(length));
  MPI_Bcast(path.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (world_rank() != 0) {
    test::TempDir view(path);
    for (size_t s = 0; s < shard_sizes.size(); ++s)
      paths.push_back(view.file("shard" + std::to_string(s) + ".h5"));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

std::vector<int64_t> gather_all(const std::vector<int64_t>& mine) {
  int count = int(mine.size());
  std::vector<int> counts(static_cast<size_t>(world_size())),
      offsets(static_cast<size_t>(world_size()));
  MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::partial_sum(counts.begin(), counts.end() - 1, offsets.begin() + 1);
  std::vector<int64_t> all(size_t(offsets.back() + counts.back()));
  MPI_Allgatherv(mine.data(), count, MPI_INT64_T, all.data(), counts.data(), offsets.data(),
                 MPI_INT64_T, MPI_COMM_WORLD);
  return all;
}

}  // namespace

TEST_CASE("every rank reads its own slice of the same files concurrently") {
  std::unique_ptr<test::TempDir> owner;
  std::vector<std::string> paths;
  shared_directory(owner, {400, 37, 566}, paths);  // 1003 samples: not divisible by 2 or 4
  const int64_t ranks = world_size(), rank = world_rank();
  for (bool in_memory : {false, true}) {
    for (bool drop_last : {false, true}) {
      CAPTURE(in_memory);
      CAPTURE(drop_last);
      auto dataset = std::make_shared<Hdf5Dataset>(paths);
      dataset->set_rank_slice(ranks, rank, drop_last, in_memory);
      DataLoaderOptions options;
      options.batch_size = 32;
      options.num_workers = 2;
      DataLoader loader(dataset, options);
      std::vector<int64_t> mine;
      const IndexSlice slice = *dataset->slice();
      for (Batch& batch : loader) {
        std::vector<int64_t> globals;
        for (int64_t i : batch.indices) globals.push_back((slice.begin + i) % 1003);
        CHECK(test::batch_matches(batch, globals));
        mine.insert(mine.end(), globals.begin(), globals.end());
      }
      std::vector<int64_t> all = gather_all(mine);
      const int64_t per_rank = drop_last ? 1003 / ranks : (1003 + ranks - 1) / ranks;
      CHECK(int64_t(mine.size()) == per_rank);
      CHECK(int64_t(all.size()) == per_rank * ranks);
      std::set<int64_t> distinct(all.begin(), all.end());
      CHECK(int64_t(distinct.size()) == (drop_last ? per_rank * ranks : 1003));
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);  // rank 0 removes the files only after everyone is done
}

TEST_CASE("DistributedSampler shards shuffled reads across ranks; order agrees on every rank") {
  std::unique_ptr<test::TempDir> owner;
  std::vector<std::string> paths;
  shared_directory(owner, {250, 250}, paths);
  const int64_t ranks = world_size(), rank = world_rank();
  auto dataset = std::make_shared<Hdf5Dataset>(paths);
  DataLoaderOptions options;
  options.batch_size = 16;
  options.shuffle = true;
  options.seed = 17;
  options.num_replicas = ranks;
  options.rank = rank;
  options.num_workers = 2;
  DataLoader loader(dataset, options);
  loader.set_epoch(3);
  std::vector<int64_t> mine;
  for (Batch& batch : loader) {
    CHECK(test::batch_matches(batch, batch.indices));
    mine.insert(mine.end(), batch.indices.begin(), batch.indices.end());
  }
  std::vector<int64_t> all = gather_all(mine);
  std::set<int64_t> distinct(all.begin(), all.end());
  CHECK(distinct.size() == 500);  // the union covers the dataset
  // What rank 0 computes for every rank matches what each rank read.
  DistributedSampler expected(500, ranks, rank, true, 17, false);
  expected.set_epoch(3);
  CHECK(expected.indices() == mine);
  MPI_Barrier(MPI_COMM_WORLD);
}
