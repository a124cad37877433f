// The inside of the HDF5 wrappers, shared by the .cpp files of core/hdf5/ and included by nothing
// else: unlike the public headers it includes <hdf5.h>. Every call into the C library goes
// through check() or owned(), so that a failure becomes a core::Error naming the call, the file
// and the object, followed by the messages HDF5 put on its error stack.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "mpigrad/core/dtype.h"
#include "mpigrad/core/hdf5/handle.h"

static_assert(sizeof(hid_t) == sizeof(mpigrad::core::hdf5::Hid),
              "core/hdf5/handle.h carries hid_t as int64_t; this HDF5 uses another width");

namespace mpigrad::core::hdf5::detail {

// ---- Errors (handle.cpp) ------------------------------------------------------------------------

// The messages on this thread's HDF5 error stack, innermost cause last; clears the stack.
std::string take_error_stack();

[[noreturn]] void fail_call(const char* call, const std::string& where);

// Checks an HDF5 return value (negative means failure).
template <typename T>
T check(T result, const char* call, const std::string& where) {
  if (result < 0) [[unlikely]] {
    fail_call(call, where);
  }
  return result;
}

Handle owned(hid_t id, const char* call, const std::string& where);

// ---- Paths in messages (handle.cpp) -------------------------------------------------------------

// "x" and "/x" name the same object; the C library wants the second.
std::string absolute_path(const std::string& object_path);
// "file.h5:/x"
std::string join_where(const std::string& file, const std::string& object);

// ---- Types (types.cpp) and selections (dataspace.cpp) -------------------------------------------

// The in-memory type of a DType: shared by every read and write, never to be closed.
hid_t memory_type(DType dtype);

// The block of rows [row, row + rows) of the leading dimension, all of the other dimensions.
void rows_block(const std::vector<int64_t>& extents, int64_t row, int64_t rows,
                std::vector<int64_t>& start, std::vector<int64_t>& count);

}  // namespace mpigrad::core::hdf5::detail
