// Ragged batches from atomic stores: AtomicDataset's batch (the contract of docs/
// interatomic-potentials.md) from Zarr and HDF5 alike, edge_index in batch rows and the image
// shifts, the same batch after `mpigrad data convert-zarr`, the DataLoader carrying ragged batches
// with worker threads (and to a GPU where one is visible), MultiDataset joining two stores
// structure by structure, the atom-budget sampler, open_training_data / make_batch_sampler, and
// the size classes of the batch buffers.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <set>
#include <sstream>

#include "atomic_test_util.h"
#include "mpigrad/core/cuda.h"
#include "mpigrad/data/atom_budget_sampler.h"
#include "mpigrad/data/atomic_dataset.h"
#include "mpigrad/data/batch_buffers.h"
#include "mpigrad/data/convert_zarr.h"
#include "mpigrad/data/data_loader.h"
#include "mpigrad/data/data_tool.h"
#include "mpigrad/data/multi_dataset.h"
#include "mpigrad/data/training_data.h"

namespace {

using namespace mpigrad;        // NOLINT
using namespace mpigrad::data;  // NOLINT
using test::TempDir;

const std::vector<int64_t> kAtoms = {3, 1, 4, 2, 5, 2};

std::vector<int64_t> prefix(const std::vector<int64_t>& counts) {
  std::vector<int64_t> ptr = {0};
  for (int64_t n : counts) ptr.push_back(ptr.back() + n);
  return ptr;
}

// Checks a batch of the test store's structures `samples` (store order = dataset order here).
void check_batch(const Batch& batch, const std::vector<int64_t>& samples,
                 const std::vector<int64_t>& atoms, bool edges = true) {
  const std::vector<int64_t> store_ptr = prefix(atoms);
  std::vector<int64_t> counts, edge_counts;
  for (int64_t s : samples) {
    counts.push_back(atoms[size_t(s)]);
    edge_counts.push_back(edges && atoms[size_t(s)] > 1 ? atoms[size_t(s)] : 0);
  }
  const std::vector<int64_t> ptr = prefix(counts), edge_ptr = prefix(edge_counts);
  const int64_t b = int64_t(samples.size()), v = ptr.back(), e = edge_ptr.back();
  REQUIRE(batch.size() == b);
  CHECK(batch["positions"].shape() == core::Shape{v, 3});
  CHECK(batch["atoms_ptr"].to_vector<int64_t>() == ptr);
  CHECK(batch["num_atoms"].to_vector<int64_t>() == counts);
  CHECK(batch["energy"].shape() == core::Shape{b});
  CHECK(batch["cell"].shape() == core::Shape{b, 3, 3});
  CHECK(batch["pbc"].dtype() == core::kBool);
  const auto positions = batch["positions"].to_vector<float>();
  const auto forces = batch["forces"].to_vector<float>();
  const auto numbers = batch["atomic_numbers"].to_vector<int64_t>();
  const auto index = batch["batch"].to_vector<int64_t>();
  const auto energy = batch["energy"].to_vector<float>();
  const auto cell = batch["cell"].to_vector<float>();
  const auto pbc = batch["pbc"].to_vector<uint8_t>();
  const auto stress = batch["stress"].to_vector<float>();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t s = samples[size_t(i)];
    CHECK(energy[size_t(i)] == test::energy(s));
    CHECK(cell[size_t(i * 9)] == float(s + 2));
    CHECK(cell[size_t(i * 9 + 1)] == 0.0f);
    CHECK(pbc[size_t(i * 3 + 1)] == (s % 2 == 1));
    CHECK(stress[size_t(i * 9 + 5)] == doctest::Approx(float(s) + 0.5f));
    for (int64_t a = 0; a < counts[size_t(i)]; ++a) {
      const int64_t row = ptr[size_t(i)] + a, g = store_ptr[size_t(s)] + a;
      CHECK(index[size_t(row)] == i);
      CHECK(numbers[size_t(row)] == test::atomic_number(g));
      for (int k = 0; k < 3; ++k) {
        CHECK(positions[size_t(row * 3 + k)] == test::position(g, k));
        CHECK(forces[size_t(row * 3 + k)] == test::force(g, k));
      }
    }
  }
  if (!edges) {
    CHECK_FALSE(batch.has("edge_index"));
    return;
  }
  CHECK(batch["edges_ptr"].to_vector<int64_t>() == edge_ptr);
  CHECK(batch["edge_index"].shape() == core::Shape{2, e});
  const auto pairs = batch["edge_index"].to_vector<int64_t>();
  const auto shifts = batch["edge_shifts"].to_vector<float>();
  std::vector<int64_t> store_edges = {0};
  for (int64_t n : atoms) store_edges.push_back(store_edges.back() + (n > 1 ? n : 0));
  for (int64_t i = 0; i < b; ++i) {
    const int64_t s = samples[size_t(i)];
    for (int64_t k = 0; k < edge_counts[size_t(i)]; ++k) {
      const int64_t edge = edge_ptr[size_t(i)] + k;
      CHECK(pairs[size_t(edge)] == ptr[size_t(i)] + k);  // the ring i -> i + 1, in batch rows
      CHECK(pairs[size_t(e + edge)] == ptr[size_t(i)] + (k + 1) % counts[size_t(i)]);
      for (int c = 0; c < 3; ++c)
        CHECK(shifts[size_t(edge * 3 + c)] == test::shift(store_edges[size_t(s)] + k, c));
    }
  }
}

