// Writing an HDF5 file that readers only ever see complete (part of core/hdf5.h): the file is
// created under a temporary name beside its target and renamed into place on commit, through
// core::AtomicFile (core/atomic_file.h), the one temporary-file-and-rename of the library.
#pragma once

#include <string>

#include "mpigrad/core/atomic_file.h"
#include "mpigrad/core/hdf5/file.h"

namespace mpigrad::core::hdf5 {

// Writes a new file that readers only ever see complete: the data goes to "<path>.tmp.<pid>",
// and commit() closes it and renames it over `path`. Destroying an uncommitted writer (for
// example while an exception unwinds) deletes the temporary file, as does a failed commit().
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  File& file() { return file_; }
  const std::string& path() const { return target_.path(); }
  void commit();

 private:
  // Declared before file_, so that on destruction the file is closed before the temporary file
  // is removed.
  AtomicFile target_;
  File file_;
};

}  // namespace mpigrad::core::hdf5
