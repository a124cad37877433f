// The check of a file's global heap collections before variable-length strings are read
// (core/hdf5/global_heap.h).
#include "mpigrad/core/hdf5/global_heap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace mpigrad::core::hdf5::detail {

namespace {
uint64_t little_endian(const unsigned char* bytes, int count) {
  uint64_t value = 0;
  for (int i = count - 1; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}
}  // namespace

// Each collection begins "GCOL", version 1, 3 reserved bytes and its 8-byte size (at least 4096);
// then objects: a 2-byte index, 2-byte reference count, 4 reserved bytes, an 8-byte size and the
// data padded to 8 bytes; index 0 is the free space, whose size counts its own header.
std::string global_heap_problem(const std::string& path) {
  struct stat status {};
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";  // HDF5 itself will say why the file cannot be read
  if (::fstat(fd, &status) != 0 || status.st_size < 16) {
    ::close(fd);
    return "";
  }
  const std::string key = path + "\n" + std::to_string(status.st_size) + "\n" +
                          std::to_string(status.st_mtim.tv_sec) + "." +
                          std::to_string(status.st_mtim.tv_nsec);
  static std::mutex mutex;
  static std::map<std::string, std::string> checked;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto found = checked.find(key);
    if (found != checked.end()) {
      ::close(fd);
      return found->second;
    }
  }
  const size_t size = size_t(status.st_size);
  void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapped == MAP_FAILED) return "";
  const auto* bytes = static_cast<const unsigned char*>(mapped);
  std::string problem;
  for (size_t at = 0; problem.empty() && at + 16 <= size; ++at) {
    const void* hit = ::memmem(bytes + at, size - at, "GCOL", 4);
    if (hit == nullptr) break;
    at = size_t(static_cast<const unsigned char*>(hit) - bytes);
    if (at + 16 > size || bytes[at + 4] != 1) continue;  // not a collection header
    const uint64_t collection = little_endian(bytes + at + 8, 8);
    if (collection < 4096 || collection > size - at) continue;
    for (uint64_t offset = 16; offset + 16 <= collection;) {
      const uint64_t index = little_endian(bytes + at + offset, 2);
      const uint64_t object = little_endian(bytes + at + offset + 8, 8);
      const uint64_t room = collection - offset;
      const uint64_t need = index == 0      ? object
                            : object > room ? room + 1  // cannot fit, and no overflow below
                                            : 16 + (object + 7) / 8 * 8;
      if (need > room) {
        problem = "the global heap collection at byte " + std::to_string(at) + " records object " +
                  std::to_string(index) + " of " + std::to_string(object) +
                  " bytes, more than the collection's " + std::to_string(room) +
                  " remaining bytes (a corrupt file)";
        break;
      }
      if (index == 0 || need == 0) break;  // the free space ends the collection
      offset += need;
    }
  }
  ::munmap(mapped, size);
  std::lock_guard<std::mutex> lock(mutex);
  checked[key] = problem;
  return problem;
}

}  // namespace mpigrad::core::hdf5::detail