std::string write_zarr(const TempDir& dir, const std::string& name,
                       const std::vector<int64_t>& atoms,
                       const test::TestStoreOptions& options = {},
                       const test::ZarrLayout& layout = {}) {
  const std::string path = dir.file(name);
  test::write_zarr_store(path, test::test_store_arrays(atoms, options), int64_t(atoms.size()),
                         layout);
  return path;
}

}  // namespace

TEST_CASE("AtomicDataset: the ragged batch of the contract, from Zarr and from HDF5") {
  TempDir dir;
  const std::string zarr = write_zarr(dir, "a.zarr", kAtoms);
  const std::string sharded = write_zarr(
      dir, "s.zarr", kAtoms, {}, {.chunk_rows = 2, .split_trailing = true, .shard_rows = 4});
  test::write_hdf5_store(dir.file("a.h5"), test::test_store_arrays(kAtoms), 6);
  for (const std::string& path : {zarr, sharded, dir.file("a.h5")}) {
    CAPTURE(path);
    AtomicDataset dataset(path);
    CHECK(dataset.size() == 6);
    CHECK(dataset.atom_counts() == kAtoms);
    CHECK(dataset.field("positions").level == FieldLevel::Atom);
    CHECK(dataset.field("edge_index").level == FieldLevel::EdgeAtoms);
    CHECK(dataset.field("atoms_ptr").level == FieldLevel::AtomPointer);
    CHECK(dataset.field("energy").sample_shape == core::Shape{});
    check_batch(dataset.get_batch(std::vector<int64_t>{4, 0, 2}), {4, 0, 2}, kAtoms);
    check_batch(dataset.get_batch(std::vector<int64_t>{1, 2, 3}), {1, 2, 3}, kAtoms);
    check_batch(dataset.get_batch(std::vector<int64_t>{5, 5}), {5, 5}, kAtoms);
    check_batch(dataset.get_batch(std::vector<int64_t>{}), {}, kAtoms);
    CHECK_THROWS_AS(dataset.get_batch(std::vector<int64_t>{6}), core::Error);
  }
  // The contract's field order, and the other fields after it.
  AtomicDataset dataset(zarr);
  std::vector<std::string> names;
  for (const FieldInfo& field : dataset.fields()) names.push_back(field.name);
  CHECK(names == std::vector<std::string>{"positions", "atomic_numbers", "batch", "atoms_ptr",
                                          "num_atoms", "energy", "forces", "cell", "pbc", "stress",
                                          "edge_index", "edge_shifts", "edges_ptr"});
}

