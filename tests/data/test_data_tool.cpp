// The data tool: --help everywhere, synth -> inspect -> read back, errors leave no files, and the
// real Fashion-MNIST package converted to HDF5 shards (fails if the package is missing: the
// install script provides it).
#include <doctest/doctest.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "data_test_util.h"
#include "mpigrad/data/data_tool.h"
#include "mpigrad/data/hdf5_dataset.h"
#include "mpigrad/data/idx.h"

namespace {

using namespace mpigrad;        // NOLINT
using namespace mpigrad::data;  // NOLINT
using test::TempDir;

int run(std::vector<std::string> args) {
  args.insert(args.begin(), "mpigrad-data");
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  return run_data_command(int(args.size()), argv.data());
}

const char* kFashionMnist = "/usr/share/datasets/fashion-mnist";

}  // namespace

TEST_CASE("data tool: help and usage errors") {
  CHECK(run({"--help"}) == 0);
  CHECK(run({"convert-idx", "--help"}) == 0);
  CHECK(run({"inspect", "--help"}) == 0);
  CHECK(run({"synth", "--help"}) == 0);
  CHECK(run({}) == 1);
  CHECK(run({"frobnicate"}) == 1);
  CHECK(run({"synth", "--samples", "10"}) == 1);  // --output missing
  CHECK(run({"synth", "--output", "x.h5", "--samples", "ten"}) == 1);
  CHECK(shard_paths("/d/train.h5", 1) == std::vector<std::string>{"/d/train.h5"});
  CHECK(shard_paths("/d/train.h5", 2) ==
        std::vector<std::string>{"/d/train-00000-of-00002.h5", "/d/train-00001-of-00002.h5"});
}

TEST_CASE("data tool: synth writes shards that inspect and Hdf5Dataset read") {
  TempDir dir;
  const std::string output = dir.file("synth.h5");
  REQUIRE(run({"synth", "--output", output, "--samples", "100", "--shape", "3,4,4", "--classes",
               "5", "--shards", "3", "--chunk-rows", "16", "--gzip", "1", "--seed", "7"}) == 0);
  auto paths = shard_paths(output, 3);
  CHECK(run({"inspect", paths[0], paths[1], paths[2]}) == 0);
  Hdf5Dataset dataset(paths);
  CHECK(dataset.size() == 100);
  CHECK(dataset.field("x").sample_shape == core::Shape{3, 4, 4});
  CHECK(dataset.field("x").dtype == core::kUInt8);
  CHECK(dataset.shard_size(0) == 33);
  Batch batch = dataset.get_batch(std::vector<int64_t>{0, 50, 99});
  for (int64_t label : batch["y"].to_vector<int64_t>()) CHECK((label >= 0 && label < 5));
  // Same seed, same bytes.
  const std::string again = dir.file("again.h5");
  REQUIRE(run({"synth", "--output", again, "--samples", "100", "--shape", "3,4,4", "--classes", "5",
               "--seed", "7", "--dtype", "uint8"}) == 0);
  Hdf5Dataset same({again});
  CHECK(same.get_batch(std::vector<int64_t>{0, 50, 99})["x"].to_vector<int>() ==
        batch["x"].to_vector<int>());
  REQUIRE(run({"synth", "--output", dir.file("f32.h5"), "--samples", "8", "--shape", "5", "--dtype",
               "float32"}) == 0);
  CHECK(Hdf5Dataset({dir.file("f32.h5")}).field("x").dtype == core::kFloat32);
  CHECK(run({"inspect", dir.file("f32.h5"), "--fields", "x,nope"}) == 1);
}

TEST_CASE("data tool: a failed conversion leaves no output") {
  TempDir dir;
  const std::string images = dir.file("images.idx");
  {
    std::ofstream out(images, std::ios::binary);
    const unsigned char header[] = {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2,
                                    0, 0, 0, 2, 1, 2, 3, 4, 5, 6, 7, 8};
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
  }
  const std::string labels = dir.file("labels.idx");
  {
    std::ofstream out(labels, std::ios::binary);
    const unsigned char header[] = {0, 0, 8, 1, 0, 0, 0, 3, 1, 2, 3};  // 3 labels for 2 images
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
  }
  CHECK(run({"convert-idx", "--images", images, "--labels", labels, "--output",
             dir.file("out.h5")}) == 1);
  CHECK(run({"convert-idx", "--images", images, "--labels", dir.file("missing.idx"), "--output",
             dir.file("out.h5")}) == 1);
  CHECK(run({"convert-idx", "--images", images, "--labels", labels, "--output", dir.file("out.h5"),
             "--shards", "5"}) == 1);
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    CHECK(entry.path().extension() != ".h5");
    CHECK(entry.path().string().find(".tmp") == std::string::npos);
  }
}

TEST_CASE("data tool: converts the Fashion-MNIST package to HDF5 shards") {
  const std::string images = std::string(kFashionMnist) + "/t10k-images-idx3-ubyte.gz";
  const std::string labels = std::string(kFashionMnist) + "/t10k-labels-idx1-ubyte.gz";
  REQUIRE_MESSAGE(std::filesystem::exists(images),
                  "the Fashion-MNIST package (dataset-fashion-mnist) is missing; "
                  "scripts/install-deps.sh installs it");
  REQUIRE(std::filesystem::exists(std::string(kFashionMnist) + "/train-images-idx3-ubyte.gz"));
  TempDir dir;
  const std::string output = dir.file("fashion-test.h5");
  REQUIRE(run({"convert-idx", "--images", images, "--labels", labels, "--output", output,
               "--shards", "2"}) == 0);
  auto paths = shard_paths(output, 2);
  CHECK(run({"inspect", paths[0], paths[1]}) == 0);
  Hdf5Dataset dataset(paths);
  REQUIRE(dataset.size() == 10000);
  CHECK(dataset.field("x").dtype == core::kUInt8);
  CHECK(dataset.field("x").sample_shape == core::Shape{1, 28, 28});
  CHECK(dataset.field("y").dtype == core::kInt64);
  CHECK(dataset.field("y").sample_shape == core::Shape{});
  CHECK(dataset.shard_size(0) == 5000);

  // Every pixel and label matches the IDX files; the test set holds 1000 of each class.
  IdxArray idx_images = read_idx(images), idx_labels = read_idx(labels);
  std::vector<int64_t> all(10000);
  for (int64_t i = 0; i < 10000; ++i) all[size_t(i)] = i;
  Batch batch = dataset.get_batch(all);
  CHECK(std::memcmp(batch["x"].data_ptr(), idx_images.bytes.data(), idx_images.bytes.size()) == 0);
  std::map<int64_t, int> per_class;
  std::vector<int64_t> y = batch["y"].to_vector<int64_t>();
  for (size_t i = 0; i < y.size(); ++i) {
    CHECK(y[i] == idx_labels.bytes[i]);
    ++per_class[y[i]];
  }
  CHECK(per_class.size() == 10);
  for (const auto& [label, count] : per_class) CHECK(count == 1000);
  core::hdf5::File file = core::hdf5::File::open(paths[1]);
  CHECK(file.read_string_attribute("/", "source_images") == "t10k-images-idx3-ubyte.gz");
  CHECK(file.read_int_attribute("/", "first_sample") == 5000);
}
