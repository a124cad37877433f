// In-memory HDF5 files (core::hdf5::File::open_image) and the seams the fuzz targets use:
// Hdf5DatasetOptions::open_file and data::inspect_files read them exactly as they read files
// on disk, and a corrupt image is one core::Error naming it.
#include <doctest/doctest.h>

#include <fstream>
#include <iterator>
#include <sstream>

#include "data_test_util.h"
#include "mpigrad/core/error.h"
#include "mpigrad/data/data_tool.h"
#include "mpigrad/data/hdf5_dataset.h"

using namespace mpigrad;
using namespace mpigrad::data;

namespace {
std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
}  // namespace

TEST_CASE("file image: a file's bytes open in memory and read like the file") {
  test::TempDir dir;
  const auto paths = test::write_pattern_shards(dir, {5});
  const std::vector<char> bytes = file_bytes(paths[0]);
  REQUIRE(bytes.size() > 0);
  core::hdf5::File image = core::hdf5::File::open_image(bytes.data(), bytes.size(), "memory.h5");
  CHECK(image.path() == "memory.h5");
  CHECK(image.list() == std::vector<std::string>{"x", "y"});
  core::Tensor y = image.read_tensor("y");
  CHECK(y.numel() == 5);
  CHECK(y.data<int64_t>()[4] == 4);

  Hdf5DatasetOptions options;
  options.open_file = [&](const std::string& name) {
    return core::hdf5::File::open_image(bytes.data(), bytes.size(), name);
  };
  Hdf5Dataset dataset({"memory.h5"}, options);
  CHECK(dataset.size() == 5);
  const std::vector<int64_t> indices = {3, 0};
  CHECK(test::batch_matches(dataset.get_batch(indices), indices));
}

TEST_CASE("file image: inspect_files lists an in-memory file as inspect lists the file") {
  test::TempDir dir;
  const auto paths = test::write_pattern_shards(dir, {3});
  const std::vector<char> bytes = file_bytes(paths[0]);
  std::ostringstream from_memory, from_disk;
  inspect_files(
      {"memory.h5"}, {},
      [&](const std::string& name) {
        return core::hdf5::File::open_image(bytes.data(), bytes.size(), name);
      },
      std::chrono::seconds(30), from_memory);
  inspect_files(
      paths, {}, [](const std::string& path) { return core::hdf5::File::open(path); },
      std::chrono::seconds(30), from_disk);
  CHECK(from_memory.str().find("dataset: N = 3 samples, 2 fields, 1 shard") != std::string::npos);
  CHECK(from_memory.str().find("  /x  uint8  [3, 2, 3]  contiguous") != std::string::npos);
  // The same listing, but for the file's name and size line.
  auto body = [](const std::string& text) { return text.substr(text.find('\n')); };
  std::string memory_text = from_memory.str(), disk_text = from_disk.str();
  CHECK(body(memory_text).substr(0, 40) == body(disk_text).substr(0, 40));
}

TEST_CASE("file image: bytes that are not HDF5 are one error naming the image") {
  const std::string garbage = "definitely not an HDF5 file, just some bytes";
  CHECK_THROWS_WITH_AS(core::hdf5::File::open_image(garbage.data(), garbage.size(), "junk.h5"),
                       doctest::Contains("junk.h5"), core::Error);
  CHECK_THROWS_AS(core::hdf5::File::open_image(garbage.data(), 0, "empty.h5"), core::Error);
}
