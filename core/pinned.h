// Pinned (page-locked) host memory and asynchronous copies between it and a GPU.
//
// Copies from pinned memory run on the copy engines while the GPU computes, and do not wait for
// the host. The pinned allocator caches its blocks like the device allocator does, and keeps a
// block that an asynchronous copy still reads or writes out of reuse until that copy has
// finished, so freeing a tensor right after starting its copy is safe.
#pragma once

#include "mpigrad/core/device.h"
#include "mpigrad/core/shape.h"
#include "mpigrad/core/storage.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::core {

// The process's pinned host allocator (cudaHostAlloc). Throws core::Error when CUDA is absent.
Allocator& pinned_host_allocator();

// An uninitialized CPU tensor in pinned memory.
Tensor empty_pinned(const Shape& shape, DType dtype);
// A pinned copy of a CPU tensor.
Tensor pin_memory(const Tensor& tensor);
// Whether a CPU tensor's memory is pinned.
bool is_pinned(const Tensor& tensor);

// The non-blocking form of tensor.to(device): a copy between the host and a CUDA device (either
// way), queued on the CUDA device's current stream; the caller does not wait.
// - host -> device: the result may be used at once by ops on that stream (they run after the
//   copy). From pinned memory the copy overlaps with the host; from pageable memory the CUDA
//   runtime stages it first.
// - device -> host: the result is pinned and holds the data only after the stream has been
//   synchronized (or an Event recorded after the call has completed).
// No autograd history is recorded (it is for data movement). dtype is kept; a non-contiguous
// source is made contiguous first.
Tensor to_async(const Tensor& tensor, Device device);

}  // namespace mpigrad::core
