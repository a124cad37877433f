// Writes the seed inputs of fuzz_hdf5 and fuzz_idx with HDF5's C API and plain bytes, so the
// corpus is the project's own (fuzz/make_corpus.sh runs it; its output is committed under
// fuzz/corpus/). The HDF5 seeds are small valid files covering what a reader meets: the usual
// x/y fields in several dtypes and layouts, shards that disagree, N = 0, groups, soft, hard and
// external links, a cyclic group, and attributes of every kind (scalar and array strings, fixed
// and variable length, numbers, enums, compounds). The IDX seeds are tiny images/labels pairs in
// fuzz_idx's framing: [uint32 LE images bytes][images][labels].
//     fuzz_make_seeds HDF5_DIR IDX_DIR
#include <hdf5.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

void check(long long status, const char* what) {
  if (status < 0) {
    std::fprintf(stderr, "fuzz_make_seeds: %s failed\n", what);
    std::exit(1);
  }
}

hid_t create(const std::string& path) {
  hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  check(file, "H5Fcreate");
  return file;
}

void dataset(hid_t where, const char* name, hid_t type, std::vector<hsize_t> dims, const void* data,
             hsize_t chunk_rows = 0, int gzip = 0, bool compact = false) {
  hid_t space = dims.empty() ? H5Screate(H5S_SCALAR)
                             : H5Screate_simple(int(dims.size()), dims.data(), nullptr);
  check(space, "H5Screate");
  hid_t create_list = H5Pcreate(H5P_DATASET_CREATE);
  if (chunk_rows > 0) {
    std::vector<hsize_t> chunk = dims;
    chunk[0] = chunk_rows;
    check(H5Pset_chunk(create_list, int(chunk.size()), chunk.data()), "H5Pset_chunk");
    if (gzip > 0) check(H5Pset_deflate(create_list, unsigned(gzip)), "H5Pset_deflate");
  } else if (compact) {
    check(H5Pset_layout(create_list, H5D_COMPACT), "H5Pset_layout");
  }
  hid_t set = H5Dcreate2(where, name, type, space, H5P_DEFAULT, create_list, H5P_DEFAULT);
  check(set, "H5Dcreate2");
  if (data != nullptr) check(H5Dwrite(set, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "H5Dwrite");
  H5Dclose(set);
  H5Pclose(create_list);
  H5Sclose(space);
}

void attribute(hid_t where, const char* name, hid_t type, std::vector<hsize_t> dims,
               const void* data) {
  hid_t space = dims.empty() ? H5Screate(H5S_SCALAR)
                             : H5Screate_simple(int(dims.size()), dims.data(), nullptr);
  hid_t attr = H5Acreate2(where, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  check(attr, "H5Acreate2");
  check(H5Awrite(attr, type, data), "H5Awrite");
  H5Aclose(attr);
  H5Sclose(space);
}

hid_t fixed_string(size_t size) {
  hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, size);
  return type;
}

hid_t variable_string() {
  hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, H5T_VARIABLE);
  return type;
}

// x uint8 [n, 1, 2, 2] and y int64 [n], the shape of a converted MNIST file.
void xy(hid_t file, hsize_t n, hsize_t chunk_rows = 0, int gzip = 0) {
  std::vector<uint8_t> x(n * 4);
  std::vector<int64_t> y(n);
  for (size_t i = 0; i < x.size(); ++i) x[i] = uint8_t(i * 37);
  for (size_t i = 0; i < y.size(); ++i) y[i] = int64_t(i % 3);
  dataset(file, "x", H5T_NATIVE_UINT8, {n, 1, 2, 2}, x.data(), chunk_rows, gzip);
  dataset(file, "y", H5T_NATIVE_INT64, {n}, y.data(), chunk_rows, gzip);
}

