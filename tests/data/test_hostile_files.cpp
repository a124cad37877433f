// Hostile HDF5 files, written with the C API: attributes of awkward types and shapes, a corrupt
// global heap, groups that link back to their ancestors, groups nested without end. Reading,
// listing and `mpigrad data inspect` must answer each with a listing or one clear core::Error,
// never a crash, an overflow or a hang.
#include <doctest/doctest.h>
#include <hdf5.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "../error_message.h"
#include "data_test_util.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/hdf5.h"
#include "mpigrad/data/data_tool.h"
#include "mpigrad/data/hdf5_dataset.h"

namespace {

using namespace mpigrad;  // NOLINT
namespace hdf5 = core::hdf5;
using data::test::TempDir;

using mpigrad::test::error_message;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Runs `mpigrad data inspect FILE`, returning its exit code; `out` gets what it printed.
int inspect(const std::string& path, std::string& out) {
  std::vector<std::string> args = {"mpigrad-data", "inspect", path};
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::ostringstream captured;
  std::streambuf* saved_out = std::cout.rdbuf(captured.rdbuf());
  std::streambuf* saved_err = std::cerr.rdbuf(captured.rdbuf());
  int code = data::run_data_command(int(args.size()), argv.data());
  std::cout.rdbuf(saved_out);
  std::cerr.rdbuf(saved_err);
  out = captured.str();
  return code;
}

// A file that inspect accepts: x uint8 [4, 2], y int64 [4].
void write_minimal_dataset(hdf5::File& file) {
  file.write_tensor("x", core::zeros({4, 2}, core::kUInt8));
  file.write_tensor("y", core::zeros({4}, core::kInt64));
}

// An attribute of `type` over a simple dataspace of `dims` (scalar when empty) holding `data`.
void write_raw_attribute(hid_t object, const char* name, hid_t type,
                         const std::vector<hsize_t>& dims, const void* data) {
  hid_t space = dims.empty() ? H5Screate(H5S_SCALAR)
                             : H5Screate_simple(int(dims.size()), dims.data(), nullptr);
  REQUIRE(space >= 0);
  hid_t attribute = H5Acreate2(object, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(attribute >= 0);
  REQUIRE(H5Awrite(attribute, type, data) >= 0);
  H5Aclose(attribute);
  H5Sclose(space);
}

hid_t vlen_string_type() {
  hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, H5T_VARIABLE);
  return type;
}

hid_t fixed_string_type(size_t size) {
  hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, size);
  H5Tset_strpad(type, H5T_STR_NULLPAD);
  return type;
}

}  // namespace

TEST_CASE("hostile files: an attribute that is an array of variable-length strings") {
  TempDir dir;
  const std::string path = dir.file("vlen_array.h5");
  {
    hdf5::File file = hdf5::File::create(path);
    write_minimal_dataset(file);
    hid_t type = vlen_string_type();
    const char* names[3] = {"a", "bb", "ccc"};
    write_raw_attribute(file.id(), "names", type, {3}, names);
    H5Tclose(type);
  }
  hdf5::File file = hdf5::File::open(path);
  // Not one string: an error naming the attribute and its shape, not 24 bytes into one char*.
  std::string error = error_message([&] { (void)file.read_string_attribute("/", "names"); });
  CHECK(contains(error, "attribute 'names'"));
  CHECK(contains(error, "[3]"));
  std::string out;
  CHECK(inspect(path, out) == 0);
  CHECK(contains(out, "@names = [\"a\", \"bb\", \"ccc\"]"));
}

TEST_CASE("hostile files: an attribute that is a 2-D array of fixed-length strings") {
  TempDir dir;
  const std::string path = dir.file("fixed_2d.h5");
  {
    hdf5::File file = hdf5::File::create(path);
    write_minimal_dataset(file);
    hid_t type = fixed_string_type(4);
    const char grid[6][4] = {{'a', 'b', 'c', 'd'}, "e", "f", "gh", "ij", "k"};  // "abcd": no NUL
    write_raw_attribute(file.id(), "grid", type, {2, 3}, grid);
    // The same type as one string, and as a 1-element array: both read as a string.
    const char one[4] = "xyz", single[4] = "pq";
    write_raw_attribute(file.id(), "one", type, {}, one);
    write_raw_attribute(file.id(), "single", type, {1}, single);
    H5Tclose(type);
  }
  hdf5::File file = hdf5::File::open(path);
  std::string error = error_message([&] { (void)file.read_string_attribute("/", "grid"); });
  CHECK(contains(error, "attribute 'grid'"));
  CHECK(contains(error, "[2, 3]"));
  CHECK(file.read_string_attribute("/", "one") == "xyz");
  CHECK(file.read_string_attribute("/", "single") == "pq");
  std::string out;
  CHECK(inspect(path, out) == 0);
  CHECK(contains(out, "@grid = [2, 3]: [\"abcd\", \"e\", \"f\", \"gh\", \"ij\", \"k\"]"));
  CHECK(contains(out, "@one = xyz"));
  CHECK(contains(out, "@single = pq"));
}

