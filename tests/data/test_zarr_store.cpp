// Reading Zarr v3 arrays and atomic stores written by the test itself: rows across chunks,
// chunks that split trailing axes, sharding with its index at either end, zstd, gzip, crc32c,
// big endian, v2 chunk keys, chunks never written (fill values), widened types; the cache reads
// only the chunks a request touches; and every bad store is one error naming the store and the
// array (missing pointers, lengths that disagree, unknown codecs, truncated or corrupt chunks,
// soft-deleted structures, wrong shapes and types).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "atomic_test_util.h"
#include "mpigrad/data/atomic_dataset.h"
#include "mpigrad/data/atomic_store.h"
#include "mpigrad/data/zarr_array.h"

namespace {

using namespace mpigrad;        // NOLINT
using namespace mpigrad::data;  // NOLINT
using test::ArrayData;
using test::TempDir;
using test::ZarrLayout;

// A float32 [rows, 2, 3] array whose element (r, i, j) is r * 100 + i * 10 + j.
ArrayData grid_array(int64_t rows) {
  std::vector<float> values;
  for (int64_t r = 0; r < rows; ++r) {
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 3; ++j) values.push_back(float(r * 100 + i * 10 + j));
    }
  }
  return test::array_of("core/grid", "float32", core::kFloat32, {rows, 2, 3}, values);
}

std::vector<float> read_floats(const ZarrArray& array, int64_t begin, int64_t count) {
  std::vector<float> out(size_t(count) * 6);
  array.read_rows(begin, count, out.data());
  return out;
}

void check_grid_rows(const ZarrArray& array, int64_t begin, int64_t count) {
  std::vector<float> got = read_floats(array, begin, count);
  for (int64_t r = 0; r < count; ++r) {
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 3; ++j) {
        CHECK(got[size_t(r * 6 + i * 3 + j)] == float((begin + r) * 100 + i * 10 + j));
      }
    }
  }
}

std::string write_layout(const TempDir& dir, const std::string& name, const ArrayData& array,
                         const ZarrLayout& layout) {
  const std::string store = dir.file(name);
  test::write_zarr_group(store, "{}");
  test::write_zarr_array(store, array, layout);
  return store;
}

// A store of structures with `atoms` atoms each, in Zarr; returns its path.
std::string zarr_store(const TempDir& dir, const std::string& name,
                       const std::vector<test::ArrayData>& arrays, int64_t samples,
                       const ZarrLayout& layout = {}) {
  const std::string store = dir.file(name);
  test::write_zarr_store(store, arrays, samples, layout);
  return store;
}

void flip_byte(const std::string& path, int64_t offset) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(offset);
  char byte = 0;
  file.get(byte);
  file.seekp(offset);
  file.put(char(byte ^ 0x5A));
}

}  // namespace

TEST_CASE("ZarrArray reads any rows across chunks, whatever the chunking and codecs") {
  TempDir dir;
  const ArrayData array = grid_array(11);
  std::vector<std::pair<std::string, ZarrLayout>> layouts;
  layouts.push_back({"zstd", ZarrLayout{}});
  layouts.push_back({"trailing", ZarrLayout{.chunk_rows = 4, .split_trailing = true}});
  layouts.push_back({"gzip_crc", ZarrLayout{.chunk_rows = 5, .codecs = {"gzip", "crc32c"}}});
  layouts.push_back({"raw_big", ZarrLayout{.chunk_rows = 2, .codecs = {}, .big_endian = true}});
  layouts.push_back({"shard_end", ZarrLayout{.chunk_rows = 2, .shard_rows = 6}});
  layouts.push_back({"shard_start", ZarrLayout{.chunk_rows = 1,
                                               .split_trailing = true,
                                               .shard_rows = 4,
                                               .index_at_start = true,
                                               .codecs = {"zstd", "crc32c"}}});
  layouts.push_back(
      {"v2_dot", ZarrLayout{.chunk_rows = 3, .key_encoding = "v2", .separator = '.'}});
  for (const auto& [name, layout] : layouts) {
    CAPTURE(name);
    auto cache = std::make_shared<ChunkCache>(1 << 20);
    const std::string store = write_layout(dir, name + ".zarr", array, layout);
    ZarrArray zarr(store, "core/grid", cache);
    CHECK(zarr.shape() == std::vector<int64_t>{11, 2, 3});
    CHECK(zarr.dtype() == core::kFloat32);
    CHECK(zarr.sharded() == (layout.shard_rows > 0));
    check_grid_rows(zarr, 0, 11);
    check_grid_rows(zarr, 3, 5);
    check_grid_rows(zarr, 10, 1);
    check_grid_rows(zarr, 4, 0);
    CHECK_THROWS_WITH_AS(read_floats(zarr, 9, 3), doctest::Contains("outside its 11 rows"),
                         core::Error);
  }
}

