// defines: hdf5::File, hdf5::Dataset, hdf5::Dataspace, hdf5::Datatype, hdf5::Handle,
//          hdf5::AtomicFileWriter, hdf5::DatasetLayout, hdf5::ObjectKind, File::GroupWalk
//
// RAII wrappers over the HDF5 C library, shared by the data readers (data/) and the checkpoints
// (nn/). Every hid_t is owned by exactly one Handle, which closes it with the matching H5*close.
// Every call is checked: a failure throws core::Error naming the HDF5 call, the file and the
// object, followed by the messages HDF5 put on its error stack (which is never printed to
// stderr: automatic printing is turned off for every thread that uses these wrappers).
//
// This header does not include <hdf5.h>: hid_t travels as int64_t (its type in HDF5 >= 1.10),
// so code that only reads tensors from files needs no HDF5 include path.
//
// Types: each core::DType maps to one HDF5 type, the one h5py writes for the matching NumPy
// dtype (bool is h5py's enum {FALSE, TRUE} over int8; float16 is IEEE binary16; bfloat16, which
// NumPy lacks, is a 16-bit float with an 8-bit exponent, as ml_dtypes writes it). Reading
// accepts any byte order. Other types (uint16, strings, compounds, ...) are reported as
// unsupported, naming the file, the dataset and the type.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mpigrad/core/dtype.h"
#include "mpigrad/core/shape.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::core::hdf5 {

using Hid = int64_t;  // hid_t

// Owns one HDF5 identifier of any kind; closes it on destruction (errors while closing are
// swallowed: destructors never throw). Move-only.
class Handle {
 public:
  Handle() = default;
  explicit Handle(Hid id) : id_(id) {}
  ~Handle();
  Handle(Handle&& other) noexcept : id_(other.id_) { other.id_ = -1; }
  Handle& operator=(Handle&& other) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  Hid id() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void close();  // closes now, throwing on failure

 private:
  Hid id_ = -1;
};

// An HDF5 element type; either the native type of a DType or the type of a stored dataset.
class Datatype {
 public:
  Datatype() = default;
  explicit Datatype(Handle handle) : handle_(std::move(handle)) {}
  // The in-memory type for dtype (a fresh copy, owned).
  static Datatype of(DType dtype);
  // A fixed-length string of `length` bytes (at least 1), null-terminated, UTF-8.
  static Datatype fixed_string(size_t length);

  Hid id() const { return handle_.id(); }
  // The DType this type maps to, or nullopt when mpigrad does not support it.
  std::optional<DType> to_dtype() const;
  // The DType values of this type are read as: to_dtype(), or for the integer types that have
  // no DType of their own (int8, int16, uint16, uint32, uint64) the smallest signed DType that
  // holds them (int32 or int64; uint64 values above 2^63 - 1 saturate). nullopt otherwise.
  std::optional<DType> read_as() const;
  // A short description for messages: "uint16", "float32 (big-endian)", "string", "compound".
  std::string describe() const;

 private:
  Handle handle_;
};

// A dataspace: the extents of a dataset plus a selection of elements in it.
class Dataspace {
 public:
  Dataspace() = default;
  Dataspace(Handle handle, std::string where) : handle_(std::move(handle)), where_(std::move(where)) {}
  // A simple dataspace of these extents (a scalar one when dims is empty).
  static Dataspace simple(const std::vector<int64_t>& dims);

  Hid id() const { return handle_.id(); }
  std::vector<int64_t> dims() const;
  // Replaces the selection with the block start[d] .. start[d] + count[d] in every dimension.
  void select_block(const std::vector<int64_t>& start, const std::vector<int64_t>& count);
  // Adds such a block to the selection (union).
  void add_block(const std::vector<int64_t>& start, const std::vector<int64_t>& count);
  // Replaces the selection with rows [row, row + rows) of the leading dimension, all of the rest.
  void select_rows(int64_t row, int64_t rows);
  void add_rows(int64_t row, int64_t rows);
  int64_t selected_elements() const;

 private:
  void block(bool replace, const std::vector<int64_t>& start, const std::vector<int64_t>& count);
  Handle handle_;
  std::string where_;
};

// How a new dataset is laid out. Contiguous by default: the fastest to read and what h5py writes
// by default. Chunked layouts allow compression and extension.
struct DatasetLayout {
  int64_t chunk_rows = 0;  // > 0: chunked, this many leading-dimension rows per chunk
  int gzip_level = 0;      // 1..9: deflate (needs chunk_rows > 0)
};

// One opened HDF5 dataset. Knows its file path and name, for messages, and its extents (read
// once at opening). It keeps its read selection between calls so that reading consecutive rows,
// the hot path of a data loader, costs as few HDF5 calls as a hand-written loop: one object must
// therefore not be used from several threads at once (HDF5 serializes its calls anyway).
class Dataset {
 public:
  Dataset() = default;
  Dataset(Handle handle, std::string file_path, std::string name);

  Hid id() const { return handle_.id(); }
  const std::string& file_path() const { return file_path_; }
  const std::string& name() const { return name_; }
  std::string where() const;  // "file.h5:/x"

