// Writing a file so that readers only ever see the old file or the whole new one
// (docs/architecture.md: no partial files are left behind). The data goes to a temporary file
// beside the target, "<path>.tmp": beside it so that the rename stays on one file system and is
// atomic. Only the main rank writes a given path, so the name needs no process id, and a leftover
// is easy to spot.
// Only a complete write is renamed over the target; any failure (the temporary file cannot be
// created or written, the caller's writer throws, the rename fails) removes the temporary file
// and leaves the target as it was. Errors are core::Error naming the target path.
//
// The HDF5 file writer (core/hdf5/atomic_file_writer.h) builds on AtomicFile; text and JSON
// files (config.ini, the lr-find curve, the merged timeline) use write_file_atomically.
#pragma once

#include <functional>
#include <iosfwd>
#include <string>

namespace mpigrad::core {

// The temporary file of one write, for writers that create and fill it themselves (HDF5 does):
// write to temp_path(), then commit(). Destroying an uncommitted AtomicFile (for example while an
// exception unwinds) removes the temporary file. It never creates the temporary file itself.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }
  bool committed() const { return committed_; }
  // Renames the temporary file over path(). On failure removes the temporary file and throws
  // core::Error naming both paths and the reason. Committing twice is an error.
  void commit();

 private:
  std::string path_;
  std::string temp_path_;
  bool committed_ = false;
};

// Writes `path` through a temporary file: `write` fills the stream (opened in binary mode), then
// the stream is closed and checked and the file renamed into place. Throws core::Error naming
// `path` when the temporary file cannot be created or written or the rename fails; an exception
// from `write` propagates as it is. Either way the temporary file is removed.
void write_file_atomically(const std::string& path,
                           const std::function<void(std::ostream&)>& write);

// Makes `path` name the same file as `existing` (a hard link made beside `path`, then renamed
// over it), without copying a byte: readers of `path` see the old file or the new one. False,
// with nothing changed, where the link cannot be made (a file system without hard links, another
// file system, `existing` missing): the caller then writes the file itself. A failed rename of
// the link throws core::Error naming both paths.
bool link_file_atomically(const std::string& existing, const std::string& path);

}  // namespace mpigrad::core
