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
//
// CUDA graphs (core/cuda_graph.h): while a stream is being captured, what is allocated on it comes
// from a pool of the graph's, filed under the pool's own id instead of the stream's, so a replay
// finds its blocks where the capture left them and no other work is ever handed one. A block of
// the stream's that is freed during the capture joins the pool too: the captured work may still
// read it on every replay. The pool's blocks return to the device when the graph goes (as a
// destroyed stream's do).
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

  // From now until end_capture_pool, allocations on the stream `stream_id` come from a new pool
  // (whose id is returned), and its blocks freed meanwhile join that pool.
  uint64_t begin_capture_pool(uint64_t stream_id);
  void end_capture_pool(uint64_t stream_id);
  // The graph that owned the pool is gone and its work drained: the pool's cached blocks are
  // freed, and its live blocks are freed when their tensors go.
  void release_pool(uint64_t pool_id) { stream_destroyed(pool_id, true); }

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
  std::unordered_map<uint64_t, uint64_t> capture_pools_;  // capturing stream id -> pool id
  std::unordered_map<void*, Block> live_;
  std::map<BinKey, std::vector<void*>> bins_;
  std::vector<Parked> parked_;
  CudaMemoryStats stats_;
};

}  // namespace mpigrad::core::cuda_detail
