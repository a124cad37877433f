// Handles (part of core/hdf5.h): every hid_t the wrappers use is owned by exactly one Handle,
// which closes it with the matching H5*close. Failures of the C library become core::Error
// (core/hdf5/internal.h, for the wrappers' own .cpp files); HDF5's error stack is never printed
// to stderr, because automatic printing is turned off for every thread that uses the wrappers.
//
// This header does not include <hdf5.h>: hid_t travels as int64_t (its type in HDF5 >= 1.10),
// so code that only reads tensors from files needs no HDF5 include path.
#pragma once

#include <cstdint>
#include <string>

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

// Turns off HDF5's automatic error printing for the calling thread (the wrappers do this
// themselves; call it before using the C API directly on a new thread).
void silence_errors();

// The HDF5 library version, "1.10.8".
std::string library_version();

}  // namespace mpigrad::core::hdf5