TEST_CASE("AtomicDataset: integer image shifts times the cell, zeros, and stores without edges") {
  TempDir dir;
  // Integer shifts: edge e of structure s gets image (1, 0, -1) when e is odd.
  auto arrays = test::test_store_arrays({3, 2}, {.cartesian_shifts = false});
  std::vector<int32_t> units;
  for (int e = 0; e < 5; ++e) {
    for (int k = 0; k < 3; ++k) units.push_back(e % 2 == 1 ? (k == 0 ? 1 : k == 2 ? -1 : 0) : 0);
  }
  arrays.push_back(
      test::array_of("core/neighbor_list_shifts", "int32", core::kInt32, {5, 3}, units, "edge"));
  test::write_zarr_store(dir.file("units.zarr"), arrays, 2);
  AtomicDataset units_dataset(dir.file("units.zarr"));
  Batch batch = units_dataset.get_batch(std::vector<int64_t>{1, 0});  // edges 3,4 then 0,1,2
  const auto shifts = batch["edge_shifts"].to_vector<float>();
  // Structure 1 has cell 3 I, structure 0 cell 2 I.
  const std::vector<float> expected = {3, 0, -3, 0, 0, 0, 0, 0, 0, 2, 0, -2, 0, 0, 0};
  CHECK(shifts == expected);
  CHECK_FALSE(batch.has("neighbor_list_shifts"));

  auto no_shifts = test::test_store_arrays({3, 2}, {.cartesian_shifts = false});
  test::write_zarr_store(dir.file("zeros.zarr"), no_shifts, 2);
  Batch zeros = AtomicDataset(dir.file("zeros.zarr")).get_batch(std::vector<int64_t>{0, 1});
  CHECK(zeros["edge_shifts"].to_vector<float>() == std::vector<float>(15, 0.0f));

  auto bare = test::test_store_arrays({3, 2}, {.edges = false});
  test::remove_array(bare, "core/cell");
  test::remove_array(bare, "core/pbc");
  test::write_zarr_store(dir.file("bare.zarr"), bare, 2);
  Batch plain = AtomicDataset(dir.file("bare.zarr")).get_batch(std::vector<int64_t>{1});
  CHECK_FALSE(plain.has("edge_index"));
  CHECK_FALSE(plain.has("edges_ptr"));
  CHECK(plain["cell"].to_vector<float>() == std::vector<float>(9, 0.0f));
  CHECK(plain["pbc"].to_vector<uint8_t>() == std::vector<uint8_t>(3, 0));

  // A neighbor_list entry outside its structure is an error naming the array.
  auto broken = test::test_store_arrays({3, 2});
  auto& pairs = test::find_array(broken, "core/neighbor_list");
  const int32_t outside = 4;  // structure 0 holds rows 0..2
  std::memcpy(pairs.bytes.data() + 4, &outside, 4);
  test::write_zarr_store(dir.file("broken.zarr"), broken, 2);
  CHECK_THROWS_WITH_AS(AtomicDataset(dir.file("broken.zarr")).get_batch(std::vector<int64_t>{0}),
                       doctest::Contains("core/neighbor_list edge 0 of structure 0"), core::Error);

  // The fields option: only what is listed (positions and atomic_numbers always).
  AtomicDataset some(dir.file("units.zarr"), {.fields = {"energy"}});
  std::vector<std::string> names;
  for (const FieldInfo& field : some.fields()) names.push_back(field.name);
  CHECK(names == std::vector<std::string>{"positions", "atomic_numbers", "batch", "atoms_ptr",
                                          "num_atoms", "energy", "cell", "pbc"});
  CHECK_THROWS_WITH_AS(AtomicDataset(dir.file("units.zarr"), {.fields = {"charges"}}),
                       doctest::Contains("no field 'charges'"), core::Error);
}

