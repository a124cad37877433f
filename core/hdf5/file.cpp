// Files (core/hdf5/file.h): opening (from disk or from bytes in memory), creating and closing
// them, asking what an object path names, and opening and creating datasets. Listing a file's
// groups is in listing.cpp, attributes in attributes.cpp.
#include "mpigrad/core/hdf5/file.h"

#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/core/hdf5/internal.h"

namespace mpigrad::core::hdf5 {

using namespace detail;  // the family's shared helpers (core/hdf5/internal.h)

namespace {
constexpr size_t kSieveBytes = 4096;  // a page: what the kernel reads for one small read anyway
}  // namespace

File File::open(const std::string& path, Mode mode) {
  silence_errors();
  std::error_code error;
  MPIGRAD_CHECK(std::filesystem::exists(path, error), "HDF5 file ", path, ": no such file");
  MPIGRAD_CHECK(!std::filesystem::is_directory(path, error), "HDF5 file ", path,
                ": is a directory");
  htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 == 0)
    fail("HDF5 file ", path, ": not an HDF5 file (no HDF5 signature; corrupt or another format)");
  if (is_hdf5 < 0) fail_call("H5Fis_hdf5", path);
  // HDF5 serves a read of a contiguous dataset smaller than its sieve buffer (64 KiB by default)
  // by reading the whole buffer's worth from that point: a shuffled batch of 784-byte images read
  // 64 KiB per sample, 80 times the bytes it used. Runs of rows are one large read either way.
  Handle access = owned(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate", path);
  check(H5Pset_sieve_buf_size(access.id(), kSieveBytes), "H5Pset_sieve_buf_size", path);
  hid_t id =
      H5Fopen(path.c_str(), mode == Mode::ReadOnly ? H5F_ACC_RDONLY : H5F_ACC_RDWR, access.id());
  if (id < 0) {
    std::string detail = take_error_stack();
    fail("HDF5 H5Fopen failed for ", path, " (truncated or corrupt file?): ", detail);
  }
  return File(Handle(id), path);
}

File File::open_image(const void* bytes, size_t size, const std::string& name) {
  silence_errors();
  MPIGRAD_CHECK(bytes != nullptr && size > 0, "HDF5 file image ", name, ": empty");
  Handle access = owned(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate", name);
  check(H5Pset_fapl_core(access.id(), 64 << 10, /*backing_store=*/false), "H5Pset_fapl_core", name);
  // HDF5 copies the image; it never writes through the pointer, despite the non-const type.
  check(H5Pset_file_image(access.id(), const_cast<void*>(bytes), size), "H5Pset_file_image", name);
  hid_t id = H5Fopen(name.c_str(), H5F_ACC_RDONLY, access.id());
  if (id < 0) {
    std::string detail = take_error_stack();
    fail("HDF5 H5Fopen failed for the in-memory image ", name, " of ", size,
         " bytes (not HDF5, truncated or corrupt?): ", detail);
  }
  return File(Handle(id), name);
}

File File::create(const std::string& path) {
  silence_errors();
  return File(
      owned(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), "H5Fcreate", path),
      path);
}

void File::close() {
  if (!handle_.valid()) return;
  flush();
  handle_.close();
}

int64_t File::size_on_disk() const {
  silence_errors();
  hsize_t size = 0;
  check(H5Fget_filesize(id(), &size), "H5Fget_filesize", path_);
  return int64_t(size);
}

void File::flush() {
  silence_errors();
  MPIGRAD_CHECK(handle_.valid(), "HDF5: flush on a closed file ", path_);
  check(H5Fflush(id(), H5F_SCOPE_LOCAL), "H5Fflush", path_);
}

ObjectKind File::kind(const std::string& object_path) const {
  silence_errors();
  std::string path = absolute_path(object_path);
  if (path == "/") return ObjectKind::Group;
  // H5Lexists fails (rather than answering no) when a parent is missing, so walk the parents.
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    std::string prefix = path.substr(0, slash);
    htri_t exists =
        check(H5Lexists(id(), prefix.c_str(), H5P_DEFAULT), "H5Lexists", join_where(path_, prefix));
    if (exists == 0) return ObjectKind::Missing;
    if (slash == std::string::npos) break;
  }
  Handle object =
      owned(H5Oopen(id(), path.c_str(), H5P_DEFAULT), "H5Oopen", join_where(path_, path));
  switch (H5Iget_type(object.id())) {
    case H5I_GROUP:
      return ObjectKind::Group;
    case H5I_DATASET:
      return ObjectKind::Dataset;
    default:
      return ObjectKind::Other;
  }
}

void File::create_group(const std::string& group_path) {
  silence_errors();
  std::string path = absolute_path(group_path);
  ObjectKind existing = kind(path);
  if (existing == ObjectKind::Group) return;
  MPIGRAD_CHECK(existing == ObjectKind::Missing, "HDF5 file ", path_, ": cannot create group ",
                path, ": a non-group object has that name");
  Handle lcpl = owned(H5Pcreate(H5P_LINK_CREATE), "H5Pcreate", path_);
  check(H5Pset_create_intermediate_group(lcpl.id(), 1), "H5Pset_create_intermediate_group", path_);
  Handle group = owned(H5Gcreate2(id(), path.c_str(), lcpl.id(), H5P_DEFAULT, H5P_DEFAULT),
                       "H5Gcreate2", join_where(path_, path));
}

