// Host memory for the tensors a dataset yields, recycled between batches. A loader allocates the
// same few sizes every step; blocks below 64 KiB fall below core's host-allocator cache and, from
// worker threads, land in glibc per-thread arenas that are trimmed and faulted in again each step.
// Recycling them keeps loader reads as fast as raw HDF5 reads into one reused buffer. The pool is
// process-wide (like core's host allocator), thread-safe, and holds at most 1 GiB of idle blocks.
// Ragged batches (atomic data) change size every step: blocks are rounded up to one of 8 size
// classes per power of two (at most 12.5% larger), so batches of nearby sizes share blocks instead
// of each size idling in the pool. With the CUDA backend this is where pinned host buffers will
// come from.
#pragma once

#include "mpigrad/core/dtype.h"
#include "mpigrad/core/shape.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::data {

// An uninitialized, contiguous CPU tensor whose memory returns to the pool when freed.
core::Tensor empty_batch_tensor(const core::Shape& shape, core::DType dtype);

// Frees the idle pooled blocks.
void release_batch_buffers();

// Bytes of the idle pooled blocks, and the size class a request of `nbytes` gets (for tests).
int64_t batch_buffer_idle_bytes();
int64_t batch_buffer_size_class(int64_t nbytes);

}  // namespace mpigrad::data
