// Internal to nn/cuda: what every CUDA path of the nn layers needs, with or without cuDNN: making
// the tensors' device current, the current stream, and stream-ordered scratch memory.
//
// A .cuh because it includes cuda_runtime.h: never installed and never included by a public
// header. It includes no cuDNN header, so nn/cuda/cuda_ops.cpp compiles in a build without cuDNN.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <utility>

#include "mpigrad/core/cuda/cuda_check.cuh"
#include "mpigrad/core/error.h"
#include "mpigrad/core/stream.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::nn::cuda_ops::detail {

inline cudaStream_t current_stream_of(core::Device device) {
  return static_cast<cudaStream_t>(core::current_stream(device).handle());
}

// Runs fn with `device` current; standard exceptions of kernels/cuda become core::Error with the
// same message, so callers see one exception type.
template <typename Fn>
decltype(auto) on_device(core::Device device, Fn&& fn) {
  MPIGRAD_CHECK(device.is_cuda(), "nn CUDA path called with a tensor on ", device);
  core::cuda_detail::DeviceGuard guard(device.index);
  try {
    return std::forward<Fn>(fn)();
  } catch (const core::Error&) {
    throw;
  } catch (const std::exception& error) {
    throw core::Error(error.what());
  }
}

// Device scratch from the caching allocator (through a UInt8 tensor), freed in stream order.
inline core::Tensor workspace(core::Device device, size_t nbytes) {
  return core::Tensor::empty({int64_t(nbytes > 0 ? nbytes : 1)},
                             core::TensorOptions(core::kUInt8).device(device));
}

}  // namespace mpigrad::nn::cuda_ops::detail
