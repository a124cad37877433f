// Internal to core/cuda: checking CUDA runtime calls, and making a device current for a scope.
//
// Every CUDA call in core/cuda goes through MPIGRAD_CUDA_CHECK, which throws core::Error naming
// the call, the CUDA error and the source line. A .cuh because it includes the CUDA runtime
// header; it is never installed (the install copies *.h only) and no public header includes it.
#pragma once

#include <cuda_runtime.h>

#include "mpigrad/core/error.h"

namespace mpigrad::core::cuda_detail {

[[noreturn]] inline void fail_cuda(cudaError_t status, const char* call, const char* file,
                                   int line) {
  int device = -1;
  (void)cudaGetDevice(&device);
  fail("CUDA call ", call, " failed on cuda:", device, ": ", cudaGetErrorName(status), " (",
       cudaGetErrorString(status), ") at ", file, ":", line);
}

// Makes the process's home device (core/cuda.h: set_cuda_home_device) current on the calling
// thread if this thread has not done so since it was chosen; when none is chosen yet, `fallback`
// becomes the home device (nothing happens for a negative fallback). Every CUDA call of mpigrad
// on a thread is preceded by this, so a thread that never chose a device is on the home device
// rather than on CUDA's default cuda:0. Cheap after the first call on a thread: one atomic load.
// Returns cudaSetDevice's error, if any.
cudaError_t make_home_device_current(int fallback);

// Makes `device` current for the scope and restores the previous device afterwards, which is
// the home device unless the caller chose another. Setting the device is skipped when it already
// is current, which is the common case: a process works on its own GPU.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaError_t status = make_home_device_current(device);
    if (status != cudaSuccess) {
      fail_cuda(status, "cudaSetDevice (the process's home device)", __FILE__, __LINE__);
    }
    status = cudaGetDevice(&previous_);
    if (status != cudaSuccess) fail_cuda(status, "cudaGetDevice", __FILE__, __LINE__);
    if (previous_ != device) {
      status = cudaSetDevice(device);
      if (status != cudaSuccess) fail_cuda(status, "cudaSetDevice", __FILE__, __LINE__);
      changed_ = true;
    }
  }
  ~DeviceGuard() {
    if (changed_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

}  // namespace mpigrad::core::cuda_detail

#define MPIGRAD_CUDA_CHECK(call)                                                                \
  do {                                                                                          \
    const cudaError_t mpigrad_cuda_status_ = (call);                                            \
    if (mpigrad_cuda_status_ != cudaSuccess) [[unlikely]]                                       \
      ::mpigrad::core::cuda_detail::fail_cuda(mpigrad_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)
