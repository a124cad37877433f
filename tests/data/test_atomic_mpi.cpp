// Ragged batches under mpirun: every rank opens the same Zarr store at once and reads only its
// own structures through a DataLoader (worker threads, shuffled, by count of structures and by
// atom budget); each batch holds the right atoms, every rank yields the same number of batches,
// and together the ranks cover the store.
#include <doctest/doctest.h>
#include <mpi.h>

#include <numeric>
#include <set>

#include "atomic_test_util.h"
#include "mpigrad/data/atom_budget_sampler.h"
#include "mpigrad/data/atomic_dataset.h"
#include "mpigrad/data/data_loader.h"

namespace {

using namespace mpigrad;        // NOLINT
using namespace mpigrad::data;  // NOLINT

int rank_of_world() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
int size_of_world() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// Rank 0 writes the store; every rank learns its path.
std::string shared_store(std::unique_ptr<test::TempDir>& owner, const std::vector<int64_t>& atoms) {
  std::string path;
  if (rank_of_world() == 0) {
    owner = std::make_unique<test::TempDir>();
    path = owner->file("store.zarr");
    test::write_zarr_store(path, test::test_store_arrays(atoms), int64_t(atoms.size()),
                           {.chunk_rows = 7, .shard_rows = 14});
  }
  int length = int(path.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  path.resize(size_t(length));
  MPI_Bcast(path.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

std::vector<int64_t> gather(const std::vector<int64_t>& mine) {
  int count = int(mine.size());
  std::vector<int> counts(static_cast<size_t>(size_of_world())),
      offsets(static_cast<size_t>(size_of_world()));
  MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::partial_sum(counts.begin(), counts.end() - 1, offsets.begin() + 1);
  std::vector<int64_t> all(size_t(offsets.back() + counts.back()));
  MPI_Allgatherv(mine.data(), count, MPI_INT64_T, all.data(), counts.data(), offsets.data(),
                 MPI_INT64_T, MPI_COMM_WORLD);
  return all;
}

std::vector<int64_t> test_atoms() {
  std::vector<int64_t> atoms;
  for (int i = 0; i < 53; ++i) atoms.push_back(1 + (i * 7) % 9);  // 53: divides by neither 2 nor 4
  return atoms;
}

// The batch holds exactly its structures' atoms, in order, with a consistent batch index.
void check_structures(const Batch& batch, const std::vector<int64_t>& atoms) {
  std::vector<int64_t> first = {0};
  for (int64_t n : atoms) first.push_back(first.back() + n);
  const auto ptr = batch["atoms_ptr"].to_vector<int64_t>();
  const auto positions = batch["positions"].to_vector<float>();
  const auto index = batch["batch"].to_vector<int64_t>();
  REQUIRE(int64_t(ptr.size()) == batch.size() + 1);
  for (int64_t i = 0; i < batch.size(); ++i) {
    const int64_t s = batch.indices[size_t(i)];
    CHECK(ptr[size_t(i) + 1] - ptr[size_t(i)] == atoms[size_t(s)]);
    for (int64_t a = ptr[size_t(i)]; a < ptr[size_t(i) + 1]; ++a) {
      CHECK(index[size_t(a)] == i);
      CHECK(positions[size_t(a * 3)] == test::position(first[size_t(s)] + a - ptr[size_t(i)], 0));
    }
  }
  const auto pairs = batch["edge_index"].to_vector<int64_t>();
  for (int64_t value : pairs) CHECK((value >= 0 && value < ptr.back()));
}

}  // namespace

TEST_CASE("ragged batches: each rank reads its own structures of one store") {
  std::unique_ptr<test::TempDir> owner;
  const std::vector<int64_t> atoms = test_atoms();
  const std::string path = shared_store(owner, atoms);
  const int64_t ranks = size_of_world(), rank = rank_of_world();
  auto dataset = std::make_shared<AtomicDataset>(path);
  DataLoaderOptions options;
  options.batch_size = 4;
  options.shuffle = true;
  options.seed = 23;
  options.num_replicas = ranks;
  options.rank = rank;
  options.num_workers = 2;
  DataLoader loader(dataset, options);
  loader.set_epoch(2);
  std::vector<int64_t> mine;
  int64_t batches = 0;
  for (Batch& batch : loader) {
    check_structures(batch, atoms);
    mine.insert(mine.end(), batch.indices.begin(), batch.indices.end());
    ++batches;
  }
  CHECK(batches == loader.size());
  const std::vector<int64_t> counts = gather({batches});
  CHECK(std::set<int64_t>(counts.begin(), counts.end()).size() == 1);  // the same on every rank
  const std::vector<int64_t> all = gather(mine);
  CHECK(std::set<int64_t>(all.begin(), all.end()).size() == atoms.size());
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("ragged batches by atom budget: equal batch counts, the global grouping split by rank") {
  std::unique_ptr<test::TempDir> owner;
  const std::vector<int64_t> atoms = test_atoms();
  const std::string path = shared_store(owner, atoms);
  const int64_t ranks = size_of_world(), rank = rank_of_world();
  auto dataset = std::make_shared<AtomicDataset>(path);
  for (bool drop_last : {false, true}) {
    CAPTURE(drop_last);
    AtomBudgetOptions budget{.max_atoms = 20,
                             .shuffle = true,
                             .seed = 5,
                             .num_replicas = ranks,
                             .rank = rank,
                             .drop_last = drop_last};
    auto sampler = std::make_shared<AtomBudgetBatchSampler>(dataset->atom_counts(), budget);
    DataLoaderOptions options;
    options.batch_sampler = sampler;
    options.num_workers = 2;
    DataLoader loader(dataset, options);
    std::vector<int64_t> sizes;
    int64_t batches = 0;
    for (Batch& batch : loader) {
      check_structures(batch, atoms);
      int64_t total = 0;
      for (int64_t s : batch.indices) total += atoms[size_t(s)];
      CHECK(total <= 20);
      CHECK(batch["positions"].shape()[0] == total);
      sizes.push_back(batch.size());
      ++batches;
    }
    const std::vector<int64_t> counts = gather({batches});
    CHECK(std::set<int64_t>(counts.begin(), counts.end()).size() == 1);
    // Rank r read the global batches r, r + R, ... of the same grouping.
    const auto global = sampler->grouped();
    for (int64_t i = 0; i < batches; ++i) {
      CHECK(sizes[size_t(i)] ==
            int64_t(global[size_t((rank + i * ranks) % int64_t(global.size()))].size()));
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
