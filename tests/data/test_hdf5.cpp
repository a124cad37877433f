// core/hdf5.h: round trips of every DType, rows and blocks, attributes, groups, chunked and
// compressed layouts, the atomic writer, and errors that name the call, file and object.
#include <doctest/doctest.h>
#include <hdf5.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "../error_message.h"
#include "data_test_util.h"
#include "mpigrad/core/hdf5.h"
#include "mpigrad/core/tensor.h"

namespace {

using namespace mpigrad;  // NOLINT
namespace hdf5 = core::hdf5;
using data::test::TempDir;

using test::error_message;

}  // namespace

TEST_CASE("hdf5: every DType round-trips through a file") {
  TempDir dir;
  const std::string path = dir.file("types.h5");
  std::vector<double> values = {0.0, 1.0, -2.5, 3.25, 100.0, 0.5};
  const core::DType dtypes[] = {core::kFloat32, core::kFloat64, core::kFloat16, core::kBFloat16,
                                core::kInt32,   core::kInt64,   core::kUInt8,   core::kBool};
  {
    hdf5::File file = hdf5::File::create(path);
    for (core::DType dtype : dtypes) {
      std::vector<double> v = values;
      if (dtype == core::kUInt8) v = {0, 1, 2, 3, 100, 255};
      if (dtype == core::kBool) v = {0, 1, 1, 0, 1, 0};
      if (dtype == core::kInt32 || dtype == core::kInt64) v = {0, 1, -2, 3, 100, -7};
      core::Tensor tensor = core::Tensor::from_vector(v, {2, 3}, dtype);
      file.write_tensor(std::string("group/") + std::string(core::dtype_name(dtype)), tensor);
    }
  }
  hdf5::File file = hdf5::File::open(path);
  for (core::DType dtype : dtypes) {
    CAPTURE(dtype);
    hdf5::Dataset dataset =
        file.open_dataset(std::string("/group/") + std::string(core::dtype_name(dtype)));
    CHECK(dataset.dtype() == dtype);
    CHECK(dataset.shape() == core::Shape{2, 3});
    core::Tensor back = dataset.read_tensor();
    std::vector<double> expected = values;
    if (dtype == core::kUInt8) expected = {0, 1, 2, 3, 100, 255};
    if (dtype == core::kBool) expected = {0, 1, 1, 0, 1, 0};
    if (dtype == core::kInt32 || dtype == core::kInt64) expected = {0, 1, -2, 3, 100, -7};
    CHECK(back.to_vector<double>() == expected);
  }
  CHECK(file.list("/group").size() == 8);
  CHECK(file.list_datasets_recursive("/").size() == 8);
  CHECK(file.kind("/group") == hdf5::ObjectKind::Group);
  CHECK(file.kind("group/int64") == hdf5::ObjectKind::Dataset);
  CHECK(file.kind("/nothing/here") == hdf5::ObjectKind::Missing);
}

TEST_CASE("hdf5: rows, blocks and unions of hyperslabs, contiguous and chunked+gzip") {
  TempDir dir;
  for (hdf5::DatasetLayout layout :
       {hdf5::DatasetLayout{}, hdf5::DatasetLayout{4, 0}, hdf5::DatasetLayout{3, 6}}) {
    CAPTURE(layout.chunk_rows);
    const std::string path = dir.file("rows" + std::to_string(layout.chunk_rows) + ".h5");
    std::vector<float> data(10 * 4);
    for (size_t i = 0; i < data.size(); ++i) data[i] = float(i);
    {
      hdf5::File file = hdf5::File::create(path);
      hdf5::Dataset dataset = file.create_dataset("m", core::kFloat32, {10, 4}, layout);
      dataset.write_rows(0, 6, data.data(), core::kFloat32);
      dataset.write_rows(6, 4, data.data() + 24, core::kFloat32);
      CHECK(dataset.chunk_rows() == layout.chunk_rows);
    }
    hdf5::File file = hdf5::File::open(path);
    hdf5::Dataset dataset = file.open_dataset("m", {1 << 20, 521, 1.0});
    std::vector<float> rows(3 * 4);
    dataset.read_rows(5, 3, rows.data(), core::kFloat32);
    CHECK(rows == std::vector<float>(data.begin() + 20, data.begin() + 32));
    std::vector<double> block(2 * 2);  // read as float64: HDF5 converts
    dataset.read_block({1, 2}, {2, 2}, block.data(), core::kFloat64);
    CHECK(block == std::vector<double>{6, 7, 10, 11});
    hdf5::Dataspace selection = dataset.space();
    selection.select_rows(8, 1);
    selection.add_rows(0, 1);
    CHECK(selection.selected_elements() == 8);
    std::vector<float> both(8);
    dataset.read_selection(selection, both.data(),
                           core::kFloat32);  // file order: row 0, then row 8
    CHECK(both == std::vector<float>{0, 1, 2, 3, 32, 33, 34, 35});
  }
}