TEST_CASE("ZarrArray: chunks never written read as the fill value; narrow types are widened") {
  TempDir dir;
  std::vector<uint16_t> values(40, 0);
  for (size_t i = 20; i < 40; ++i) values[i] = uint16_t(60000 + i);  // rows 0..19 stay zero
  ArrayData array = test::array_of("core/ids", "uint16", core::kInt32, {40}, values);
  const std::string store = write_layout(dir, "fill.zarr", array, {.chunk_rows = 8});
  CHECK_FALSE(std::filesystem::exists(store + "/core/ids/c/0"));  // zeros: left out
  CHECK(std::filesystem::exists(store + "/core/ids/c/3"));
  ZarrArray ids(store, "core/ids", std::make_shared<ChunkCache>(1 << 20));
  CHECK(ids.dtype() == core::kInt32);
  CHECK(ids.stored_type() == "uint16");
  std::vector<int32_t> out(40);
  ids.read_rows(0, 40, out.data());
  for (size_t i = 0; i < 40; ++i) CHECK(out[i] == int32_t(values[i]));  // 60020.. fit in int32
}

TEST_CASE("ZarrArray decodes only the chunks a read touches, and caches them") {
  TempDir dir;
  const std::string store = write_layout(dir, "cache.zarr", grid_array(100), {.chunk_rows = 10});
  auto cache = std::make_shared<ChunkCache>(1 << 20);
  ZarrArray zarr(store, "core/grid", cache);
  check_grid_rows(zarr, 42, 5);  // rows 42..46: chunk 4 only
  CHECK(cache->misses() == 1);
  CHECK(cache->bytes() == 10 * 6 * 4);
  check_grid_rows(zarr, 47, 6);  // 47..52: chunk 4 (cached) and chunk 5
  CHECK(cache->misses() == 2);
  CHECK(cache->hits() == 1);

  auto small = std::make_shared<ChunkCache>(2 * 10 * 6 * 4);  // two chunks
  ZarrArray bounded(store, "core/grid", small);
  check_grid_rows(bounded, 0, 100);
  CHECK(small->bytes() <= 2 * 10 * 6 * 4);
}