Dataset File::open_dataset(const std::string& name, const DatasetAccess& access) const {
  silence_errors();
  std::string path = absolute_path(name);
  ObjectKind object = kind(path);
  if (object != ObjectKind::Dataset) {
    std::string present;
    std::string parent = path.substr(0, path.rfind('/'));
    if (kind(parent.empty() ? "/" : parent) == ObjectKind::Group) {
      for (const auto& member : list(parent.empty() ? "/" : parent))
        present += (present.empty() ? "" : ", ") + member;
    }
    fail("HDF5 file ", path_, ": ",
         object == ObjectKind::Missing ? "no dataset " : "not a dataset: ", path,
         " (present: ", present.empty() ? "nothing" : present, ")");
  }
  std::string where = join_where(path_, path);
  Handle dapl = owned(H5Pcreate(H5P_DATASET_ACCESS), "H5Pcreate", where);
  if (access.chunk_cache_bytes > 0) {
    size_t slots = access.chunk_cache_slots > 0 ? size_t(access.chunk_cache_slots)
                                                : H5D_CHUNK_CACHE_NSLOTS_DEFAULT;
    check(H5Pset_chunk_cache(dapl.id(), slots, size_t(access.chunk_cache_bytes),
                             access.chunk_cache_w0),
          "H5Pset_chunk_cache", where);
  }
  return Dataset(owned(H5Dopen2(id(), path.c_str(), dapl.id()), "H5Dopen2", where), path_, path);
}

Dataset File::create_dataset(const std::string& name, DType dtype, const std::vector<int64_t>& dims,
                             const DatasetLayout& layout) {
  silence_errors();
  std::string path = absolute_path(name);
  std::string where = join_where(path_, path);
  MPIGRAD_CHECK(kind(path) == ObjectKind::Missing, "HDF5 file ", path_, ": cannot create dataset ",
                path, ": it already exists");
  MPIGRAD_CHECK(layout.gzip_level == 0 || layout.chunk_rows > 0, "HDF5 dataset ", where,
                ": gzip compression needs a chunked layout (chunk_rows > 0)");
  MPIGRAD_CHECK(layout.gzip_level >= 0 && layout.gzip_level <= 9, "HDF5 dataset ", where,
                ": gzip level must be 0..9, got ", layout.gzip_level);
  for (int64_t extent : dims)
    MPIGRAD_CHECK(extent >= 0, "HDF5 dataset ", where, ": negative extent in ", Shape(dims));

  Handle dcpl = owned(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate", where);
  Handle space;
  bool chunked = layout.chunk_rows > 0 && !dims.empty();
  if (chunked) {
    // Chunked datasets get an unlimited leading dimension so they can be appended to later.
    std::vector<hsize_t> extents(dims.begin(), dims.end()), max_extents = extents, chunk = extents;
    max_extents[0] = H5S_UNLIMITED;
    chunk[0] = hsize_t(layout.chunk_rows);
    for (auto& c : chunk) c = std::max<hsize_t>(c, 1);
    check(H5Pset_chunk(dcpl.id(), int(chunk.size()), chunk.data()), "H5Pset_chunk", where);
    if (layout.gzip_level > 0)
      check(H5Pset_deflate(dcpl.id(), unsigned(layout.gzip_level)), "H5Pset_deflate", where);
    space = owned(H5Screate_simple(int(extents.size()), extents.data(), max_extents.data()),
                  "H5Screate_simple", where);
  } else if (dims.empty()) {
    space = owned(H5Screate(H5S_SCALAR), "H5Screate", where);
  } else {
    std::vector<hsize_t> extents(dims.begin(), dims.end());
    space = owned(H5Screate_simple(int(extents.size()), extents.data(), nullptr),
                  "H5Screate_simple", where);
  }
  Handle lcpl = owned(H5Pcreate(H5P_LINK_CREATE), "H5Pcreate", where);
  check(H5Pset_create_intermediate_group(lcpl.id(), 1), "H5Pset_create_intermediate_group", where);
  Datatype type = Datatype::of(dtype);
  return Dataset(owned(H5Dcreate2(id(), path.c_str(), type.id(), space.id(), lcpl.id(), dcpl.id(),
                                  H5P_DEFAULT),
                       "H5Dcreate2", where),
                 path_, path);
}

Dataset File::write_tensor(const std::string& name, const Tensor& tensor,
                           const DatasetLayout& layout) {
  Dataset dataset = create_dataset(name, tensor.dtype(), tensor.shape().vec(), layout);
  dataset.write_tensor(tensor);
  return dataset;
}

}  // namespace mpigrad::core::hdf5
