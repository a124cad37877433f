// Internal to nn/cuda: cuDNN error checking, RAII owners of the cuDNN handle and descriptors,
// and the per-device handle cache.
//
// A .cuh because it includes cudnn.h: never installed (the install copies *.h only) and never
// included by a public header, nor by any file of a build without cuDNN (MPIGRAD_WITHOUT_CUDNN:
// the check below keeps that true even where the toolkit's include folder has cudnn.h).
// Handles: one cudnnHandle_t per device, created on first use and owned by CudnnHandles, a
// per-device cache held the way core's CUDA backend registry holds its backends (created once,
// kept for the process, since tensors freed by static destructors may still queue work). A
// handle carries a stream, so a caller takes the device's handle through a HandleLease, which
// holds the device's mutex, binds the calling thread's current stream, and releases on scope exit.
#pragma once

#if defined(MPIGRAD_WITHOUT_CUDNN)
#error "cudnn_support.cuh included in a build without cuDNN; use nn/cuda/cuda_support.cuh"
#endif

#include <cudnn.h>

#include <exception>
#include <memory>
#include <mutex>
#include <utility>

#include "mpigrad/core/cuda/cuda_check.cuh"
#include "mpigrad/core/dtype.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/stream.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/nn/cuda/cuda_support.cuh"

namespace mpigrad::nn::cuda_ops::detail {

// Every cuDNN call goes through this: a failure throws core::Error naming the call and device.
inline void check_cudnn(cudnnStatus_t status, const char* call, int device) {
  if (status != CUDNN_STATUS_SUCCESS) {
    core::fail("cuDNN call ", call, " failed on cuda:", device, ": ",
               cudnnGetErrorString(status));
  }
}

#define MPIGRAD_CUDNN_CHECK(call, device) \
  ::mpigrad::nn::cuda_ops::detail::check_cudnn((call), #call, (device))

inline cudnnDataType_t cudnn_dtype(core::DType dtype, const char* op) {
  if (dtype == core::kFloat32) return CUDNN_DATA_FLOAT;
  if (dtype == core::kFloat64) return CUDNN_DATA_DOUBLE;
  core::fail(op, ": cuDNN path supports float32 and float64, got ", dtype);
}

// ---- RAII owners --------------------------------------------------------------------------------

// Owns one cuDNN descriptor; Create/Destroy are the cuDNN pair for its type.
template <typename Handle, cudnnStatus_t (*Create)(Handle*), cudnnStatus_t (*Destroy)(Handle)>
class Descriptor {
 public:
  explicit Descriptor(int device) {
    check_cudnn(Create(&handle_), "cudnnCreate*Descriptor", device);
  }
  ~Descriptor() {
    if (handle_ != nullptr) (void)Destroy(handle_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Handle get() const { return handle_; }

 private:
  Handle handle_ = nullptr;
};

using TensorDescriptor =
    Descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDescriptor =
    Descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor = Descriptor<cudnnConvolutionDescriptor_t,
                                         cudnnCreateConvolutionDescriptor,
                                         cudnnDestroyConvolutionDescriptor>;
using PoolingDescriptor = Descriptor<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor,
                                     cudnnDestroyPoolingDescriptor>;

// The cuDNN handle of one device.
class CudnnHandle {
 public:
  explicit CudnnHandle(int device) : device_(device) {
    core::cuda_detail::DeviceGuard guard(device);
    MPIGRAD_CUDNN_CHECK(cudnnCreate(&handle_), device);
  }
  ~CudnnHandle() {
    if (handle_ != nullptr) (void)cudnnDestroy(handle_);
  }
  CudnnHandle(const CudnnHandle&) = delete;
  CudnnHandle& operator=(const CudnnHandle&) = delete;
  cudnnHandle_t get() const { return handle_; }
  int device() const { return device_; }
  std::mutex& mutex() { return mutex_; }

 private:
  int device_;
  cudnnHandle_t handle_ = nullptr;
  std::mutex mutex_;
};

// The handle of `device` (created on first use; defined in cudnn_support.cpp).
CudnnHandle& cudnn_handle(int device);

// Exclusive use of a device's handle, bound to the calling thread's current stream.
class HandleLease {
 public:
  explicit HandleLease(core::Device device)
      : handle_(cudnn_handle(device.index)), lock_(handle_.mutex()) {
    MPIGRAD_CUDNN_CHECK(cudnnSetStream(handle_.get(), current_stream_of(device)), device.index);
  }
  cudnnHandle_t get() const { return handle_.get(); }
  int device() const { return handle_.device(); }

 private:
  CudnnHandle& handle_;
  std::lock_guard<std::mutex> lock_;
};

// cuDNN's alpha/beta scaling factors: double for double data, float otherwise.
struct Scale {
  float f;
  double d;
  const void* get(core::DType dtype) const {
    return dtype == core::kFloat64 ? static_cast<const void*>(&d) : static_cast<const void*>(&f);
  }
};
inline Scale scale(double value) { return Scale{float(value), value}; }

// A dense NCHW descriptor.
inline void set_nchw(const TensorDescriptor& desc, core::DType dtype, int64_t n, int64_t c,
                     int64_t h, int64_t w, const char* op, int device) {
  MPIGRAD_CHECK(n <= INT32_MAX && c <= INT32_MAX && h <= INT32_MAX && w <= INT32_MAX, op,
                ": tensor dims exceed cuDNN's int range");
  MPIGRAD_CUDNN_CHECK(cudnnSetTensor4dDescriptor(desc.get(), CUDNN_TENSOR_NCHW,
                                                 cudnn_dtype(dtype, op), int(n), int(c), int(h),
                                                 int(w)),
                      device);
}

}  // namespace mpigrad::nn::cuda_ops::detail