TEST_CASE("AtomicDataset reads only the structures asked for") {
  TempDir dir;
  std::vector<int64_t> atoms(200, 4);
  const std::string path = write_zarr(dir, "big.zarr", atoms, {}, {.chunk_rows = 16});
  auto store = AtomicStore::open(path, {.cache_bytes = 1 << 20});
  AtomicDataset dataset(store);
  const int64_t opening = store->cache()->misses();   // the pointer arrays, read when opened
  dataset.get_batch(std::vector<int64_t>{100, 101});  // atoms 400..407: one chunk per field
  // positions, atomic_numbers, forces, neighbor_list, shifts (rows 400..407 in chunk 25), and
  // energy, cell, pbc, stress (rows 100, 101 in chunk 6): 9 chunks of the store's hundreds.
  CHECK(store->cache()->misses() - opening == 9);
}

TEST_CASE("mpigrad data convert-zarr writes the same store in HDF5, atomically") {
  TempDir dir;
  test::TestStoreOptions options;
  options.active = {true, true, false, true, true, true};
  const std::string zarr =
      write_zarr(dir, "in.zarr", kAtoms, options, {.chunk_rows = 4, .split_trailing = true});
  const std::string h5 = dir.file("out.h5");
  std::string arguments[] = {"data", "convert-zarr", zarr, h5, "--chunk-rows", "8", "--gzip", "4"};
  char* argv[] = {arguments[0].data(), arguments[1].data(), arguments[2].data(),
                  arguments[3].data(), arguments[4].data(), arguments[5].data(),
                  arguments[6].data(), arguments[7].data()};
  REQUIRE(run_data_command(8, argv) == 0);
  CHECK(AtomicStore::detect(h5) == StoreFormat::Hdf5);
  AtomicDataset from_zarr(zarr), from_h5(h5);
  CHECK(from_h5.size() == 5);
  CHECK(from_h5.fields() == from_zarr.fields());
  const std::vector<int64_t> indices = {4, 1, 2};
  Batch a = from_zarr.get_batch(indices), b = from_h5.get_batch(indices);
  for (size_t f = 0; f < a.fields.size(); ++f) {
    CAPTURE(a.fields[f].first);
    CHECK(a.fields[f].second.shape() == b.fields[f].second.shape());
    CHECK(std::memcmp(a.fields[f].second.data_ptr(), b.fields[f].second.data_ptr(),
                      size_t(a.fields[f].second.nbytes())) == 0);
  }
  check_batch(b, {5, 1, 3}, kAtoms);  // dataset index 2 is stored structure 3 (2 is deleted)

  // A bad store leaves no output behind.
  std::filesystem::remove_all(zarr + "/meta/atoms_ptr");
  const std::string failed = dir.file("failed.h5");
  std::ostringstream out;
  CHECK_THROWS_WITH_AS(convert_atomic_store(zarr, failed, {}, out),
                       doctest::Contains("missing pointer array meta/atoms_ptr"), core::Error);
  CHECK_FALSE(std::filesystem::exists(failed));
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    CHECK(entry.path().string().find(".tmp") == std::string::npos);
  }
}

TEST_CASE("DataLoader carries ragged batches: workers, order, and every structure once") {
  TempDir dir;
  std::vector<int64_t> atoms;
  for (int i = 0; i < 37; ++i) atoms.push_back(1 + (i * 5) % 7);
  auto dataset = std::make_shared<AtomicDataset>(write_zarr(dir, "loader.zarr", atoms));
  for (int workers : {0, 3}) {
    DataLoaderOptions options;
    options.batch_size = 5;
    options.shuffle = true;
    options.seed = 11;
    options.num_workers = workers;
    DataLoader loader(dataset, options);
    std::multiset<int64_t> seen;
    int batches = 0;
    for (Batch& batch : loader) {
      check_batch(batch, batch.indices, atoms);
      seen.insert(batch.indices.begin(), batch.indices.end());
      ++batches;
    }
    CHECK(batches == 8);
    CHECK(seen.size() == 37);
    CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == 37);
  }
}

