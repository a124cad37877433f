#include "mpigrad/core/storage.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <utility>

namespace mpigrad::core {

namespace {

// Host memory with a cache for large blocks. glibc serves blocks above its mmap threshold
// (at most 32 MiB) with a fresh mmap each time, so every training step would page-fault its
// activations in again; keeping freed large blocks for reuse avoids that. Small blocks go
// straight to the C allocator, which already reuses them well.
class HostAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    // malloc's 16-byte alignment is enough for tiny tensors and much cheaper than memalign.
    if (nbytes <= kSmall) {
      void* ptr = std::malloc(nbytes);
      if (ptr == nullptr) throw std::bad_alloc();
      return ptr;
    }
    size_t rounded = round_size(nbytes);
    if (rounded >= kCachedFrom) {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = cache_.find(rounded);
      if (it != cache_.end()) {
        void* ptr = it->second;
        cache_.erase(it);
        cached_bytes_ -= rounded;
        return ptr;
      }
    }
    void* ptr = std::aligned_alloc(kAlignment, rounded);
    if (ptr == nullptr) {
      release_cache();  // give the cache back to the system and try once more
      ptr = std::aligned_alloc(kAlignment, rounded);
      if (ptr == nullptr) throw std::bad_alloc();
    }
    return ptr;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    if (nbytes <= kSmall) {
      std::free(ptr);
      return;
    }
    size_t rounded = round_size(nbytes);
    if (rounded >= kCachedFrom) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cached_bytes_ + rounded <= kCacheLimit) {
        cache_.emplace(rounded, ptr);
        cached_bytes_ += rounded;
        return;
      }
    }
    std::free(ptr);
  }

  void release_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size, ptr] : cache_) std::free(ptr);
    cache_.clear();
    cached_bytes_ = 0;
  }

 private:
  static constexpr size_t kSmall = 256;                   // bytes served by plain malloc
  static constexpr size_t kAlignment = 64;                // vectorized kernels load aligned
  static constexpr size_t kCachedFrom = size_t(64) << 10;  // cache blocks of 64 KiB and more
  static constexpr size_t kCacheLimit = size_t(4) << 30;  // never hold more than 4 GiB idle

  // Large sizes are rounded up to 1/8 of their power of two, so near sizes share blocks while
  // no block wastes more than 12.5%.
  static size_t round_size(size_t nbytes) {
    size_t rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
    if (rounded < kCachedFrom) return rounded;
    size_t power = size_t(1) << (63 - __builtin_clzll(rounded));
    size_t step = power / 8;
    return (rounded + step - 1) / step * step;
  }

  std::mutex mutex_;
  std::multimap<size_t, void*> cache_;
  size_t cached_bytes_ = 0;
};

// Never destroyed: tensors held in static objects may be freed after static destructors ran.
HostAllocator& host_caching_allocator() {
  static HostAllocator* allocator = new HostAllocator();
  return *allocator;
}

}  // namespace

Allocator& host_allocator() {
  return host_caching_allocator();
}

void empty_host_cache() {
  host_caching_allocator().release_cache();
}

Storage::Storage(size_t nbytes, Device device, Allocator& allocator)
    : nbytes_(nbytes), device_(device) {
  if (device.is_cpu() && nbytes <= kInlineBytes) {
    data_ = inline_bytes_;
  } else {
    data_ = allocator.allocate(nbytes);
    allocator_ = &allocator;
  }
}

Storage::Storage(void* external, size_t nbytes, Device device, std::shared_ptr<const void> owner)
    : data_(external), nbytes_(nbytes), device_(device), owner_(std::move(owner)) {}

Storage::~Storage() {
  if (allocator_ != nullptr && data_ != nullptr) allocator_->deallocate(data_, nbytes_);
}

}  // namespace mpigrad::core