TEST_CASE("hdf5: scattered rows are read through a one-page sieve buffer, and read right") {
  // HDF5's default 64 KiB sieve buffer made each row of a shuffled batch read 64 KiB.
  TempDir dir;
  const std::string path = dir.file("scattered.h5");
  constexpr int64_t kRows = 3000, kCols = 301;  // 1204-byte rows: many straddle a page
  std::vector<float> data(size_t(kRows * kCols));
  for (size_t i = 0; i < data.size(); ++i) data[i] = float(i);
  {
    hdf5::File file = hdf5::File::create(path);
    file.create_dataset("x", core::kFloat32, {kRows, kCols})
        .write_rows(0, kRows, data.data(), core::kFloat32);
  }
  hdf5::File file = hdf5::File::open(path);
  const hid_t access = H5Fget_access_plist(file.id());
  REQUIRE(access >= 0);
  size_t sieve = 0;
  CHECK(H5Pget_sieve_buf_size(access, &sieve) >= 0);
  H5Pclose(access);
  CHECK(sieve == 4096);
  hdf5::Dataset dataset = file.open_dataset("x");
  const std::vector<int64_t> wanted = {3, 4, 17, 18, 1500, 2998, 2999};  // file order
  hdf5::Dataspace selection = dataset.space();
  selection.select_rows(wanted[0], 1);
  for (size_t i = 1; i < wanted.size(); ++i) selection.add_rows(wanted[i], 1);
  std::vector<float> rows(wanted.size() * kCols);
  dataset.read_selection(selection, rows.data(), core::kFloat32);
  for (size_t i = 0; i < wanted.size(); ++i) {
    CAPTURE(wanted[i]);
    CHECK(std::equal(rows.begin() + int64_t(i) * kCols, rows.begin() + int64_t(i + 1) * kCols,
                     data.begin() + wanted[i] * kCols));
  }
}

