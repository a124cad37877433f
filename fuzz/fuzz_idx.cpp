// fuzz target fuzz_idx: the input holds two IDX files, as
//   [uint32 little-endian: bytes of the images file] [images file] [labels file]
// Each is read with data::read_idx, and when both parse they are converted to HDF5 by
// `mpigrad data convert-idx`. The IDX files live in memory (memfd_create, read through
// /proc/self/fd), the HDF5 output in a scratch folder on tmpfs that is emptied after each input.
// core::Error is the expected outcome for a corrupt file; anything else (a crash, undefined
// behaviour, a leak, another exception) is a finding.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/data/data_tool.h"
#include "mpigrad/data/idx.h"

namespace {

using namespace mpigrad;

// An anonymous in-memory file holding `size` bytes, named by a /proc/self/fd path.
class MemoryFile {
 public:
  MemoryFile(const uint8_t* bytes, size_t size) : fd_(memfd_create("fuzz_idx", 0)) {
    if (fd_ < 0) std::abort();
    for (size_t done = 0; done < size;) {
      ssize_t wrote = write(fd_, bytes + done, size - done);
      if (wrote <= 0) std::abort();
      done += size_t(wrote);
    }
  }
  ~MemoryFile() { close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path base = std::filesystem::is_directory("/dev/shm")
                                     ? std::filesystem::path("/dev/shm")
                                     : std::filesystem::temp_directory_path();
    std::filesystem::path made = base / ("mpigrad-fuzz-idx-" + std::to_string(getpid()));
    std::filesystem::create_directories(made);
    return made;
  }();
  return dir;
}

// Runs `mpigrad data convert-idx` with its output on stdout and stderr kept quiet.
void convert(const std::string& images, const std::string& labels) {
  const std::string output = (scratch_dir() / "out.h5").string();
  std::vector<std::string> args = {"data",     "convert-idx", "--images", images,
                                   "--labels", labels,        "--output", output};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  std::ostringstream quiet;
  std::streambuf* out = std::cout.rdbuf(quiet.rdbuf());
  std::streambuf* err = std::cerr.rdbuf(quiet.rdbuf());
  data::run_data_command(int(argv.size()), argv.data());
  std::cout.rdbuf(out);
  std::cerr.rdbuf(err);
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(scratch_dir(), error)) {
    std::filesystem::remove(entry.path(), error);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  if (size < 4) return 0;
  uint32_t images_size = 0;
  std::memcpy(&images_size, bytes, 4);
  bytes += 4;
  size -= 4;
  if (images_size > size) images_size = uint32_t(size);
  MemoryFile images(bytes, images_size), labels(bytes + images_size, size - images_size);
  bool parsed = true;
  for (const MemoryFile* file : {&images, &labels}) {
    try {
      data::read_idx(file->path());
    } catch (const core::Error&) {
      parsed = false;
    }
  }
  if (parsed) convert(images.path(), labels.path());
  return 0;
}
