// Writing through a temporary file and a rename (core/atomic_file.h).
#include "mpigrad/core/atomic_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "mpigrad/core/error.h"

namespace mpigrad::core {

namespace {
// The reason errno gives, when it gives one: the stream classes report only that they failed.
std::string errno_reason(int error) {
  return error != 0 ? std::string(": ") + std::strerror(error) : std::string();
}
}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), temp_path_(path_ + ".tmp") {}

AtomicFile::~AtomicFile() {
  if (committed_) return;
  std::error_code ignored;  // destructors never throw; a missing file is fine
  std::filesystem::remove(temp_path_, ignored);
}

void AtomicFile::commit() {
  MPIGRAD_CHECK(!committed_, "cannot write '", path_, "': committed twice");
  std::error_code error;
  std::filesystem::rename(temp_path_, path_, error);
  if (error) {
    std::error_code ignored;
    std::filesystem::remove(temp_path_, ignored);
    fail("cannot write '", path_, "': renaming the temporary file '", temp_path_,
         "' over it failed: ", error.message());
  }
  committed_ = true;
}

bool link_file_atomically(const std::string& existing, const std::string& path) {
  std::error_code error;
  // Already the same file: a rename between two names of one file does nothing (POSIX), so the
  // temporary link would stay behind.
  if (std::filesystem::equivalent(existing, path, error)) return true;
  AtomicFile file(path);
  std::filesystem::remove(file.temp_path(), error);  // a leftover from a killed run
  // Whatever keeps the link from being made (no hard links: EPERM, ENOTSUP, a FUSE mount's
  // ENOSYS; another file system; too many links; `existing` gone), the caller can write the file
  // instead, so none of it is an error here; the destructor removes any temporary.
  std::filesystem::create_hard_link(existing, file.temp_path(), error);
  if (error) return false;
  file.commit();
  return true;
}

void write_file_atomically(const std::string& path,
                           const std::function<void(std::ostream&)>& write) {
  AtomicFile file(path);
  {
    errno = 0;
    std::ofstream out(file.temp_path(), std::ios::binary | std::ios::trunc);
    if (!out.is_open()) {
      const int error = errno;
      fail("cannot write '", path, "': cannot create the temporary file '", file.temp_path(), "'",
           errno_reason(error));
    }
    errno = 0;
    write(out);
    out.close();
    if (!out) {
      const int error = errno;
      fail("cannot write '", path, "': writing the temporary file '", file.temp_path(), "' failed",
           errno_reason(error));
    }
  }
  file.commit();
}

}  // namespace mpigrad::core
