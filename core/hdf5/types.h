// Element types (part of core/hdf5.h). Each core::DType maps to one HDF5 type, the one h5py
// writes for the matching NumPy dtype (bool is h5py's enum {FALSE, TRUE} over int8; float16 is
// IEEE binary16; bfloat16, which NumPy lacks, is a 16-bit float with an 8-bit exponent, as
// ml_dtypes writes it). Reading accepts any byte order. Other types (uint16, strings, compounds,
// ...) are reported as unsupported, naming the file, the dataset and the type.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "mpigrad/core/dtype.h"
#include "mpigrad/core/hdf5/handle.h"

namespace mpigrad::core::hdf5 {

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

}  // namespace mpigrad::core::hdf5
