// A guard that HDF5 1.10 lacks, internal to core/hdf5/: before variable-length strings are read
// (attribute_values.h), the file's global heap collections ("GCOL" blocks, where such strings
// live) are checked, so that a corrupt size there is an error rather than a crash.
#pragma once

#include <string>

namespace mpigrad::core::hdf5::detail {

// What is wrong with the global heap collections of the file at `path`, or "" when nothing is.
// HDF5 1.10 trusts the object sizes recorded there: H5HG_read copies an object's recorded size
// into a buffer sized for the string, so a garbage size is a heap overflow inside the library
// (a segfault in its memcpy, seen on a mutated file) that no return code can report. So before
// reading variable-length strings the file's collections are walked once: every object must fit
// inside its collection. The answer is cached per path, size and modification time. A file that
// cannot be opened or mapped gets "": HDF5 itself will then say what is wrong.
std::string global_heap_problem(const std::string& path);

}  // namespace mpigrad::core::hdf5::detail
