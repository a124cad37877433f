// Internal to core/cuda: the caching device allocator behind core/cuda_allocator.h.
//
// One per device. Blocks are cudaMalloc'd at their size class (see round_size) and, when freed,
// filed under (stream they were allocated on, size class). An allocation takes a block of its
// exact class from its current stream's bin, or calls cudaMalloc. A block that record_stream
// marked as used on other streams is parked with one event per such stream at free time, and
// joins its bin once all those events have completed.
// Thread-safe: one mutex guards the bins and the statistics. deallocate never throws (it runs in
// Storage's destructor); if it cannot record an event, it keeps the block out of reuse.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mpigrad/core/cuda_allocator.h"
#include "mpigrad/core/storage.h"

namespace mpigrad::core::cuda_detail {

class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int device) : device_(device) {}

  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) override;

  void record_stream(void* ptr, cudaStream_t stream);
  void empty_cache();
  CudaMemoryStats stats();
  void reset_peak();

  // Sizes are rounded up to 512 bytes; from 4 KiB on, to an eighth of their power of two.
  static size_t round_size(size_t nbytes);

 private:
  struct Block {
    size_t size = 0;
    cudaStream_t stream = nullptr;         // the stream it was allocated on
    std::vector<cudaStream_t> used_on;     // other streams, from record_stream
  };
  struct Parked {
    void* ptr;
    Block block;
    std::vector<cudaEvent_t> events;
  };
  using BinKey = std::pair<cudaStream_t, size_t>;

  void move_finished_parked();  // caller holds mutex_
  void release_free_blocks();   // caller holds mutex_

  const int device_;
  std::mutex mutex_;
  std::unordered_map<void*, Block> live_;
  std::map<BinKey, std::vector<void*>> bins_;
  std::vector<Parked> parked_;
  CudaMemoryStats stats_;
};

}  // namespace mpigrad::core::cuda_detail
