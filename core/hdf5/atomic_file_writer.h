// Writing an HDF5 file that readers only ever see complete (part of core/hdf5.h): the file is
// created under a temporary name beside its target and renamed into place on commit.
#pragma once

#include <string>

#include "mpigrad/core/hdf5/file.h"

namespace mpigrad::core::hdf5 {

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

}  // namespace mpigrad::core::hdf5
