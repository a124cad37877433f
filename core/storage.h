// Storage: one reference-counted block of device or host memory that tensors view.
//
// Views (slices, transposes, reshapes) share a Storage, so it also carries the version counter
// that in-place ops bump: autograd compares it with the version it saved to detect that a tensor
// needed for backward was overwritten, whichever view the write went through.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "mpigrad/core/device.h"

namespace mpigrad::core {

// Hands out raw memory for one kind of device. Allocators outlive every Storage they serve.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
};

// Host memory, 64-byte aligned above 256 bytes so vectorized kernels can load aligned. Freed blocks
// of 1 MiB and more are kept (up to 4 GiB) and reused, so a steady training loop stops
// page-faulting.
Allocator& host_allocator();
// Returns the idle cached host blocks to the system.
void empty_host_cache();

class Storage {
 public:
  // Allocates nbytes from `allocator` for `device`. Host blocks of up to kInlineBytes live inside
  // the Storage itself: scalars and tiny tensors cost no separate allocation.
  Storage(size_t nbytes, Device device, Allocator& allocator);
  static constexpr size_t kInlineBytes = 32;
  // Wraps memory owned elsewhere (for example an MPI or HDF5 buffer); it is never freed here.
  // `owner`, if given, is held until this Storage dies: the memory's keeper (a shared-memory
  // mapping, say) then lives exactly as long as some tensor still views it.
  Storage(void* external, size_t nbytes, Device device, std::shared_ptr<const void> owner = {});
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  uint32_t version() const { return version_; }
  void bump_version() { ++version_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;     // null for external memory
  std::shared_ptr<const void> owner_;  // external memory's keeper, if any
  uint32_t version_ = 0;
  alignas(16) unsigned char inline_bytes_[kInlineBytes];
};

}  // namespace mpigrad::core