TEST_CASE("hostile files: attributes of unsupported types are listed, not read") {
  TempDir dir;
  const std::string path = dir.file("compound.h5");
  {
    hdf5::File file = hdf5::File::create(path);
    write_minimal_dataset(file);
    hid_t type = H5Tcreate(H5T_COMPOUND, 16);
    H5Tinsert(type, "a", 0, H5T_NATIVE_INT64);
    H5Tinsert(type, "b", 8, H5T_NATIVE_DOUBLE);
    const char pair[16] = {};
    write_raw_attribute(file.id(), "pair", type, {}, pair);
    H5Tclose(type);
    const int32_t numbers[4] = {1, 2, 3, 4};
    write_raw_attribute(file.id(), "numbers", H5T_NATIVE_INT32, {4}, numbers);
    const double scale = 0.5;
    write_raw_attribute(file.id(), "scale", H5T_NATIVE_DOUBLE, {}, &scale);
  }
  std::string out;
  CHECK(inspect(path, out) == 0);
  CHECK(contains(out, "@pair = unsupported (compound, shape [])"));
  CHECK(contains(out, "@numbers = [1, 2, 3, 4]"));
  CHECK(contains(out, "@scale = 0.5"));
}

// Writes a scalar variable-length string attribute, then overwrites the size of its object in
// the file's global heap collection (the "GCOL" block) with garbage: HDF5 1.10 copies that many
// bytes out of the heap into a buffer sized for the string.
TEST_CASE("hostile files: garbage in a string attribute's global heap") {
  TempDir dir;
  const std::string path = dir.file("heap.h5");
  {
    hdf5::File file = hdf5::File::create(path);
    write_minimal_dataset(file);
    file.write_attribute("/", "note", std::string("hello, heap"));
    file.write_attribute("/", "epoch", int64_t(3));
  }
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  size_t heap = bytes.find("GCOL");
  REQUIRE(heap != std::string::npos);
  // GCOL, version, 3 reserved, the collection size (8 bytes); then each object: its index (2),
  // reference count (2), 4 reserved, its size (8) and its data.
  const size_t object = heap + 16;
  uint16_t index = 0;
  std::memcpy(&index, bytes.data() + object, 2);
  REQUIRE(index == 1);
  uint64_t size = 0;
  std::memcpy(&size, bytes.data() + object + 8, 8);
  REQUIRE(size == std::strlen("hello, heap"));
  const uint64_t garbage = uint64_t(1) << 40;
  std::memcpy(bytes.data() + object + 8, &garbage, 8);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
  }
  hdf5::File file = hdf5::File::open(path);
  std::string error = error_message([&] { (void)file.read_string_attribute("/", "note"); });
  CHECK(contains(error, "attribute 'note'"));
  std::string out;
  CHECK(inspect(path, out) == 0);
  CHECK(contains(out, "@note = unreadable"));
  CHECK(contains(out, "@epoch = 3"));
}

TEST_CASE("hostile files: hard links from a group to itself or to an ancestor") {
  TempDir dir;
  const std::string path = dir.file("cycles.h5");
  {
    hdf5::File file = hdf5::File::create(path);
    write_minimal_dataset(file);
    file.create_group("/g/h");
    file.write_tensor("/g/h/data", core::zeros({3}));
    REQUIRE(H5Lcreate_hard(file.id(), "/g", file.id(), "/g/h/loop", H5P_DEFAULT, H5P_DEFAULT) >= 0);
    REQUIRE(H5Lcreate_hard(file.id(), "/", file.id(), "/self", H5P_DEFAULT, H5P_DEFAULT) >= 0);
    REQUIRE(H5Lcreate_soft("/g", file.id(), "/g/soft", H5P_DEFAULT, H5P_DEFAULT) >= 0);
  }
  hdf5::File file = hdf5::File::open(path);
  CHECK(file.list_datasets_recursive("/") == std::vector<std::string>{"/g/h/data", "/x", "/y"});
  std::string out;
  CHECK(inspect(path, out) == 0);
  CHECK(contains(out, "/g/h/loop  (link to an ancestor group, not followed)"));
  CHECK(contains(out, "/self  (link to an ancestor group, not followed)"));
  CHECK(contains(out, "/g/soft  (link to an ancestor group, not followed)"));
  CHECK(contains(out, "/g/h/data  float32  [3]"));
}

TEST_CASE("hostile files: groups nested deeper than the walk follows") {
  TempDir dir;
  const std::string path = dir.file("deep.h5");
  std::string deepest;
  {
    hdf5::File file = hdf5::File::create(path);
    write_minimal_dataset(file);
    for (int d = 0; d < 70; ++d) deepest += "/a";
    file.create_group(deepest);
  }
  hdf5::File file = hdf5::File::open(path);
  std::string error = error_message([&] { (void)file.list_datasets_recursive("/"); });
  CHECK(contains(error, path));
  CHECK(contains(error, "nested deeper than 64"));
  CHECK(contains(error, "/a/a/a"));
  std::string out;
  CHECK(inspect(path, out) == 1);
  CHECK(contains(out, "nested deeper than 64"));
}

TEST_CASE("hostile files: a batch too large to allocate names the file, the field and the bytes") {
  TempDir dir;
  const std::string path = dir.file("wide.h5");
  const int64_t sample = int64_t(1) << 25;  // 32 MiB per sample
  {
    hdf5::File file = hdf5::File::create(path);
    file.write_tensor("x", core::zeros({1, sample}, core::kUInt8));
    file.write_tensor("y", core::zeros({1}, core::kInt64));
  }
  data::Hdf5Dataset dataset({path});
  // 2^23 copies of sample 0: 2^48 bytes, more than any address space holds.
  const std::vector<int64_t> indices(size_t(1) << 23, 0);
  std::string error = error_message([&] { (void)dataset.get_batch(indices); });
  CHECK(contains(error, path));
  CHECK(contains(error, "field 'x'"));
  CHECK(contains(error, "cannot allocate 281474976710656 bytes (256.0 TiB)"));
  CHECK(contains(error, "a batch of 8388608 samples"));
}
