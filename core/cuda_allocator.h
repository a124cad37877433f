// The caching CUDA device allocator: what it reports and the few controls it offers.
//
// Every CUDA tensor's memory comes from one caching allocator per device. Freed blocks are kept
// in size-class bins (sizes rounded up to 512 bytes, and above 4 KiB to an eighth of their power
// of two, so no block wastes more than 12.5%) and reused by later allocations of the same class
// on the same stream; a steady training loop therefore stops calling cudaMalloc after its first
// step. Reuse is safe without synchronization because work on one stream runs in order. A block
// used by another stream must be announced with record_stream, and is reused only once that
// stream has passed the point where the block was freed. When cudaMalloc fails, the cache is
// emptied and the allocation retried once before a core::Error reports the shortage.
#pragma once

#include <cstdint>

#include "mpigrad/core/device.h"
#include "mpigrad/core/stream.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::core {

struct CudaMemoryStats {
  int64_t allocated_bytes = 0;       // held by live tensors (rounded sizes)
  int64_t reserved_bytes = 0;        // obtained with cudaMalloc and not yet returned
  int64_t peak_allocated_bytes = 0;  // since the start or reset_cuda_peak_stats
  int64_t peak_reserved_bytes = 0;
  int64_t device_allocations = 0;  // cudaMalloc calls so far
  int64_t device_frees = 0;        // cudaFree calls so far
  int64_t cache_hits = 0;          // allocations served from the cache
};

CudaMemoryStats cuda_memory_stats(Device device);
void reset_cuda_peak_stats(Device device);
// Returns every cached (free) block of `device` to the driver; live tensors are untouched.
void cuda_empty_cache(Device device);

// Declares that `tensor`'s memory is used by work queued on `stream` (another stream than the
// one it was allocated on): when the tensor is freed, its block is not reused until `stream`
// has finished that work.
void record_stream(const Tensor& tensor, StreamView stream);

}  // namespace mpigrad::core
