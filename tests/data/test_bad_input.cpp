// Bad input: every case is one core::Error naming the file and the field, never a crash.
#include <doctest/doctest.h>
#include <hdf5.h>

#include <filesystem>
#include <fstream>

#include "../error_message.h"
#include "data_test_util.h"
#include "mpigrad/data/hdf5_dataset.h"
#include "mpigrad/data/idx.h"
#include "mpigrad/data/sampler.h"

namespace {

using namespace mpigrad;        // NOLINT
using namespace mpigrad::data;  // NOLINT
using data::test::TempDir;

using mpigrad::test::error_message;

std::string open_error(const std::vector<std::string>& paths,
                       std::vector<std::string> fields = {"x", "y"}) {
  return error_message([&] {
    Hdf5DatasetOptions options;
    options.fields = std::move(fields);
    Hdf5Dataset dataset(paths, options);
  });
}

bool mentions(const std::string& message, const std::string& what) {
  return message.find(what) != std::string::npos;
}

}  // namespace

TEST_CASE("bad input: a missing file or a missing field") {
  TempDir dir;
  const std::string good = dir.file("good.h5");
  data::test::write_pattern_file(good, 0, 4);
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
  const std::string path = dir.file("strings.h5");
  {
    core::hdf5::File file = core::hdf5::File::create(path);
    hsize_t dims[1] = {4};
    hid_t space = H5Screate_simple(1, dims, nullptr);
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, 8);
    hid_t dataset = H5Dcreate2(file.id(), "x", type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(dataset >= 0);
    char text[4][8] = {"a", "b", "c", "d"};
    REQUIRE(H5Dwrite(dataset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, text) >= 0);
    H5Dclose(dataset);
    H5Tclose(type);
    H5Sclose(space);
    file.write_tensor("y", core::zeros({4}, core::kInt64));
    file.write_tensor("scalar", core::Tensor::scalar(1.0));
  }
  std::string error = open_error({path});
  CHECK(mentions(error, path + ":/x"));
  CHECK(mentions(error, "unsupported element type string"));
  error = open_error({path}, {"y", "scalar"});
  CHECK(mentions(error, "'scalar' is a scalar"));

  // Big-endian data of a supported type is fine: HDF5 converts.
  const std::string big = dir.file("big_endian.h5");
  {
    core::hdf5::File file = core::hdf5::File::create(big);
    hsize_t dims[1] = {3};
    hid_t space = H5Screate_simple(1, dims, nullptr);
    hid_t dataset =
        H5Dcreate2(file.id(), "y", H5T_STD_I64BE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int64_t values[3] = {7, -1, 300};
    H5Dwrite(dataset, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values);
    H5Dclose(dataset);
    H5Sclose(space);
  }
  Hdf5DatasetOptions options;
  options.fields = {"y"};
  Hdf5Dataset dataset({big}, options);
  CHECK(dataset.get_batch(std::vector<int64_t>{2, 0, 1})["y"].to_vector<int64_t>() ==
        std::vector<int64_t>{300, 7, -1});
}

TEST_CASE("bad input: a shard whose per-sample shape or dtype differs") {
  TempDir dir;
  const std::string first = dir.file("first.h5"), second = dir.file("second.h5"),
                    third = dir.file("third.h5");
  data::test::write_pattern_file(first, 0, 4);
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
  data::test::write_pattern_file(path, 0, 1000);
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
  data::test::write_pattern_file(path, 0, 3);
  Hdf5Dataset dataset({path});
  std::string error = error_message([&] { dataset.get_batch(std::vector<int64_t>{0, 3}); });
  CHECK(mentions(error, path));
  CHECK(mentions(error, "index 3 out of range [0, 3)"));
  CHECK(mentions(error_message([&] { dataset.get_batch(std::vector<int64_t>{-1}); }), "index -1"));
  error = error_message([&] { dataset.set_rank_slice(4, 0); });
  CHECK(mentions(error, path));
  CHECK(mentions(error, "3 samples, fewer than the 4 ranks"));
  CHECK(mentions(error_message([] { DistributedSampler(3, 4, 1); }), "fewer than the 4 ranks"));
}

TEST_CASE("bad input: IDX files") {
  TempDir dir;
  CHECK(mentions(error_message([&] { read_idx(dir.file("none.idx")); }), "no such file"));
  const std::string bad_magic = dir.file("bad.idx");
  std::ofstream(bad_magic, std::ios::binary) << "GIF89a....";
  CHECK(mentions(error_message([&] { read_idx(bad_magic); }), "bad magic"));
  const std::string truncated = dir.file("short.idx");
  {
    std::ofstream out(truncated, std::ios::binary);
    const unsigned char header[] = {0, 0,  8, 1, 0, 0,
                                    0, 10, 1, 2, 3};  // declares 10 bytes, holds 3
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
  }
  std::string error = error_message([&] { read_idx(truncated); });
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

namespace {
// Writes dataset `name` of HDF5 type `file_type` holding `values` (given as int64).
void write_integers(core::hdf5::File& file, const char* name, hid_t file_type,
                    const std::vector<int64_t>& values) {
  hsize_t dims[1] = {values.size()};
  hid_t space = H5Screate_simple(1, dims, nullptr);
  hid_t dataset =
      H5Dcreate2(file.id(), name, file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(dataset >= 0);
  REQUIRE(H5Dwrite(dataset, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0);
  H5Dclose(dataset);
  H5Sclose(space);
}
}  // namespace

TEST_CASE("integer types without a DType of their own are read widened, values intact") {
  TempDir dir;
  const std::string path = dir.file("integers.h5");
  const std::vector<int64_t> small = {0, 1, 9, 100};
  {
    core::hdf5::File file = core::hdf5::File::create(path);
    write_integers(file, "i8", H5T_STD_I8LE, {-128, 0, 9, 127});
    write_integers(file, "i16", H5T_STD_I16BE, {-32768, 0, 9, 32767});
    write_integers(file, "u16", H5T_STD_U16LE, {0, 1, 9, 65535});
    write_integers(file, "u32", H5T_STD_U32LE, {0, 1, 9, 4294967295});
    write_integers(file, "u64", H5T_STD_U64LE, small);
  }
  Hdf5DatasetOptions options;
  options.fields = {"i8", "i16", "u16", "u32", "u64"};
  Hdf5Dataset dataset({path}, options);
  CHECK(dataset.field("i8").dtype == core::kInt32);
  CHECK(dataset.field("i16").dtype == core::kInt32);
  CHECK(dataset.field("u16").dtype == core::kInt32);
  CHECK(dataset.field("u32").dtype == core::kInt64);
  CHECK(dataset.field("u64").dtype == core::kInt64);
  Batch batch = dataset.get_batch(std::vector<int64_t>{3, 0});
  CHECK(batch["i8"].to_vector<int32_t>() == std::vector<int32_t>{127, -128});
  CHECK(batch["i16"].to_vector<int32_t>() == std::vector<int32_t>{32767, -32768});
  CHECK(batch["u16"].to_vector<int32_t>() == std::vector<int32_t>{65535, 0});
  CHECK(batch["u32"].to_vector<int64_t>() == std::vector<int64_t>{4294967295, 0});
  CHECK(dataset.read_field("u64", 0, 4).to_vector<int64_t>() == small);
}

TEST_CASE("bad input: datasets that declare more samples than the file stores") {
  TempDir dir;
  namespace hdf5 = core::hdf5;
  // h5py's create_dataset("x", shape=(huge, 8), chunks=(1024, 8)) with one chunk written.
  const std::string sparse = dir.file("sparse.h5");
  {
    hdf5::File file = hdf5::File::create(sparse);
    const int64_t huge = int64_t(1) << 40;
    hdf5::Dataset x = file.create_dataset("x", core::kFloat32, {huge, 8}, {.chunk_rows = 1024});
    x.write_rows(0, 1024, core::zeros({1024, 8}).data_ptr(), core::kFloat32);
    hdf5::Dataset y = file.create_dataset("y", core::kInt64, {huge}, {.chunk_rows = 1 << 16});
    y.write_rows(0, 1024, core::zeros({1024}, core::kInt64).data_ptr(), core::kInt64);
  }
  CHECK(std::filesystem::file_size(sparse) < (1 << 20));
  std::string error = open_error({sparse});
  CHECK(mentions(error, sparse));
  CHECK(mentions(error, "field 'x' declares 1099511627776 samples"));
  CHECK(mentions(error, "only 1 chunk(s) were ever written"));
  CHECK(mentions(error, "32.0 KiB stored"));

  // A contiguous dataset created and never written.
  const std::string empty = dir.file("unwritten.h5");
  {
    hdf5::File file = hdf5::File::create(empty);
    file.create_dataset("x", core::kUInt8, {100000, 28, 28});
    file.write_tensor("y", core::zeros({100000}, core::kInt64));
  }
  error = open_error({empty});
  CHECK(mentions(error, "field 'x' declares 100000 samples (74.8 MiB) but stores only 0 bytes"));

  // Compressed, fully written data stores fewer bytes than it declares, and is fine.
  const std::string packed = dir.file("compressed.h5");
  {
    hdf5::File file = hdf5::File::create(packed);
    file.write_tensor("x", core::zeros({5000, 16}), {.chunk_rows = 512, .gzip_level = 6});
    file.write_tensor("y", core::zeros({5000}, core::kInt64), {.chunk_rows = 512, .gzip_level = 6});
  }
  Hdf5Dataset dataset({packed});
  CHECK(dataset.size() == 5000);
}

TEST_CASE("bad input: a sampler over more samples than memory can index is refused up front") {
  const int64_t huge = int64_t(1) << 45;  // 256 TiB of int64 indices
  std::string error = error_message([&] { DistributedSampler(huge, 2, 0); });
  CHECK(mentions(error, "35184372088832 samples"));
  CHECK(mentions(error, "GiB of indices"));
  CHECK(mentions(error_message([&] { RandomSampler sampler(huge); }), "RandomSampler"));
  CHECK(mentions(error_message([&] { SequentialSampler sampler(huge); }), "SequentialSampler"));
}
