// The CUDA runtime as the rest of mpigrad sees it: whether this build has the CUDA backend, which
// GPUs are visible (and, when none is, why), the GPU this process works on, and waiting for one.
//
// No CUDA header is included here (nor in any public header): host code that embeds mpigrad
// compiles with any C++ compiler. In a build without CUDA every query answers "none".
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "mpigrad/core/device.h"

namespace mpigrad::core {

// Whether this libmpigrad was compiled with the CUDA backend (MPIGRAD_WITH_CUDA).
bool cuda_built();

// What cudaGetDeviceCount answered, asked once per process and remembered.
//
// Only "no device" and "no driver" mean that this machine has no GPU to offer:
// cudaErrorNoDevice (none, or CUDA_VISIBLE_DEVICES hides them all), and for no driver
// cudaErrorInsufficientDriver (none, as on a build machine, or one older than the runtime) or
// cudaErrorStubLibrary (the toolkit's stub libcuda found instead of a driver, as on build
// machines with lib64/stubs on the library path). Any other error (a driver/runtime mismatch, a
// device node that cannot be opened, a failed initialization) means a GPU is there but broken:
// that is a failure to report, never a reason to fall back to the CPU or to skip a GPU test.
struct CudaVisibility {
  bool built = true;     // false in a build without CUDA
  int device_count = 0;  // GPUs this process can use
  bool broken = false;   // cudaGetDeviceCount failed with an error other than those above
  std::string error;     // "cudaErrorNoDevice (no CUDA-capable device is detected)"; "" if none

  bool has_gpu() const { return device_count > 0; }
  // One line for logs and skip messages, e.g. "1 CUDA device visible", "no GPU visible:
  // cudaGetDeviceCount failed with cudaErrorInsufficientDriver (CUDA driver version is
  // insufficient for CUDA runtime version)", "CUDA is broken: cudaGetDeviceCount failed with
  // ...", "no GPU visible: this mpigrad was built without CUDA".
  std::string describe() const;
};

// cudaGetDeviceCount's answer for this process (in a build without CUDA: built = false).
const CudaVisibility& cuda_visibility();

// The cudaError_t values that mean "no GPU" (checked against cuda_runtime.h where it is built).
inline constexpr int kCudaErrorStubLibrary = 34;
inline constexpr int kCudaErrorInsufficientDriver = 35;
inline constexpr int kCudaErrorNoDevice = 100;

// Turns cudaGetDeviceCount's result into a CudaVisibility: `error_code` is the cudaError_t as an
// integer (0 on success), `count` the devices it reported, `name` and `text` the runtime's
// cudaGetErrorName and cudaGetErrorString of the error. A pure function, so the rule above is
// tested on machines without a GPU.
CudaVisibility classify_cuda_device_count(int error_code, int count, const std::string& name,
                                          const std::string& text);

// CUDA devices visible to this process: 0 when there is no GPU (see CudaVisibility), and a
// core::Error naming the CUDA error when the GPU is broken.
int cuda_device_count();

// cuda_device_count() > 0.
bool cuda_is_available();

// The device's name as the driver reports it ("NVIDIA H200"); throws core::Error if it is not
// visible.
std::string cuda_device_name(Device device);

// What `mpigrad devices` prints about one GPU.
struct CudaDeviceInfo {
  std::string name;
  int64_t total_memory_bytes = 0;
  int compute_major = 0, compute_minor = 0;
  int multiprocessors = 0;
};
CudaDeviceInfo cuda_device_info(Device device);
// "CUDA runtime 13.0, driver 13.0" (the driver's is the newest runtime it supports).
std::string cuda_versions();

// The GPU this process works on. mpigrad makes it the current device of every thread that runs
// CUDA work through it, before anything else, and every device switch (an op on another GPU)
// returns to it, so no thread of the process creates a context on a GPU it does not use (a
// context costs hundreds of MiB on that GPU). DistributedManager sets it once per rank at
// start-up, from the rank's place on its node (launch/job/device_choice.h). A program that never
// sets it gets the first GPU that mpigrad is asked to use. Setting it again replaces it (each
// thread switches at its next CUDA call through mpigrad). Throws core::Error when the device is
// not a visible CUDA device.
void set_cuda_home_device(Device device);
// The device set_cuda_home_device (or the first use) chose, if any.
std::optional<Device> cuda_home_device();
// The calling thread's current CUDA device (cudaGetDevice), for tests and diagnostics.
Device cuda_current_device();

// Waits until every stream of `device` has finished its queued work.
void cuda_synchronize(Device device);

}  // namespace mpigrad::core