TEST_CASE("ZarrArray: every bad array is one error naming the store, the array and the chunk") {
  TempDir dir;
  const ArrayData array = grid_array(6);
  auto cache = std::make_shared<ChunkCache>(0);

  SUBCASE("an unknown codec is named") {
    const std::string store = write_layout(dir, "blosc.zarr", array, {.codecs = {"blosc"}});
    CHECK_THROWS_WITH_AS(ZarrArray(store, "core/grid", cache),
                         doctest::Contains("core/grid: codec 'blosc' is not supported"),
                         core::Error);
  }
  SUBCASE("a truncated chunk") {
    const std::string store = write_layout(dir, "cut.zarr", array, {.chunk_rows = 6});
    const std::string chunk = store + "/core/grid/c/0/0/0";
    std::filesystem::resize_file(chunk, std::filesystem::file_size(chunk) / 2);
    ZarrArray zarr(store, "core/grid", cache);
    CHECK_THROWS_WITH_AS(read_floats(zarr, 0, 1), doctest::Contains(chunk.c_str()), core::Error);
  }
  SUBCASE("a corrupt chunk (its checksum disagrees)") {
    const std::string store =
        write_layout(dir, "bad.zarr", array, {.chunk_rows = 6, .codecs = {"zstd", "crc32c"}});
    flip_byte(store + "/core/grid/c/0/0/0", 6);
    ZarrArray zarr(store, "core/grid", cache);
    CHECK_THROWS_WITH_AS(read_floats(zarr, 0, 1), doctest::Contains("checksum mismatch"),
                         core::Error);
  }
  SUBCASE("a raw chunk of the wrong size") {
    const std::string store =
        write_layout(dir, "size.zarr", array, {.chunk_rows = 3, .codecs = {}});
    std::filesystem::resize_file(store + "/core/grid/c/1/0/0", 5);
    ZarrArray zarr(store, "core/grid", cache);
    CHECK_THROWS_WITH_AS(read_floats(zarr, 4, 1), doctest::Contains("decodes to 5 bytes"),
                         core::Error);
    check_grid_rows(zarr, 0, 3);  // the other chunk is fine
  }
  SUBCASE("a shard cut short") {
    const std::string store =
        write_layout(dir, "shard.zarr", array, {.chunk_rows = 1, .shard_rows = 6});
    const std::string shard = store + "/core/grid/c/0/0/0";
    std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 10);
    ZarrArray zarr(store, "core/grid", cache);
    CHECK_THROWS_WITH_AS(read_floats(zarr, 0, 1), doctest::Contains("shard"), core::Error);
  }
  SUBCASE("unsupported metadata") {
    const std::string store = write_layout(dir, "meta.zarr", array, {});
    const std::string metadata = store + "/core/grid/zarr.json";
    std::ifstream in(metadata);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    auto rewrite = [&](const std::string& from, const std::string& to) {
      std::string changed = text;
      changed.replace(changed.find(from), from.size(), to);
      test::write_text(metadata, changed);
    };
    rewrite("\"float32\"", "\"complex64\"");
    CHECK_THROWS_WITH_AS(ZarrArray(store, "core/grid", cache),
                         doctest::Contains("data_type \"complex64\" is not supported"),
                         core::Error);
    rewrite("\"regular\"", "\"rectilinear\"");
    CHECK_THROWS_WITH_AS(ZarrArray(store, "core/grid", cache),
                         doctest::Contains("chunk_grid \"rectilinear\""), core::Error);
    test::write_text(metadata, "{\"zarr_format\": 3, \"node_type\": ");
    CHECK_THROWS_WITH_AS(ZarrArray(store, "core/grid", cache), doctest::Contains("not valid JSON"),
                         core::Error);
  }
  SUBCASE("Zarr v2 metadata") {
    const std::string store = dir.file("v2.zarr");
    test::write_text(std::filesystem::path(store) / ".zgroup", "{\"zarr_format\": 2}");
    CHECK_THROWS_WITH_AS(zarr_node_kind(store), doctest::Contains("only Zarr v3"), core::Error);
  }
}

TEST_CASE("AtomicStore: the same store in Zarr and HDF5 gives the same pointers and rows") {
  TempDir dir;
  const std::vector<int64_t> atoms = {3, 1, 4, 2, 5};
  const auto arrays = test::test_store_arrays(atoms);
  test::write_hdf5_store(dir.file("store.h5"), arrays, 5);
  const std::string zarr = zarr_store(dir, "store.zarr", arrays, 5);
  for (const std::string& path : {zarr, dir.file("store.h5")}) {
    CAPTURE(path);
    auto store = AtomicStore::open(path);
    CHECK(store->format() == (path == zarr ? StoreFormat::Zarr : StoreFormat::Hdf5));
    CHECK(store->num_samples() == 5);
    CHECK(store->atoms_ptr() == std::vector<int64_t>{0, 3, 4, 8, 10, 15});
    CHECK(store->edges_ptr() == std::vector<int64_t>{0, 3, 3, 7, 9, 14});
    CHECK(store->active().size() == 5);
    const StoreField* forces = store->find("forces");
    REQUIRE(forces != nullptr);
    CHECK(forces->level == FieldLevel::Atom);
    CHECK(store->find("energy")->level == FieldLevel::Sample);
    CHECK(store->find("neighbor_list")->level == FieldLevel::Edge);
    const std::vector<int64_t> samples = {3, 0};  // atoms 8..9, then 0..2
    std::vector<float> rows(size_t(store->rows_for(*forces, samples)) * 3);
    REQUIRE(rows.size() == 15);
    store->read(*forces, samples, rows.data());
    const int64_t expected_atoms[] = {8, 9, 0, 1, 2};
    for (int a = 0; a < 5; ++a) {
      for (int k = 0; k < 3; ++k)
        CHECK(rows[size_t(a * 3 + k)] == test::force(expected_atoms[a], k));
    }
  }
  // Levels not recorded: ALCHEMI's defaults by name.
  test::write_hdf5_store(dir.file("plain.h5"), arrays, -1, /*levels=*/false);
  auto plain = AtomicStore::open(dir.file("plain.h5"));
  CHECK(plain->find("positions")->level == FieldLevel::Atom);
  CHECK(plain->find("stress")->level == FieldLevel::Sample);
  CHECK(plain->find("shifts")->level == FieldLevel::Edge);
  CHECK(AtomicStore::detect(dir.file("plain.h5")) == StoreFormat::Hdf5);
  test::write_pattern_file(dir.file("pattern.h5"), 0, 3);
  CHECK_FALSE(AtomicStore::detect(dir.file("pattern.h5")).has_value());
}

