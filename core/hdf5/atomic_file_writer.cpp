// The HDF5 file writer with its temporary file and rename (core/hdf5/atomic_file_writer.h).
#include "mpigrad/core/hdf5/atomic_file_writer.h"

#include <string>
#include <utility>

#include "mpigrad/core/error.h"

namespace mpigrad::core::hdf5 {

AtomicFileWriter::AtomicFileWriter(std::string path) : target_(std::move(path)) {
  file_ = File::create(target_.temp_path());
}

// Uncommitted: file_ closes first (members die in reverse order), then target_ removes the
// temporary file.
AtomicFileWriter::~AtomicFileWriter() = default;

void AtomicFileWriter::commit() {
  MPIGRAD_CHECK(!target_.committed(), "HDF5 file ", path(), ": committed twice");
  file_.close();
  target_.commit();
}

}  // namespace mpigrad::core::hdf5
