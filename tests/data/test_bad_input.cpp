// Bad input: every case is one core::Error naming the file and the field, never a crash.
#include <doctest/doctest.h>
#include <hdf5.h>

#include <filesystem>
#include <fstream>

#include "data_test_util.h"
#include "mpigrad/data/hdf5_dataset.h"
#include "mpigrad/data/idx.h"
#include "mpigrad/data/sampler.h"

namespace {

using namespace mpigrad;        // NOLINT
using namespace mpigrad::data;  // NOLINT
using test::TempDir;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const core::Error& error) {
    return error.what();
  }
  return "(no error)";
}

std::string open_error(const std::vector<std::string>& paths, std::vector<std::string> fields = {"x", "y"}) {
  return error_of([&] {
    Hdf5DatasetOptions options;
    options.fields = std::move(fields);
    Hdf5Dataset dataset(paths, options);
  });
}

bool mentions(const std::string& message, const std::string& what) { return message.find(what) != std::string::npos; }

}  // namespace

TEST_CASE("bad input: a missing file or a missing field") {
  TempDir dir;
  const std::string good = dir.file("good.h5");
  test::write_pattern_file(good, 0, 4);
  std::string error = open_error({good, dir.file("missing.h5")});
  CHECK(mentions(error, "missing.h5"));
  CHECK(mentions(error, "no such file"));
  error = open_error({good}, {"x", "labels"});
  CHECK(mentions(error, good));
  CHECK(mentions(error, "labels"));
  CHECK(mentions(error, "present: x, y"));
}

TEST_CASE("bad input: fields whose N differ") {
  TempDir dir;
  const std::string path = dir.file("uneven.h5");
  {
    core::hdf5::File file = core::hdf5::File::create(path);
    file.write_tensor("x", core::zeros({5, 3}));
    file.write_tensor("y", core::zeros({4}, core::kInt64));
  }
  std::string error = open_error({path});
  CHECK(mentions(error, path));
  CHECK(mentions(error, "field 'y' has 4 samples but field 'x' has 5"));
}