TEST_CASE("AtomicStore: a bad store is one error naming the store and the array") {
  TempDir dir;
  const std::vector<int64_t> atoms = {2, 3, 1};
  auto check_both = [&](std::vector<ArrayData> arrays, int64_t samples, const std::string& text) {
    static int count = 0;
    const std::string name = "bad" + std::to_string(count++);
    const std::string zarr = zarr_store(dir, name + ".zarr", arrays, samples);
    test::write_hdf5_store(dir.file(name + ".h5"), arrays, samples);
    CHECK_THROWS_WITH_AS(AtomicStore::open(zarr), doctest::Contains(text.c_str()), core::Error);
    CHECK_THROWS_WITH_AS(AtomicStore::open(zarr), doctest::Contains(zarr.c_str()), core::Error);
    CHECK_THROWS_WITH_AS(AtomicStore::open(dir.file(name + ".h5")), doctest::Contains(text.c_str()),
                         core::Error);
  };
  SUBCASE("missing pointer arrays") {
    auto arrays = test::test_store_arrays(atoms);
    test::remove_array(arrays, "meta/atoms_ptr");
    check_both(arrays, 3, "missing pointer array meta/atoms_ptr");
    arrays = test::test_store_arrays(atoms);
    test::remove_array(arrays, "meta/edges_ptr");
    check_both(arrays, 3, "missing pointer array meta/edges_ptr, needed by the edge field");
  }
  SUBCASE("lengths that disagree") {
    auto arrays = test::test_store_arrays(atoms);
    check_both(arrays, 4, "records num_samples = 4 but meta/atoms_ptr has 4 entries");
    auto& forces = test::find_array(arrays, "core/forces");
    forces.shape[0] -= 1;
    forces.bytes.resize(forces.bytes.size() - 12);
    check_both(arrays, 3, "core/forces (atom level) has 5 rows but meta/atoms_ptr ends at 6");
    arrays = test::test_store_arrays(atoms);
    auto& energy = test::find_array(arrays, "core/energy");
    energy.shape[0] = 2;
    energy.bytes.resize(8);
    check_both(arrays, 3, "core/energy (system level) has 2 rows but the store has 3");
    arrays = test::test_store_arrays(atoms);
    auto& ptr = test::find_array(arrays, "meta/atoms_ptr");
    std::vector<int64_t> decreasing = {0, 4, 3, 6};
    std::memcpy(ptr.bytes.data(), decreasing.data(), 32);
    check_both(arrays, 3, "meta/atoms_ptr decreases at entry 2");
    arrays = test::test_store_arrays(atoms);
    test::find_array(arrays, "meta/samples_mask").shape = {2};
    test::find_array(arrays, "meta/samples_mask").bytes.resize(2);
    check_both(arrays, 3, "meta/samples_mask");
  }
  SUBCASE("an unknown level") {
    auto arrays = test::test_store_arrays(atoms);
    test::find_array(arrays, "core/forces").level = "residue";
    check_both(arrays, 3, "core/forces has level 'residue'");
  }
}

