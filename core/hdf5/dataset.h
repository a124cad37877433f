// Datasets (part of core/hdf5.h): one opened HDF5 dataset, what it holds (extents, element type,
// storage on disk, checked against what the file claims) and reading and writing its elements,
// whole, by rows, by block or as tensors; with the options for creating (layout) and opening
// (chunk cache) one. Files open and create datasets (core/hdf5/file.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mpigrad/core/dtype.h"
#include "mpigrad/core/hdf5/dataspace.h"
#include "mpigrad/core/hdf5/handle.h"
#include "mpigrad/core/hdf5/types.h"
#include "mpigrad/core/shape.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::core::hdf5 {

// How a new dataset is laid out. Contiguous by default: the fastest to read and what h5py writes
// by default. Chunked layouts allow compression and extension.
struct DatasetLayout {
  int64_t chunk_rows = 0;  // > 0: chunked, this many leading-dimension rows per chunk
  int gzip_level = 0;      // 1..9: deflate (needs chunk_rows > 0)
};

// Options for opening a dataset for reading.
struct DatasetAccess {
  // Raw-data chunk cache of this dataset, in bytes, and its hash slots (0: HDF5's defaults,
  // 1 MiB and 521 slots). Only matters for chunked datasets.
  int64_t chunk_cache_bytes = 0;
  int64_t chunk_cache_slots = 0;
  // 0..1: how eagerly fully read chunks are evicted (HDF5's w0; 1 suits a sequential scan).
  double chunk_cache_w0 = 0.75;
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

}  // namespace mpigrad::core::hdf5
