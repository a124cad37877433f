// The HDF5 file writer with its temporary file and rename (core/hdf5/atomic_file_writer.h).
#include "mpigrad/core/hdf5/atomic_file_writer.h"

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include "mpigrad/core/error.h"

namespace mpigrad::core::hdf5 {

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)), temp_path_(path_ + ".tmp." + std::to_string(::getpid())) {
  file_ = File::create(temp_path_);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (committed_) return;
  file_ = File();
  std::error_code ignored;
  std::filesystem::remove(temp_path_, ignored);
}

void AtomicFileWriter::commit() {
  MPIGRAD_CHECK(!committed_, "HDF5 file ", path_, ": committed twice");
  file_.close();
  std::error_code error;
  std::filesystem::rename(temp_path_, path_, error);
  MPIGRAD_CHECK(!error, "HDF5 file ", path_, ": renaming ", temp_path_, " into place failed: ", error.message());
  committed_ = true;
}

}  // namespace mpigrad::core::hdf5
