// Reading an attribute's values whatever their shape, shared by the typed readers
// (attributes.cpp) and the one-line listing of any attribute (attribute_text.cpp). Internal to
// core/hdf5/, like internal.h: it speaks in hid_t.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mpigrad/core/hdf5/handle.h"
#include "mpigrad/core/hdf5/internal.h"

namespace mpigrad::core::hdf5::detail {

// An attribute's dataspace: its extents and element count (0 for HDF5's null dataspace).
struct AttributeSpace {
  Handle handle;
  std::vector<int64_t> dims;
  int64_t elements = 0;
  bool null = false;
};

AttributeSpace attribute_space(hid_t attribute, const std::string& where);

// Every string of a string attribute, in row-major order, into buffers sized from the
// attribute's own type and dataspace. Variable-length strings are read only after the file's
// global heap passed global_heap_problem (global_heap.h).
std::vector<std::string> read_strings(hid_t attribute, hid_t file_type, const AttributeSpace& space,
                                      const std::string& where);

// "file.h5:/object attribute 'name'"
std::string attribute_where(const std::string& file, const std::string& object,
                            const std::string& name);

}  // namespace mpigrad::core::hdf5::detail
