// make-hostile-file KIND OUT.h5: writes one of the hostile files hostile_checks.sh feeds to
// `mpigrad train` and `mpigrad data inspect`, with the HDF5 C API (never a fetched file):
//   empty        x uint8 [0, 1, 8, 8], y int64 [0]: a dataset of N = 0
//   huge-sample  x uint8 [2, 1, 2^31, 2^31] (chunked, never written): the element count
//                overflows int64
//   huge-dim     x uint8 [64, 738197505, 28, 28]: the dimension a corrupted byte gives; the
//                data was never written
//   cycles       a valid x, y at the root, plus /g/loop -> /g and /self -> / (hard links)
//   attributes   a valid x, y, and root attributes that are an array of variable-length
//                strings, a 2-D array of fixed-length strings and a compound
//   bad-chunks   a valid y, and x uint8 [64, 1, 8, 8] in gzip chunks whose bytes are then
//                overwritten: the file opens, every read of x fails
// Every file also has a y int64 of the same N.
#include <hdf5.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

bool ok(herr_t status, const char* call) {
  if (status < 0) std::fprintf(stderr, "make-hostile-file: %s failed\n", call);
  return status >= 0;
}

// A dataset of `dims`, chunked by `chunk` when given, filled with zeros when `fill`.
bool dataset(hid_t file, const char* name, hid_t type, const std::vector<hsize_t>& dims,
             const std::vector<hsize_t>& chunk, bool fill) {
  hid_t space = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (!chunk.empty() && !ok(H5Pset_chunk(dcpl, int(chunk.size()), chunk.data()), "H5Pset_chunk"))
    return false;
  hid_t set = H5Dcreate2(file, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  if (set < 0) return ok(-1, "H5Dcreate2");
  bool good = true;
  if (fill) {
    size_t elements = 1;
    for (hsize_t extent : dims) elements *= extent;
    std::vector<char> zeros(elements * H5Tget_size(type), 0);
    good = elements == 0 ||
           ok(H5Dwrite(set, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros.data()), "H5Dwrite");
  }
  H5Dclose(set);
  H5Pclose(dcpl);
  H5Sclose(space);
  return good;
}

bool attribute(hid_t object, const char* name, hid_t type, const std::vector<hsize_t>& dims,
               const void* data) {
  hid_t space = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
  hid_t created = H5Acreate2(object, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  bool good = created >= 0 && ok(H5Awrite(created, type, data), "H5Awrite");
  if (created >= 0) H5Aclose(created);
  H5Sclose(space);
  return good;
}

bool write(const std::string& kind, hid_t file) {
  const hsize_t big = hsize_t(1) << 31;
  if (kind == "empty") {
    return dataset(file, "x", H5T_NATIVE_UINT8, {0, 1, 8, 8}, {}, true) &&
           dataset(file, "y", H5T_NATIVE_INT64, {0}, {}, true);
  }
  if (kind == "huge-sample") {
    return dataset(file, "x", H5T_NATIVE_UINT8, {2, 1, big, big}, {1, 1, 1024, 1024}, false) &&
           dataset(file, "y", H5T_NATIVE_INT64, {2}, {}, true);
  }
  if (kind == "huge-dim") {
    return dataset(file, "x", H5T_NATIVE_UINT8, {64, 738197505, 28, 28}, {}, false) &&
           dataset(file, "y", H5T_NATIVE_INT64, {64}, {}, true);
  }
  bool good = dataset(file, "y", H5T_NATIVE_INT64, {64}, {}, true);
  if (kind == "bad-chunks") return good;
  good = good && dataset(file, "x", H5T_NATIVE_UINT8, {64, 1, 8, 8}, {}, true);
  if (kind == "cycles") {
    hid_t group = H5Gcreate2(file, "g", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    good = good && group >= 0 && ok(H5Gclose(group), "H5Gclose") &&
           ok(H5Lcreate_hard(file, "/g", file, "/g/loop", H5P_DEFAULT, H5P_DEFAULT),
              "H5Lcreate_hard") &&
           ok(H5Lcreate_hard(file, "/", file, "/self", H5P_DEFAULT, H5P_DEFAULT), "H5Lcreate_hard");
    return good;
  }
  if (kind == "attributes") {
    hid_t vlen = H5Tcopy(H5T_C_S1);
    H5Tset_size(vlen, H5T_VARIABLE);
    const char* names[3] = {"a", "bb", "ccc"};
    good = good && attribute(file, "names", vlen, {3}, names);
    hid_t fixed = H5Tcopy(H5T_C_S1);
    H5Tset_size(fixed, 4);
    const char grid[6][4] = {"ab", "cd", "ef", "gh", "ij", "kl"};
    good = good && attribute(file, "grid", fixed, {2, 3}, grid);
    hid_t compound = H5Tcreate(H5T_COMPOUND, 16);
    H5Tinsert(compound, "a", 0, H5T_NATIVE_INT64);
    H5Tinsert(compound, "b", 8, H5T_NATIVE_DOUBLE);
    const char pair[16] = {};
    good = good && attribute(file, "pair", compound, {1}, pair);
    H5Tclose(vlen);
    H5Tclose(fixed);
    H5Tclose(compound);
    return good;
  }
  if (kind == "bad-chunks") return true;  // x is written by write_bad_chunks
  std::fprintf(stderr, "make-hostile-file: unknown kind '%s'\n", kind.c_str());
  return false;
}

// x in 4 gzip chunks of varied bytes; then each chunk's stored bytes are overwritten in the
// closed file, where H5Dget_chunk_info says they lie.
bool write_bad_chunks(const char* path) {
  hid_t file = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
  if (file < 0) return ok(-1, "H5Fopen");
  const hsize_t dims[4] = {64, 1, 8, 8}, chunk[4] = {16, 1, 8, 8};
  hid_t space = H5Screate_simple(4, dims, nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 4, chunk);
  H5Pset_deflate(dcpl, 6);
  hid_t set = H5Dcreate2(file, "x", H5T_NATIVE_UINT8, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  std::vector<unsigned char> values(64 * 64);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<unsigned char>((i * 37) % 251);
  bool good =
      set >= 0 &&
      ok(H5Dwrite(set, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), "H5Dwrite");
  std::vector<std::pair<haddr_t, hsize_t>> chunks;
  for (hsize_t c = 0; good && c < 4; ++c) {
    hsize_t offset[4];
    unsigned mask = 0;
    haddr_t address = 0;
    hsize_t size = 0;
    good =
        ok(H5Dget_chunk_info(set, space, c, offset, &mask, &address, &size), "H5Dget_chunk_info");
    chunks.emplace_back(address, size);
  }
  if (set >= 0) H5Dclose(set);
  H5Pclose(dcpl);
  H5Sclose(space);
  good = ok(H5Fclose(file), "H5Fclose") && good;
  std::FILE* raw = std::fopen(path, "r+b");
  if (raw == nullptr) return ok(-1, "fopen");
  for (const auto& [address, size] : chunks) {
    std::vector<unsigned char> garbage(size, 0xA5);
    good = good && std::fseek(raw, static_cast<long>(address), SEEK_SET) == 0 &&
           std::fwrite(garbage.data(), 1, garbage.size(), raw) == garbage.size();
  }
  return std::fclose(raw) == 0 && good;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s empty|huge-sample|huge-dim|cycles|attributes OUT.h5\n",
                 argv[0]);
    return 2;
  }
  hid_t file = H5Fcreate(argv[2], H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file < 0) return ok(-1, "H5Fcreate") ? 0 : 1;
  bool good = write(argv[1], file);
  good = ok(H5Fclose(file), "H5Fclose") && good;
  if (good && std::string(argv[1]) == "bad-chunks") good = write_bad_chunks(argv[2]);
  return good ? 0 : 1;
}