TEST_CASE("MultiDataset of atomic stores: ragged batches joined in the order asked for") {
  TempDir dir;
  const std::vector<int64_t> a_atoms = {2, 3, 1}, b_atoms = {4, 2};
  auto a = std::make_shared<AtomicDataset>(write_zarr(dir, "a.zarr", a_atoms));
  auto b = std::make_shared<AtomicDataset>(write_zarr(dir, "b.zarr", b_atoms));
  MultiDataset multi({a, b});
  CHECK(multi.fields() == a->fields());
  // Global 3 is b's 0, global 1 is a's 1.
  Batch batch = multi.get_batch(std::vector<int64_t>{3, 1, 4, 0});
  CHECK(batch.dataset_index.to_vector<int64_t>() == std::vector<int64_t>{1, 0, 1, 0});
  CHECK(batch["num_atoms"].to_vector<int64_t>() == std::vector<int64_t>{4, 3, 2, 2});
  CHECK(batch["atoms_ptr"].to_vector<int64_t>() == std::vector<int64_t>{0, 4, 7, 9, 11});
  CHECK(batch["batch"].to_vector<int64_t>() ==
        std::vector<int64_t>{0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 3});
  CHECK(batch["edges_ptr"].to_vector<int64_t>() == std::vector<int64_t>{0, 4, 7, 9, 11});
  // Each part is the child's own batch, moved to its place: compare with single-store batches.
  const Batch b0 = b->get_batch(std::vector<int64_t>{0});
  const Batch a1 = a->get_batch(std::vector<int64_t>{1});
  const auto positions = batch["positions"].to_vector<float>();
  const auto b0_positions = b0["positions"].to_vector<float>();
  const auto a1_positions = a1["positions"].to_vector<float>();
  CHECK(std::vector<float>(positions.begin(), positions.begin() + 12) == b0_positions);
  CHECK(std::vector<float>(positions.begin() + 12, positions.begin() + 21) == a1_positions);
  const auto pairs = batch["edge_index"].to_vector<int64_t>();
  // Structure 1 (a's 1, atoms 4..6) has the ring 4->5, 5->6, 6->4 at edges 4..6.
  CHECK(std::vector<int64_t>(pairs.begin() + 4, pairs.begin() + 7) ==
        std::vector<int64_t>{4, 5, 6});
  CHECK(std::vector<int64_t>(pairs.begin() + 11 + 4, pairs.begin() + 11 + 7) ==
        std::vector<int64_t>{5, 6, 4});
  CHECK(batch["energy"].to_vector<float>() ==
        std::vector<float>{test::energy(0), test::energy(1), test::energy(1), test::energy(0)});

  // The children must agree on their fields, levels included.
  auto c = std::make_shared<AtomicDataset>(write_zarr(dir, "c.zarr", {2, 2}, {.edges = false}));
  CHECK_THROWS_WITH_AS(MultiDataset({a, c}), doctest::Contains("edge_index"), core::Error);
}

TEST_CASE("AtomBudgetBatchSampler: batches close before the budget is passed") {
  const std::vector<int64_t> atoms = {3, 4, 2, 6, 1, 1, 5, 2};
  AtomBudgetBatchSampler sampler(atoms, {.max_atoms = 8});
  // In order: 3+4 (next 2 would make 9), 2+6, 1+1+5, 2.
  CHECK(sampler.batches() == std::vector<std::vector<int64_t>>{{0, 1}, {2, 3}, {4, 5, 6}, {7}});
  CHECK(sampler.size() == 4);
  CHECK_THROWS_WITH_AS(AtomBudgetBatchSampler(atoms, {.max_atoms = 5}),
                       doctest::Contains("structure 3 has 6 atoms, more than max_atoms = 5"),
                       core::Error);

  // Shuffled: a pure function of seed + epoch; every structure once; never over the budget.
  AtomBudgetBatchSampler shuffled(atoms, {.max_atoms = 8, .shuffle = true, .seed = 4});
  AtomBudgetBatchSampler again(atoms, {.max_atoms = 8, .shuffle = true, .seed = 4});
  CHECK(shuffled.batches() == again.batches());
  const auto epoch0 = shuffled.batches();
  shuffled.set_epoch(3);
  again.set_epoch(3);
  CHECK(shuffled.batches() == again.batches());
  CHECK(shuffled.batches() != epoch0);
  std::multiset<int64_t> seen;
  for (const auto& batch : shuffled.batches()) {
    int64_t total = 0;
    for (int64_t i : batch) total += atoms[size_t(i)];
    CHECK(total <= 8);
    seen.insert(batch.begin(), batch.end());
  }
  CHECK(seen.size() == atoms.size());
  CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == atoms.size());
}