  const std::vector<int64_t>& dims() const { return dims_; }
  Shape shape() const { return Shape(dims_); }
  int64_t num_elements() const;
  Datatype file_type() const;
  // The stored element type; throws (naming file, dataset and type) when unsupported.
  DType dtype() const;
  // The type the stored elements are read as (Datatype::read_as); throws when there is none.
  DType read_dtype() const;
  // What backs the declared extents on disk, to refuse datasets that claim more than they hold.
  struct Storage {
    enum class Layout { Compact, Contiguous, Chunked, Virtual, External } layout;
    int64_t declared_bytes = 0;  // num_elements() x the stored element size
    int64_t stored_bytes = 0;    // bytes allocated in the file (compressed size when filtered)
    int64_t chunks_needed = 0;   // chunked: chunks the extents span
    int64_t chunks_stored = -1;  // chunked: chunks written, counted only when stored < declared
    int64_t end_offset = -1;     // contiguous: where the data ends in the file (-1: unknown)
  };
  Storage storage() const;
  // Leading-dimension rows per chunk, or 0 when the layout is not chunked.
  int64_t chunk_rows() const;
  int64_t chunk_bytes() const;  // bytes of one chunk, 0 when not chunked
  Dataspace space() const;

  // Whole-dataset I/O; `memory_dtype` is the type of the buffer (HDF5 converts between numeric
  // types). The buffer holds num_elements() elements.
  void read(void* out, DType memory_dtype) const;
  void write(const void* data, DType memory_dtype);
  // Rows [row, row + rows) of the leading dimension into/from a dense buffer.
  void read_rows(int64_t row, int64_t rows, void* out, DType memory_dtype) const;
  void write_rows(int64_t row, int64_t rows, const void* data, DType memory_dtype);
  // An arbitrary block (start/count per dimension) into/from a dense buffer of that block.
  void read_block(const std::vector<int64_t>& start, const std::vector<int64_t>& count, void* out,
                  DType memory_dtype) const;
  void write_block(const std::vector<int64_t>& start, const std::vector<int64_t>& count,
                   const void* data, DType memory_dtype);
  // Whatever `file_space` selects, into a dense buffer of selected_elements() elements in file
  // order (row-major over the selection).
  void read_selection(const Dataspace& file_space, void* out, DType memory_dtype) const;

  // Tensor conveniences: the whole dataset in its stored dtype, and writing a whole tensor.
  Tensor read_tensor() const;
  void write_tensor(const Tensor& tensor);

 private:
  Hid memory_space(int64_t elements) const;
  Handle handle_;
  std::string file_path_;
  std::string name_;
  std::vector<int64_t> dims_;
  mutable Handle read_space_;    // the file space, reselected per read_rows
  mutable Handle memory_space_;  // a 1-d space, resized when the element count changes
  mutable int64_t memory_elements_ = -1;
};

enum class ObjectKind { Missing, Group, Dataset, Other };

// Options for opening a dataset for reading.
struct DatasetAccess {
  // Raw-data chunk cache of this dataset, in bytes, and its hash slots (0: HDF5's defaults,
  // 1 MiB and 521 slots). Only matters for chunked datasets.
  int64_t chunk_cache_bytes = 0;
  int64_t chunk_cache_slots = 0;
  // 0..1: how eagerly fully read chunks are evicted (HDF5's w0; 1 suits a sequential scan).
  double chunk_cache_w0 = 0.75;
};

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
  void close();  // flushes and closes, throwing on failure
  int64_t size_on_disk() const;  // the file's size as HDF5 sees it (its end of file)
  void flush();

  // ---- Objects (paths are absolute or relative to the root: "x" == "/x") ----------------------
  ObjectKind kind(const std::string& object_path) const;
  bool exists(const std::string& object_path) const { return kind(object_path) != ObjectKind::Missing; }
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
  Dataset write_tensor(const std::string& name, const Tensor& tensor, const DatasetLayout& layout = {});
  Tensor read_tensor(const std::string& name) const { return open_dataset(name).read_tensor(); }

  // ---- Attributes on any object ("/" is the file itself) -------------------------------------
  bool has_attribute(const std::string& object_path, const std::string& name) const;
  std::vector<std::string> list_attributes(const std::string& object_path) const;
  // Writing replaces an existing attribute of the same name.
  void write_attribute(const std::string& object_path, const std::string& name, const std::string& value);
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

// Writes a new file that readers only ever see complete: the data goes to "<path>.tmp.<pid>",
// and commit() closes it and renames it over `path`. Destroying an uncommitted writer (for
// example while an exception unwinds) deletes the temporary file.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  File& file() { return file_; }
  const std::string& path() const { return path_; }
  void commit();

 private:
  std::string path_;
  std::string temp_path_;
  File file_;
  bool committed_ = false;
};

// Turns off HDF5's automatic error printing for the calling thread (the wrappers do this
// themselves; call it before using the C API directly on a new thread).
void silence_errors();

// The HDF5 library version, "1.10.8".
std::string library_version();

}  // namespace mpigrad::core::hdf5