TEST_CASE("bad input: an unsupported dtype, a scalar field") {
  TempDir dir;
  const std::string path = dir.file("uint16.h5");
  {
    core::hdf5::File file = core::hdf5::File::create(path);
    hsize_t dims[2] = {4, 2};
    hid_t space = H5Screate_simple(2, dims, nullptr);
    hid_t dataset = H5Dcreate2(file.id(), "x", H5T_STD_U16LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(dataset >= 0);
    H5Dclose(dataset);
    H5Sclose(space);
    file.write_tensor("y", core::zeros({4}, core::kInt64));
    file.write_tensor("scalar", core::Tensor::scalar(1.0));
  }
  std::string error = open_error({path});
  CHECK(mentions(error, path + ":/x"));
  CHECK(mentions(error, "unsupported element type uint16"));
  error = open_error({path}, {"y", "scalar"});
  CHECK(mentions(error, "'scalar' is a scalar"));

  // Big-endian data of a supported type is fine: HDF5 converts.
  const std::string big = dir.file("big_endian.h5");
  {
    core::hdf5::File file = core::hdf5::File::create(big);
    hsize_t dims[1] = {3};
    hid_t space = H5Screate_simple(1, dims, nullptr);
    hid_t dataset = H5Dcreate2(file.id(), "y", H5T_STD_I64BE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int64_t values[3] = {7, -1, 300};
    H5Dwrite(dataset, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values);
    H5Dclose(dataset);
    H5Sclose(space);
  }
  Hdf5DatasetOptions options;
  options.fields = {"y"};
  Hdf5Dataset dataset({big}, options);
  CHECK(dataset.get_batch(std::vector<int64_t>{2, 0, 1})["y"].to_vector<int64_t>() == std::vector<int64_t>{300, 7, -1});
}

TEST_CASE("bad input: a shard whose per-sample shape or dtype differs") {
  TempDir dir;
  const std::string first = dir.file("first.h5"), second = dir.file("second.h5"), third = dir.file("third.h5");
  test::write_pattern_file(first, 0, 4);
  {
    core::hdf5::File file = core::hdf5::File::create(second);
    file.write_tensor("x", core::zeros({3, 3, 2}, core::kUInt8));
    file.write_tensor("y", core::zeros({3}, core::kInt64));
  }
  {
    core::hdf5::File file = core::hdf5::File::create(third);
    file.write_tensor("x", core::zeros({3, 2, 3}, core::kUInt8));
    file.write_tensor("y", core::zeros({3}, core::kInt32));
  }
  std::string error = open_error({first, second});
  CHECK(mentions(error, second));
  CHECK(mentions(error, first));
  CHECK(mentions(error, "field 'x' has per-sample shape [3, 2]"));
  error = open_error({first, third});
  CHECK(mentions(error, "field 'y' is int32"));
}

TEST_CASE("bad input: truncated and corrupt files") {
  TempDir dir;
  const std::string path = dir.file("whole.h5");
  test::write_pattern_file(path, 0, 1000);
  const auto size = std::filesystem::file_size(path);
  for (auto keep : {size / 2, size - 1, uintmax_t(100), uintmax_t(0)}) {
    CAPTURE(keep);
    const std::string truncated = dir.file("truncated.h5");
    std::filesystem::copy_file(path, truncated, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(truncated, keep);
    std::string error = open_error({truncated});
    CHECK(mentions(error, truncated));
  }
  const std::string garbage = dir.file("garbage.h5");
  {
    std::ofstream out(garbage, std::ios::binary);
    for (int i = 0; i < 4096; ++i) out.put(char(i * 31));
  }
  std::string error = open_error({garbage});
  CHECK(mentions(error, garbage));
  CHECK(mentions(error, "not an HDF5 file"));
  CHECK(mentions(open_error({dir.path()}), "is a directory"));
}

TEST_CASE("bad input: indices out of range, fewer samples than ranks") {
  TempDir dir;
  const std::string path = dir.file("three.h5");
  test::write_pattern_file(path, 0, 3);
  Hdf5Dataset dataset({path});
  std::string error = error_of([&] { dataset.get_batch(std::vector<int64_t>{0, 3}); });
  CHECK(mentions(error, path));
  CHECK(mentions(error, "index 3 out of range [0, 3)"));
  CHECK(mentions(error_of([&] { dataset.get_batch(std::vector<int64_t>{-1}); }), "index -1"));
  error = error_of([&] { dataset.set_rank_slice(4, 0); });
  CHECK(mentions(error, path));
  CHECK(mentions(error, "3 samples, fewer than the 4 ranks"));
  CHECK(mentions(error_of([] { DistributedSampler(3, 4, 1); }), "fewer than the 4 ranks"));
}

TEST_CASE("bad input: IDX files") {
  TempDir dir;
  CHECK(mentions(error_of([&] { read_idx(dir.file("none.idx")); }), "no such file"));
  const std::string bad_magic = dir.file("bad.idx");
  std::ofstream(bad_magic, std::ios::binary) << "GIF89a....";
  CHECK(mentions(error_of([&] { read_idx(bad_magic); }), "bad magic"));
  const std::string truncated = dir.file("short.idx");
  {
    std::ofstream out(truncated, std::ios::binary);
    const unsigned char header[] = {0, 0, 8, 1, 0, 0, 0, 10, 1, 2, 3};  // declares 10 bytes, holds 3
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
  }
  std::string error = error_of([&] { read_idx(truncated); });
  CHECK(mentions(error, "short.idx"));
  CHECK(mentions(error, "truncated"));
  const std::string plain = dir.file("ok.idx");
  {
    std::ofstream out(plain, std::ios::binary);
    const unsigned char bytes[] = {0, 0, 0x0C, 1, 0, 0, 0, 2, 0, 0, 1, 2, 0xFF, 0xFF, 0xFF, 0xFE};
    out.write(reinterpret_cast<const char*>(bytes), sizeof(bytes));
  }
  IdxArray array = read_idx(plain);
  CHECK(array.dtype == core::kInt32);
  CHECK(array.dims == std::vector<int64_t>{2});
  int32_t values[2];
  std::memcpy(values, array.bytes.data(), 8);
  CHECK(values[0] == 258);
  CHECK(values[1] == -2);
}