TEST_CASE("AtomBudgetBatchSampler: whole batches split across ranks, padded or truncated") {
  const std::vector<int64_t> atoms = {3, 4, 2, 6, 1, 1, 5, 2, 7};  // 5 batches of <= 8
  const auto global = AtomBudgetBatchSampler(atoms, {.max_atoms = 8}).batches();
  REQUIRE(global.size() == 5);
  for (int64_t ranks : {2, 3}) {
    for (bool drop_last : {false, true}) {
      CAPTURE(ranks);
      CAPTURE(drop_last);
      const int64_t per_rank = drop_last ? 5 / ranks : (5 + ranks - 1) / ranks;
      for (int64_t r = 0; r < ranks; ++r) {
        AtomBudgetBatchSampler sampler(
            atoms, {.max_atoms = 8, .num_replicas = ranks, .rank = r, .drop_last = drop_last});
        CHECK(sampler.is_distributed());
        const auto mine = sampler.batches();
        REQUIRE(int64_t(mine.size()) == per_rank);
        CHECK(sampler.size() == per_rank);
        for (int64_t i = 0; i < per_rank; ++i)
          CHECK(mine[size_t(i)] == global[size_t((r + i * ranks) % 5)]);
      }
    }
  }
  CHECK_THROWS_WITH_AS(
      AtomBudgetBatchSampler(atoms, {.max_atoms = 8, .num_replicas = 6, .drop_last = true}),
      doctest::Contains("fewer than the 6 ranks"), core::Error);
}

TEST_CASE("open_training_data and make_batch_sampler: stores, mixes and budgets") {
  TempDir dir;
  const std::string a = write_zarr(dir, "a.zarr", {2, 3, 1, 2});
  const std::string b = write_zarr(dir, "b.zarr", {4, 2});
  test::write_hdf5_store(dir.file("c.h5"), test::test_store_arrays({1, 1, 1}), 3);
  test::write_pattern_file(dir.file("plain.h5"), 0, 5);

  auto one = open_training_data({a});
  CHECK(dynamic_cast<AtomicDataset*>(one.get()) != nullptr);
  auto several = open_training_data({a, b, dir.file("c.h5")});
  auto* multi = dynamic_cast<MultiDataset*>(several.get());
  REQUIRE(multi != nullptr);
  CHECK(multi->sizes() == std::vector<int64_t>{4, 2, 3});
  auto plain = open_training_data({dir.file("plain.h5")});
  CHECK(dynamic_cast<Hdf5Dataset*>(plain.get()) != nullptr);
  CHECK_THROWS_WITH_AS(open_training_data({a, dir.file("plain.h5")}),
                       doctest::Contains("list one kind of data"), core::Error);
  CHECK_THROWS_WITH_AS(open_training_data({dir.file("missing.zarr")}),
                       doctest::Contains("does not exist"), core::Error);

  BatchingOptions batching;
  batching.batch_size = 3;
  batching.samples_per_dataset = BatchComposition::counts({1, 1, 1});
  batching.epoch_policy = EpochPolicy::MinSize;
  batching.replacement = false;
  auto mix = make_batch_sampler(*several, batching);
  CHECK(dynamic_cast<MultiDatasetBatchSampler*>(mix.get()) != nullptr);
  CHECK(mix->size() == 2);  // b's 2 structures, one per batch
  for (const auto& batch : mix->batches()) {
    Batch read = several->get_batch(batch);
    std::vector<int64_t> sources = read.dataset_index.to_vector<int64_t>();
    std::sort(sources.begin(), sources.end());
    CHECK(sources == std::vector<int64_t>{0, 1, 2});
  }

  BatchingOptions budget;
  budget.max_atoms = 5;
  budget.shuffle = false;
  auto by_atoms = make_batch_sampler(*several, budget);
  // a: 2,3 | 1,2 | b: 4 | 2, c: 1,1,1  (over the concatenation, in order)
  CHECK(by_atoms->batches() ==
        std::vector<std::vector<int64_t>>{{0, 1}, {2, 3}, {4}, {5, 6, 7, 8}});
  budget.samples_per_dataset = BatchComposition::balanced();
  CHECK_THROWS_WITH_AS(make_batch_sampler(*several, budget), doctest::Contains("exclude"),
                       core::Error);
  budget.samples_per_dataset.reset();
  CHECK_THROWS_WITH_AS(make_batch_sampler(*plain, budget),
                       doctest::Contains("max_atoms needs atomic stores"), core::Error);

  BatchingOptions count;
  count.batch_size = 2;
  count.num_replicas = 2;
  count.rank = 1;
  auto by_count = make_batch_sampler(*one, count);
  CHECK(by_count->is_distributed());
  CHECK(by_count->size() == 1);
}