void write_hdf5_seeds(const std::string& dir) {
  {  // the plain case, with the attributes convert-idx writes
    hid_t file = create(dir + "/basic.h5");
    xy(file, 4);
    hid_t text = fixed_string(24);
    attribute(file, "created_by", text, {}, "mpigrad-data convert-idx");
    H5Tclose(text);
    H5Fclose(file);
  }
  {  // chunked and deflated
    hid_t file = create(dir + "/chunked_gzip.h5");
    xy(file, 6, 2, 4);
    H5Fclose(file);
  }
  {  // other dtypes: float32 x, uint16 y (read as int32), a compact dataset
    hid_t file = create(dir + "/dtypes.h5");
    float x[6] = {0.5f, -1, 2, 3, 4, 5};
    uint16_t y[3] = {0, 1, 2};
    dataset(file, "x", H5T_IEEE_F32BE, {3, 2}, x);
    dataset(file, "y", H5T_NATIVE_UINT16, {3}, y, 0, 0, true);
    double scale = 0.25;
    attribute(file, "scale", H5T_NATIVE_DOUBLE, {}, &scale);
    int64_t version = 3;
    attribute(file, "version", H5T_NATIVE_INT64, {}, &version);
    H5Fclose(file);
  }
  {  // N = 0, and a scalar dataset
    hid_t file = create(dir + "/empty.h5");
    dataset(file, "x", H5T_NATIVE_FLOAT, {0, 2}, nullptr);
    dataset(file, "y", H5T_NATIVE_INT64, {0}, nullptr);
    int32_t value = 7;
    dataset(file, "scalar", H5T_NATIVE_INT32, {}, &value);
    H5Fclose(file);
  }
  {  // fields that disagree on N; a bool field
    hid_t file = create(dir + "/mismatch.h5");
    uint8_t x[5] = {1, 2, 3, 4, 5};
    int64_t y[4] = {0, 1, 0, 1};
    dataset(file, "x", H5T_NATIVE_UINT8, {5}, x);
    dataset(file, "y", H5T_NATIVE_INT64, {4}, y);
    hid_t boolean = H5Tenum_create(H5T_NATIVE_INT8);
    int8_t no = 0, yes = 1;
    H5Tenum_insert(boolean, "FALSE", &no);
    H5Tenum_insert(boolean, "TRUE", &yes);
    int8_t flags[4] = {0, 1, 1, 0};
    dataset(file, "flags", boolean, {4}, flags);
    H5Tclose(boolean);
    H5Fclose(file);
  }
  {  // groups and links: nested datasets, soft, hard and external links
    hid_t file = create(dir + "/links.h5");
    xy(file, 2);
    hid_t group = H5Gcreate2(file, "/g", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t sub = H5Gcreate2(group, "sub", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    double z[2] = {1.5, 2.5};
    dataset(sub, "z", H5T_NATIVE_DOUBLE, {2}, z);
    check(H5Lcreate_soft("/x", file, "/soft_x", H5P_DEFAULT, H5P_DEFAULT), "H5Lcreate_soft");
    check(H5Lcreate_soft("/nowhere", file, "/dangling", H5P_DEFAULT, H5P_DEFAULT),
          "H5Lcreate_soft");
    check(H5Lcreate_hard(file, "/y", group, "y_again", H5P_DEFAULT, H5P_DEFAULT), "H5Lcreate_hard");
    check(H5Lcreate_external("other.h5", "/x", file, "/external_x", H5P_DEFAULT, H5P_DEFAULT),
          "H5Lcreate_external");
    H5Gclose(sub);
    H5Gclose(group);
    H5Fclose(file);
  }
  {  // a cycle: a group holding a hard link to itself and one to the root
    hid_t file = create(dir + "/cycle.h5");
    xy(file, 2);
    hid_t group = H5Gcreate2(file, "/g", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    check(H5Lcreate_hard(file, "/g", group, "loop", H5P_DEFAULT, H5P_DEFAULT), "H5Lcreate_hard");
    check(H5Lcreate_hard(file, "/", file, "/self", H5P_DEFAULT, H5P_DEFAULT), "H5Lcreate_hard");
    H5Gclose(group);
    H5Fclose(file);
  }
  {  // attributes of every kind on the root and on a dataset
    hid_t file = create(dir + "/attributes.h5");
    xy(file, 2);
    hid_t vlen = variable_string();
    const char* one = "variable length";
    attribute(file, "vlen_scalar", vlen, {}, &one);
    const char* many[3] = {"a", "bb", "ccc"};
    attribute(file, "vlen_array", vlen, {3}, many);
    hid_t fixed = fixed_string(4);
    attribute(file, "fixed_2d", fixed, {2, 2}, "abcdefghijklmnop");
    attribute(file, "fixed_scalar", fixed, {}, "wxyz");
    int32_t ints[4] = {1, 2, 3, 4};
    attribute(file, "int_array", H5T_NATIVE_INT32, {4}, ints);
    float f = 3.5f;
    attribute(file, "float", H5T_IEEE_F32BE, {}, &f);
    hid_t colour = H5Tenum_create(H5T_NATIVE_INT32);
    int32_t red = 0, green = 1;
    H5Tenum_insert(colour, "RED", &red);
    H5Tenum_insert(colour, "GREEN", &green);
    attribute(file, "enum", colour, {}, &green);
    struct Pair {
      int32_t a;
      double b;
    } pair{1, 2.0};
    hid_t compound = H5Tcreate(H5T_COMPOUND, sizeof(Pair));
    H5Tinsert(compound, "a", offsetof(Pair, a), H5T_NATIVE_INT32);
    H5Tinsert(compound, "b", offsetof(Pair, b), H5T_NATIVE_DOUBLE);
    attribute(file, "compound", compound, {}, &pair);
    hid_t x = H5Dopen2(file, "/x", H5P_DEFAULT);
    attribute(x, "units", fixed, {}, "unit");
    H5Dclose(x);
    H5Tclose(compound);
    H5Tclose(colour);
    H5Tclose(fixed);
    H5Tclose(vlen);
    H5Fclose(file);
  }
}

// An IDX file: magic 0 0 type rank, big-endian int32 extents, then the elements.
std::string idx(uint8_t type, std::vector<uint32_t> dims, const std::string& elements) {
  std::string bytes = {0, 0, char(type), char(dims.size())};
  for (uint32_t extent : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes += char((extent >> shift) & 0xff);
  }
  return bytes + elements;
}

void write_idx_seed(const std::string& path, const std::string& images, const std::string& labels) {
  std::ofstream out(path, std::ios::binary);
  uint32_t size = uint32_t(images.size());
  char header[4];
  std::memcpy(header, &size, 4);  // little-endian on every machine this runs on
  out.write(header, 4);
  out << images << labels;
  if (!out) {
    std::fprintf(stderr, "fuzz_make_seeds: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

void write_idx_seeds(const std::string& dir) {
  std::string pixels;
  for (int i = 0; i < 3 * 2 * 2; ++i) pixels += char(i * 20);
  write_idx_seed(dir + "/mnist_like", idx(0x08, {3, 2, 2}, pixels), idx(0x08, {3}, {1, 2, 9}));
  write_idx_seed(dir + "/one_sample", idx(0x08, {1, 1, 3}, "abc"), idx(0x08, {1}, {5}));
  // Types the converter refuses, read by read_idx all the same.
  write_idx_seed(dir + "/int32_float32", idx(0x0C, {2}, std::string(8, '\1')),
                 idx(0x0D, {1, 1}, std::string(4, '\x3f')));
  write_idx_seed(dir + "/float64_labels", idx(0x08, {1, 1, 1}, "z"),
                 idx(0x0E, {1}, std::string(8, '\0')));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: fuzz_make_seeds HDF5_DIR IDX_DIR\n");
    return 1;
  }
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  write_hdf5_seeds(argv[1]);
  write_idx_seeds(argv[2]);
  return 0;
}
