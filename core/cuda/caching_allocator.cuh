// Internal to core/cuda: the caching device allocator behind core/cuda_allocator.h.
//
// One per device. Blocks are cudaMalloc'd at their size class (see round_size) and, when freed,
// filed under (id of the stream they were allocated on, size class). Stream ids, not handles:
// CUDA reuses the handle of a destroyed stream for a new one, and a block must never pass to a
// stream that did not order itself after its last use. An allocation takes a block of its exact
// class from its current stream's bin, or calls cudaMalloc. A block that record_stream marked as
// used on other streams is parked with one event per such stream at free time, and joins its bin
// once all those events have completed. When a Stream is destroyed (after its work has drained)
// its cached blocks are freed, and blocks still held by tensors are freed instead of cached when
// those tensors go: nothing can reuse them on a stream that no longer exists.
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
#include "mpigrad/core/stream.h"

namespace mpigrad::core::cuda_detail {

class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int device) : device_(device) {}

  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) override;

  void record_stream(void* ptr, StreamView stream);
  // Called by ~Stream once the stream's queued work has finished (`drained`; false when waiting
  // for it failed, and then its blocks are never reused nor freed).
  void stream_destroyed(uint64_t stream_id, bool drained);
  void empty_cache();
  CudaMemoryStats stats();
  void reset_peak();

  // Sizes are rounded up to 512 bytes; from 4 KiB on, to an eighth of their power of two.
  static size_t round_size(size_t nbytes);

 private:
  struct UsedOn {
    uint64_t id;
    cudaStream_t handle;
  };
  struct Block {
    size_t size = 0;
    uint64_t stream_id = 0;       // the stream it was allocated on
    bool orphan = false;          // that stream was destroyed: free it instead of caching it
    std::vector<UsedOn> used_on;  // other streams, from record_stream
    // A stream it was used on was destroyed with its work not drained (the runtime failing):
    // the memory is neither reused nor freed, and no event is recorded on the dead stream.
    bool lost = false;
  };
  struct Parked {
    void* ptr;
    Block block;
    std::vector<cudaEvent_t> events;
  };
  using BinKey = std::pair<uint64_t, size_t>;

  void move_finished_parked();              // caller holds mutex_
  void release_free_blocks();               // caller holds mutex_
  void free_block(void* ptr, size_t size);  // caller holds mutex_; throws on a CUDA error

  const int device_;
  std::mutex mutex_;
  std::unordered_map<void*, Block> live_;
  std::map<BinKey, std::vector<void*>> bins_;
  std::vector<Parked> parked_;
  CudaMemoryStats stats_;
};

}  // namespace mpigrad::core::cuda_detail
