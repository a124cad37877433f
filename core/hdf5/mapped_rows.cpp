#include "mpigrad/core/hdf5/mapped_rows.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>

#include "mpigrad/core/hdf5/internal.h"

namespace mpigrad::core::hdf5 {

std::optional<MappedRows> MappedRows::open(const Dataset& dataset, DType memory_dtype) {
  const Dataset::Storage storage = dataset.storage();
  if (storage.layout != Dataset::Storage::Layout::Contiguous || storage.end_offset < 0 ||
      dataset.dims().empty() || storage.stored_bytes != storage.declared_bytes) {
    return std::nullopt;
  }
  silence_errors();
  if (H5Tequal(dataset.file_type().id(), detail::memory_type(memory_dtype)) <= 0) {
    return std::nullopt;  // a conversion (or a type error for HDF5 to report) is needed
  }
  const int64_t offset = storage.end_offset - storage.stored_bytes;
  const int fd = ::open(dataset.file_path().c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat info {};
  const bool fits = ::fstat(fd, &info) == 0 && storage.end_offset <= int64_t(info.st_size);
  const int64_t page = int64_t(::sysconf(_SC_PAGESIZE));
  const int64_t start = offset / page * page;
  const size_t length = size_t(storage.end_offset - start);
  void* map = fits && storage.stored_bytes > 0
                  ? ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, off_t(start))
                  : MAP_FAILED;
  ::close(fd);  // the map keeps the file
  if (map == MAP_FAILED) return std::nullopt;
  MappedRows rows;
  rows.map_ = map;
  rows.map_bytes_ = length;
  rows.data_ = static_cast<const char*>(map) + (offset - start);
  rows.rows_ = dataset.dims()[0];
  rows.row_bytes_ = rows.rows_ > 0 ? storage.stored_bytes / rows.rows_ : 0;
  return rows;
}

MappedRows::MappedRows(MappedRows&& other) noexcept {
  *this = std::move(other);
}

MappedRows& MappedRows::operator=(MappedRows&& other) noexcept {
  if (this != &other) {
    if (map_ != nullptr) ::munmap(map_, map_bytes_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    data_ = std::exchange(other.data_, nullptr);
    rows_ = std::exchange(other.rows_, 0);
    row_bytes_ = std::exchange(other.row_bytes_, 0);
  }
  return *this;
}

MappedRows::~MappedRows() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

}  // namespace mpigrad::core::hdf5