TEST_CASE("hdf5: MappedRows reads contiguous rows stored as memory wants, and nothing else") {
  TempDir dir;
  const std::string path = dir.file("mapped.h5");
  constexpr int64_t kRows = 1000, kCols = 7;
  std::vector<float> data(size_t(kRows * kCols));
  for (size_t i = 0; i < data.size(); ++i) data[i] = float(i) * 0.5f;
  {
    hdf5::File file = hdf5::File::create(path);
    // A small dataset first, so the next one starts away from a page boundary.
    file.create_dataset("pad", core::kUInt8, {13})
        .write(std::vector<uint8_t>(13, 1).data(), core::kUInt8);
    file.create_dataset("x", core::kFloat32, {kRows, kCols}).write(data.data(), core::kFloat32);
    file.create_dataset("chunked", core::kFloat32, {kRows, kCols}, {.chunk_rows = 64})
        .write(data.data(), core::kFloat32);
    // Big-endian floats: read as float32 they need a conversion, not a copy.
    const hsize_t extents[2] = {hsize_t(kRows), hsize_t(kCols)};
    const hid_t space = H5Screate_simple(2, extents, nullptr);
    const hid_t big = H5Dcreate2(file.id(), "big_endian", H5T_IEEE_F32BE, space, H5P_DEFAULT,
                                 H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(big >= 0);
    CHECK(H5Dwrite(big, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) >= 0);
    H5Dclose(big);
    H5Sclose(space);
    file.create_dataset("empty", core::kFloat32, {0, kCols});
  }
  hdf5::File file = hdf5::File::open(path);
  std::optional<hdf5::MappedRows> mapped =
      hdf5::MappedRows::open(file.open_dataset("x"), core::kFloat32);
  REQUIRE(mapped.has_value());
  CHECK(mapped->rows() == kRows);
  CHECK(mapped->row_bytes() == kCols * 4);
  for (int64_t row : {int64_t(0), int64_t(1), int64_t(517), kRows - 2}) {
    std::vector<float> two(2 * kCols);
    mapped->read(row, 2, two.data());
    CHECK(std::equal(two.begin(), two.end(), data.begin() + row * kCols));
  }
  // Moved maps stay valid; the moved-from one owns nothing.
  hdf5::MappedRows moved = std::move(*mapped);
  float first = -1;
  moved.read(kRows - 1, 1, &first);  // reads one float of the last row's 7
  CHECK(first == data[size_t((kRows - 1) * kCols)]);
  // Read as another type, chunked, or with nothing stored: HDF5 reads those.
  CHECK_FALSE(hdf5::MappedRows::open(file.open_dataset("x"), core::kFloat64).has_value());
  CHECK_FALSE(hdf5::MappedRows::open(file.open_dataset("chunked"), core::kFloat32).has_value());
  CHECK_FALSE(hdf5::MappedRows::open(file.open_dataset("big_endian"), core::kFloat32).has_value());
  CHECK(hdf5::MappedRows::open(file.open_dataset("pad"), core::kUInt8).has_value());
  CHECK_FALSE(hdf5::MappedRows::open(file.open_dataset("empty"), core::kFloat32).has_value());
}

TEST_CASE("hdf5: attributes of every kind, on the file, groups and datasets") {
  TempDir dir;
  const std::string path = dir.file("attributes.h5");
  {
    hdf5::File file = hdf5::File::create(path);
    file.create_group("/model/layer");
    file.write_tensor("/model/layer/weight", core::zeros({2, 2}));
    file.write_attribute("/", "config", std::string("lr = 0.1\n[model]"));
    file.write_attribute("/", "epoch", int64_t(7));
    file.write_attribute("/model", "scale", 0.25);
    file.write_attribute("/model/layer/weight", "note", "é ok");
    file.write_attribute("/", "epoch", int64_t(8));  // replaces
  }
  hdf5::File file = hdf5::File::open(path);
  CHECK(file.read_string_attribute("/", "config") == "lr = 0.1\n[model]");
  CHECK(file.read_int_attribute("/", "epoch") == 8);
  CHECK(file.read_double_attribute("/", "epoch") == 8.0);
  CHECK(file.read_double_attribute("model", "scale") == 0.25);
  CHECK(file.read_string_attribute("/model/layer/weight", "note") == "é ok");
  CHECK(file.has_attribute("/", "epoch"));
  CHECK_FALSE(file.has_attribute("/", "missing"));
  CHECK(file.list_attributes("/") == std::vector<std::string>{"config", "epoch"});
  std::string error = error_message([&] { (void)file.read_int_attribute("/", "config"); });
  CHECK(error.find("not a numeric attribute") != std::string::npos);
  CHECK(error.find(path) != std::string::npos);
  error = error_message([&] { (void)file.read_int_attribute("/", "missing"); });
  CHECK(error.find("missing") != std::string::npos);
}

TEST_CASE("hdf5: AtomicFileWriter leaves nothing behind unless committed") {
  TempDir dir;
  const std::string path = dir.file("atomic.h5");
  {
    hdf5::AtomicFileWriter writer(path);
    writer.file().write_tensor("x", core::ones({3}));
    CHECK_FALSE(std::filesystem::exists(path));
  }  // not committed
  CHECK(std::filesystem::is_empty(dir.path()));
  {
    hdf5::AtomicFileWriter writer(path);
    writer.file().write_tensor("x", core::ones({3}));
    writer.commit();
  }
  CHECK(hdf5::File::open(path).read_tensor("x").to_vector<float>() == std::vector<float>{1, 1, 1});
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path()), {}) == 1);
}

TEST_CASE("hdf5: failures are exceptions naming the call, the file and the object") {
  TempDir dir;
  const std::string path = dir.file("errors.h5");
  {
    hdf5::File file = hdf5::File::create(path);
    file.write_tensor("x", core::ones({4, 2}));
  }
  hdf5::File file = hdf5::File::open(path);
  std::string error = error_message([&] { (void)file.open_dataset("nope"); });
  CHECK(error.find(path) != std::string::npos);
  CHECK(error.find("/nope") != std::string::npos);
  CHECK(error.find("present: x") != std::string::npos);
  error = error_message([&] {
    std::vector<float> out(2);
    file.open_dataset("x").read_rows(3, 2, out.data(), core::kFloat32);
  });
  CHECK(error.find("exceed") != std::string::npos);
  CHECK(error.find(path + ":/x") != std::string::npos);
  error = error_message([&] {
    std::vector<float> out(4);
    file.open_dataset("x").read_block({3, 0}, {2, 2}, out.data(), core::kFloat32);
  });
  CHECK(error.find("exceeds extents") != std::string::npos);
  // Writing to a read-only file fails inside HDF5: the message names the call and the stack.
  error = error_message([&] {
    hdf5::Dataset dataset = file.open_dataset("x");
    std::vector<float> data(8, 2.0f);
    dataset.write(data.data(), core::kFloat32);
  });
  CHECK(error.find("H5Dwrite") != std::string::npos);
  CHECK(error.find(path) != std::string::npos);
  error = error_message([&] { (void)hdf5::File::open(dir.file("absent.h5")); });
  CHECK(error.find("no such file") != std::string::npos);
  CHECK(error.find("absent.h5") != std::string::npos);
  error = error_message([&] { (void)hdf5::File::create(dir.file("no/such/dir/f.h5")); });
  CHECK(error.find("H5Fcreate") != std::string::npos);
}