TEST_CASE("AtomicStore: soft-deleted structures are skipped by the dataset, refused if read") {
  TempDir dir;
  const std::vector<int64_t> atoms = {2, 3, 1, 4};
  test::TestStoreOptions options;
  options.active = {true, false, true, true};
  const std::string path =
      zarr_store(dir, "deleted.zarr", test::test_store_arrays(atoms, options), 4);
  auto store = AtomicStore::open(path);
  CHECK(store->active() == std::vector<int64_t>{0, 2, 3});
  CHECK(store->describe().find("1 deleted") != std::string::npos);
  std::vector<float> rows(9);
  const std::vector<int64_t> deleted = {1};
  CHECK_THROWS_WITH_AS(store->read(*store->find("forces"), deleted, rows.data()),
                       doctest::Contains("structure 1 is soft-deleted (meta/samples_mask"),
                       core::Error);
  AtomicDataset dataset(store);
  CHECK(dataset.size() == 3);  // ALCHEMI's reader: index i is the i-th active structure
  CHECK(dataset.atom_counts() == std::vector<int64_t>{2, 1, 4});
  Batch batch = dataset.get_batch(std::vector<int64_t>{1});
  CHECK(batch["energy"].to_vector<float>() == std::vector<float>{test::energy(2)});
}

TEST_CASE("AtomicDataset: fields of the wrong shape or type are refused when it is built") {
  TempDir dir;
  auto arrays = test::test_store_arrays({2, 2});
  auto& positions = test::find_array(arrays, "core/positions");
  positions.shape = {4, 2};
  positions.bytes.resize(4 * 2 * 4);
  const std::string path = zarr_store(dir, "shape.zarr", arrays, 2);
  CHECK_THROWS_WITH_AS(AtomicDataset{path},
                       doctest::Contains("core/positions has rows of shape [2]"), core::Error);
  arrays = test::test_store_arrays({2, 2});
  auto& numbers = test::find_array(arrays, "core/atomic_numbers");
  numbers = test::array_of("core/atomic_numbers", "float32", core::kFloat32, {4},
                           std::vector<float>{1, 2, 3, 4}, "atom");
  CHECK_THROWS_WITH_AS(AtomicDataset{zarr_store(dir, "type.zarr", arrays, 2)},
                       doctest::Contains("core/atomic_numbers is float32, not integers"),
                       core::Error);
  arrays = test::test_store_arrays({2, 2});
  test::remove_array(arrays, "core/positions");
  CHECK_THROWS_WITH_AS(AtomicDataset{zarr_store(dir, "none.zarr", arrays, 2)},
                       doctest::Contains("missing core/positions"), core::Error);
}

TEST_CASE("AtomicDataset: a damaged store ends in core::Error, never a crash") {
  // Seeded damage to a copy of the store nvalchemi-toolkit wrote: a byte changed, a file cut
  // short or emptied, a number in a zarr.json replaced. Opening and reading every structure must
  // either work or throw core::Error.
  TempDir dir;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(MPIGRAD_ALCHEMI_STORE)) {
    if (entry.is_regular_file())
      files.push_back(std::filesystem::relative(entry.path(), MPIGRAD_ALCHEMI_STORE));
  }
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() > 20);
  uint64_t state = 88172645463325252ull;
  auto next = [&](uint64_t bound) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state % bound;
  };
  const std::string copy = dir.file("damaged.zarr");
  std::filesystem::copy(MPIGRAD_ALCHEMI_STORE, copy, std::filesystem::copy_options::recursive);
  int errors = 0, reads = 0;
  for (int trial = 0; trial < 150; ++trial) {
    const std::filesystem::path target = copy / files[next(files.size())];
    const auto size = std::filesystem::file_size(target);
    std::ifstream in(target, std::ios::binary);
    const std::string original((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
    in.close();
    switch (next(3)) {
      case 0:
        if (size > 0) flip_byte(target.string(), int64_t(next(size)));
        break;
      case 1:
        std::filesystem::resize_file(target, next(size + 1));
        break;
      default: {
        std::string text = original;
        const size_t digit = text.find_first_of("0123456789", next(text.size() + 1));
        if (digit == std::string::npos) break;
        const char* replacements[] = {"999999999999", "-3", "0", "4611686018427387904", "1e300"};
        text.replace(digit, 1, replacements[next(5)]);
        test::write_text(target, text);
      }
    }
    CAPTURE(target.string());
    try {
      AtomicDataset dataset(copy);
      std::vector<int64_t> all(size_t(dataset.size()));
      std::iota(all.begin(), all.end(), 0);
      dataset.get_batch(all);
      ++reads;
    } catch (const core::Error&) {
      ++errors;
    }
    test::write_text(target, original);  // undamaged for the next trial
  }
  CHECK(errors > 20);  // most damage is caught ...
  CHECK(reads > 0);    // ... and some lands where nothing reads it (an unused field's bytes)
}