TEST_CASE("Batch buffers: ragged sizes share size classes instead of piling up idle blocks") {
  CHECK(batch_buffer_size_class(65536) == 65536);
  CHECK(batch_buffer_size_class(65537) == 65536 + 8192);
  CHECK(batch_buffer_size_class(1000000) == 1048576);  // step 65536 above 2^19
  release_batch_buffers();
  // Batches of 100..140 KB, as atoms per batch vary: a handful of classes.
  for (int step = 0; step < 200; ++step) {
    core::Tensor t = empty_batch_tensor({25000 + (step * 37) % 10000}, core::kFloat32);
    (void)t;
  }
  CHECK(batch_buffer_idle_bytes() <= 8 * 160 * 1024);
  release_batch_buffers();
  CHECK(batch_buffer_idle_bytes() == 0);
}

TEST_CASE("DataLoader copies ragged batches to a GPU as the host reads them") {
  if (!core::cuda_is_available()) {
    std::printf("ragged batches on a GPU: skipped, no GPU visible\n");
    return;
  }
  TempDir dir;
  // Runs of one-atom structures give batches without edges: empty tensors travel too.
  std::vector<int64_t> atoms;
  for (int i = 0; i < 41; ++i) atoms.push_back(i % 10 < 4 ? 1 : 2 + i % 7);
  auto dataset = std::make_shared<AtomicDataset>(write_zarr(dir, "gpu.zarr", atoms));
  DataLoaderOptions options;
  options.batch_size = 3;
  options.shuffle = false;
  DataLoader host(dataset, options);
  std::vector<Batch> expected;
  for (Batch& batch : host) expected.push_back(batch);
  for (int workers : {0, 2}) {
    CAPTURE(workers);
    DataLoaderOptions gpu = options;
    gpu.num_workers = workers;
    gpu.device = core::cuda(0);
    DataLoader loader(dataset, gpu);
    size_t seen = 0;
    bool empty_edges = false;
    for (Batch& batch : loader) {
      REQUIRE(seen < expected.size());
      CHECK(batch.indices == expected[seen].indices);
      for (const auto& [name, tensor] : batch.fields) {
        CAPTURE(name);
        CHECK(tensor.device() == core::cuda(0));
        const core::Tensor back = tensor.to(core::kCPU);
        const core::Tensor& want = expected[seen][name];
        REQUIRE(back.shape() == want.shape());
        CHECK(std::memcmp(back.data_ptr(), want.data_ptr(), size_t(want.nbytes())) == 0);
      }
      empty_edges = empty_edges || batch["edge_index"].numel() == 0;
      ++seen;
    }
    CHECK(seen == expected.size());
    CHECK(empty_edges);
  }
}
