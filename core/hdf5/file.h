// Files (part of core/hdf5.h): opening and creating HDF5 files, the objects in them (groups and
// datasets, listed and walked), and the attributes on any object. A file that readers may see
// while it is being written should be written through AtomicFileWriter
// (core/hdf5/atomic_file_writer.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mpigrad/core/dtype.h"
#include "mpigrad/core/hdf5/dataset.h"
#include "mpigrad/core/hdf5/handle.h"
#include "mpigrad/core/hdf5/types.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::core::hdf5 {

enum class ObjectKind { Missing, Group, Dataset, Other };

class File {
 public:
  enum class Mode { ReadOnly, ReadWrite };

  File() = default;
  // Opens an existing file. A missing path, a non-HDF5 file and a truncated file each get their
  // own message naming the path.
  static File open(const std::string& path, Mode mode = Mode::ReadOnly);
  // Opens, read-only, a whole HDF5 file held in memory (HDF5's core driver over a copy of the
  // bytes; nothing touches the disk). `name` stands for the file in messages and path().
  static File open_image(const void* bytes, size_t size, const std::string& name);
  // Creates (truncating) a file. Prefer AtomicFileWriter for anything a reader may see.
  static File create(const std::string& path);

  Hid id() const { return handle_.id(); }
  const std::string& path() const { return path_; }
  bool is_open() const { return handle_.valid(); }
  void close();                  // flushes and closes, throwing on failure
  int64_t size_on_disk() const;  // the file's size as HDF5 sees it (its end of file)
  void flush();

  // ---- Objects (paths are absolute or relative to the root: "x" == "/x") ----------------------
  ObjectKind kind(const std::string& object_path) const;
  bool exists(const std::string& object_path) const {
    return kind(object_path) != ObjectKind::Missing;
  }
  // Creates a group and any missing parents; does nothing when it already exists.
  void create_group(const std::string& group_path);
  // Names of a group's direct members, sorted.
  std::vector<std::string> list(const std::string& group_path = "/") const;
  // Every dataset below a group, as absolute paths, sorted (for walking a checkpoint).
  std::vector<std::string> list_datasets_recursive(const std::string& group_path = "/") const;
  // What walking a group's tree found. A link to a group that is already being walked (a hard
  // or soft link back to the group itself or an ancestor: a cycle) or that was already walked
  // through another link is listed, not followed, so the walk ends on every file and visits
  // each group once. Groups are told apart by their address in the file, not by their path.
  struct GroupWalk {
    std::vector<std::string> datasets;        // absolute paths, sorted
    std::vector<std::string> ancestor_links;  // links to a group on their own path
    std::vector<std::string> repeated_links;  // further links to a group walked already
  };
  // Throws core::Error naming the file and the path when groups nest deeper than this.
  static constexpr int kMaxGroupDepth = 64;
  GroupWalk walk_groups(const std::string& group_path = "/") const;

  Dataset open_dataset(const std::string& name, const DatasetAccess& access = {}) const;
  // Creates a dataset (and missing parent groups) of `dtype` with extents `dims`.
  Dataset create_dataset(const std::string& name, DType dtype, const std::vector<int64_t>& dims,
                         const DatasetLayout& layout = {});
  // Creates and fills a dataset from a tensor (any layout; written as contiguous data).
  Dataset write_tensor(const std::string& name, const Tensor& tensor,
                       const DatasetLayout& layout = {});
  Tensor read_tensor(const std::string& name) const { return open_dataset(name).read_tensor(); }

  // ---- Attributes on any object ("/" is the file itself) -------------------------------------
  bool has_attribute(const std::string& object_path, const std::string& name) const;
  std::vector<std::string> list_attributes(const std::string& object_path) const;
  // Writing replaces an existing attribute of the same name.
  void write_attribute(const std::string& object_path, const std::string& name,
                       const std::string& value);
  void write_attribute(const std::string& object_path, const std::string& name, const char* value) {
    write_attribute(object_path, name, std::string(value));
  }
  void write_attribute(const std::string& object_path, const std::string& name, int64_t value);
  void write_attribute(const std::string& object_path, const std::string& name, double value);
  // Reading converts between integer and float; strings may be fixed or variable length. Each
  // reads one value: an attribute of any other number of elements (an array of strings, say) is
  // a core::Error naming the attribute and its shape, as is a value HDF5 cannot read.
  std::string read_string_attribute(const std::string& object_path, const std::string& name) const;
  int64_t read_int_attribute(const std::string& object_path, const std::string& name) const;
  double read_double_attribute(const std::string& object_path, const std::string& name) const;
  // An attribute's value as one line for listings, read by its real type and shape: a string
  // (control characters escaped) or a number; up to 16 of them in brackets for an array, with its
  // shape first when it has more than one dimension ("[2, 3]: ["a", ...]"); "unsupported (<type>,
  // shape [...])" for other types and for arrays of more than 1 MiB, which are not read; and
  // "unreadable (<why>)" when HDF5 fails to read it (a corrupt file). Throws only when the
  // object or the attribute does not exist.
  std::string attribute_text(const std::string& object_path, const std::string& name) const;

 private:
  File(Handle handle, std::string path) : handle_(std::move(handle)), path_(std::move(path)) {}
  Handle open_object(const std::string& object_path) const;
  Handle open_attribute(const std::string& object_path, const std::string& name) const;
  void write_scalar_attribute(const std::string& object_path, const std::string& name,
                              const Datatype& type, const void* value);
  Handle handle_;
  std::string path_;
};

}  // namespace mpigrad::core::hdf5
