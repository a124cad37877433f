#include "mpigrad/data/batch_buffers.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

#include "mpigrad/core/checked_math.h"
#include "mpigrad/core/error.h"

namespace mpigrad::data {

namespace {

class BatchBufferPool final : public core::Allocator {
 public:
  void* allocate(size_t nbytes) override {
    const size_t rounded = round(nbytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto found = idle_.find(rounded);
      if (found != idle_.end()) {
        void* ptr = found->second;
        idle_.erase(found);
        idle_bytes_ -= rounded;
        return ptr;
      }
    }
    void* ptr = std::aligned_alloc(kAlignment, rounded);
    if (ptr == nullptr) {
      release();
      ptr = std::aligned_alloc(kAlignment, rounded);
      if (ptr == nullptr) throw std::bad_alloc();
    }
    return ptr;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    const size_t rounded = round(nbytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (idle_bytes_ + rounded <= kIdleLimit) {
        idle_.emplace(rounded, ptr);
        idle_bytes_ += rounded;
        return;
      }
    }
    std::free(ptr);
  }

  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size, ptr] : idle_) std::free(ptr);
    idle_.clear();
    idle_bytes_ = 0;
  }

 private:
  static constexpr size_t kAlignment = 64;
  static constexpr size_t kIdleLimit = size_t(1) << 30;
  static size_t round(size_t nbytes) {
    nbytes = std::max<size_t>(nbytes, 1);
    const size_t step = std::max(kAlignment, std::bit_floor(nbytes) / 8);
    return (nbytes + step - 1) / step * step;
  }

 public:
  size_t idle_bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return idle_bytes_;
  }
  static size_t size_class(size_t nbytes) { return round(nbytes); }

 private:
  std::mutex mutex_;
  std::multimap<size_t, void*> idle_;
  size_t idle_bytes_ = 0;
};

// Never destroyed: tensors from it may outlive static destruction order.
BatchBufferPool& pool() {
  static auto* instance = new BatchBufferPool();
  return *instance;
}

constexpr int64_t kPooledFrom = 64 * 1024;  // smaller blocks: malloc reuses them well already

}  // namespace

core::Tensor empty_batch_tensor(const core::Shape& shape, core::DType dtype) {
  const int64_t nbytes = core::checked_mul(shape.numel(), int64_t(core::element_size(dtype)),
                                           "batch buffer of shape ", shape, " in bytes");
  if (nbytes < kPooledFrom) return core::Tensor::empty(shape, dtype);
  std::shared_ptr<core::Storage> storage;
  try {
    storage = std::make_shared<core::Storage>(size_t(nbytes), core::kCPU, pool());
  } catch (const std::bad_alloc&) {
    throw core::AllocationError(core::detail::concat("cannot allocate ", nbytes, " bytes for a ",
                                                     dtype, " batch of shape ", shape),
                                nbytes);
  }
  return core::Tensor(std::make_shared<core::TensorImpl>(
      std::move(storage), shape, core::contiguous_strides(shape), 0, dtype));
}

void release_batch_buffers() {
  pool().release();
}

int64_t batch_buffer_idle_bytes() {
  return int64_t(pool().idle_bytes());
}

int64_t batch_buffer_size_class(int64_t nbytes) {
  return nbytes < kPooledFrom ? nbytes : int64_t(BatchBufferPool::size_class(size_t(nbytes)));
}

}  // namespace mpigrad::data
