// MappedRows (part of core/hdf5.h): the rows of a dataset read as plain bytes from a read-only
// memory map of its file, where the bytes on disk are already what memory wants.
//
// A shuffled batch reads rows scattered over the whole dataset. Through H5Dread each row costs a
// pread of a sieve page (a system call, 3-5 us on a VM) and HDF5's selection machinery; a
// 64-image Fashion-MNIST batch spent 0.3-0.4 ms there, 8% of its training step. A contiguous,
// unfiltered dataset stored in the memory type is one run of bytes at a known file offset, so a
// row is a memcpy from a map of the file: the page cache serves it, with no call per row.
//
// MappedRows::open returns nothing (the caller keeps reading through HDF5) for anything else:
// chunked, compact, virtual or external storage, a stored type that differs from the memory
// type (byte order, width), storage not yet allocated, or bytes the file does not hold (a
// truncated file; Hdf5Dataset's checks report it). Mapping fails quietly too (no mmap).
//
// The map is read-only and shared: the dataset must not be written while it is mapped, and a
// file truncated under a live map faults on access (SIGBUS), as for any mapped file.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>

#include "mpigrad/core/dtype.h"
#include "mpigrad/core/hdf5/dataset.h"

namespace mpigrad::core::hdf5 {

class MappedRows {
 public:
  // `dataset` read as `memory_dtype` rows, or nothing where plain bytes would not do (above).
  static std::optional<MappedRows> open(const Dataset& dataset, DType memory_dtype);

  MappedRows(MappedRows&& other) noexcept;
  MappedRows& operator=(MappedRows&& other) noexcept;
  MappedRows(const MappedRows&) = delete;
  MappedRows& operator=(const MappedRows&) = delete;
  ~MappedRows();

  int64_t rows() const { return rows_; }
  int64_t row_bytes() const { return row_bytes_; }
  // Rows [row, row + count) into `out`; the caller has checked the range.
  void read(int64_t row, int64_t count, void* out) const {
    std::memcpy(out, data_ + row * row_bytes_, size_t(count * row_bytes_));
  }

 private:
  MappedRows() = default;
  void* map_ = nullptr;         // what mmap returned (page-aligned)
  size_t map_bytes_ = 0;        // its length
  const char* data_ = nullptr;  // the dataset's first byte inside the map
  int64_t rows_ = 0;
  int64_t row_bytes_ = 0;
};

}  // namespace mpigrad::core::hdf5
