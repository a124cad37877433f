// The CUDA runtime as the rest of mpigrad sees it: whether this build has the CUDA backend, how
// many GPUs are visible, and waiting for one.
//
// No CUDA header is included here (nor in any public header): host code that embeds mpigrad
// compiles with any C++ compiler. In a build without CUDA every query answers "none".
#pragma once

#include <string>

#include "mpigrad/core/device.h"

namespace mpigrad::core {

// Whether this libmpigrad was compiled with the CUDA backend (MPIGRAD_WITH_CUDA).
bool cuda_built();

// CUDA devices visible to this process. Any error of the runtime (no driver, no device, a driver
// too old for the toolkit) counts as zero devices; it is asked once and remembered.
int cuda_device_count();

// cuda_device_count() > 0.
bool cuda_is_available();

// The device's name as the driver reports it ("NVIDIA H200"); throws core::Error if it is not
// visible.
std::string cuda_device_name(Device device);

// Waits until every stream of `device` has finished its queued work.
void cuda_synchronize(Device device);

}  // namespace mpigrad::core
