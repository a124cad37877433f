// One array of an atomic store, whatever its format (a Zarr v3 array, data/zarr_array.h, or an
// HDF5 dataset): its name in the store, the element type its rows are read as, its extents, and
// reading rows of its leading axis, where a store concatenates its structures. Readers are
// immutable once opened and read_rows is thread-safe: the DataLoader's workers read at once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mpigrad/core/dtype.h"
#include "mpigrad/core/shape.h"

namespace mpigrad::data {

class StoredArray {
 public:
  virtual ~StoredArray() = default;

  const std::string& name() const { return name_; }  // "core/positions"
  // What rows are read as; stored types without a DType of their own are widened (int8, int16
  // and uint16 to int32; uint32 and uint64 to int64).
  core::DType dtype() const { return dtype_; }
  const std::string& stored_type() const { return stored_type_; }  // "uint16", "float32", ...
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t rows() const { return shape_.empty() ? 0 : shape_[0]; }
  core::Shape row_shape() const {
    return core::Shape(
        std::vector<int64_t>(shape_.begin() + (shape_.empty() ? 0 : 1), shape_.end()));
  }
  int64_t row_bytes() const { return row_shape().numel() * int64_t(core::element_size(dtype_)); }

  // Rows [begin, begin + count) of axis 0, as dtype(), into `out` (count x row_bytes() bytes).
  // Throws core::Error naming the store and the array for rows out of range or data that cannot
  // be read (a truncated or corrupt chunk).
  virtual void read_rows(int64_t begin, int64_t count, void* out) const = 0;

 protected:
  std::string name_;
  core::DType dtype_ = core::kFloat32;
  std::string stored_type_;
  std::vector<int64_t> shape_;
};

}  // namespace mpigrad::data
