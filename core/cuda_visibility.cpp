// The rule of core/cuda.h for cudaGetDeviceCount's answer, compiled in every build (also without
// CUDA) so that the CPU test suite checks it.
#include "mpigrad/core/cuda.h"

namespace mpigrad::core {

CudaVisibility classify_cuda_device_count(int error_code, int count, const std::string& name,
                                          const std::string& text) {
  CudaVisibility visibility;
  if (error_code == 0) {
    visibility.device_count = count > 0 ? count : 0;
    return visibility;
  }
  visibility.error = name + " (" + text + ")";
  visibility.broken = error_code != kCudaErrorNoDevice &&
                      error_code != kCudaErrorInsufficientDriver &&
                      error_code != kCudaErrorStubLibrary;
  return visibility;
}

std::string CudaVisibility::describe() const {
  if (!built) return "no GPU visible: this mpigrad was built without CUDA";
  if (broken) return "CUDA is broken: cudaGetDeviceCount failed with " + error;
  if (!error.empty()) return "no GPU visible: cudaGetDeviceCount failed with " + error;
  if (device_count == 0) return "no GPU visible: cudaGetDeviceCount found 0 devices";
  return std::to_string(device_count) + " CUDA device" + (device_count == 1 ? "" : "s") +
         " visible";
}

}  // namespace mpigrad::core
