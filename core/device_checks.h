// Checks of data that run on a GPU and are read by the host later, so that a training step
// never waits for them.
//
// Checking labels on the host costs a copy and a synchronization per step. Kernels that validate
// their input (the fused cross-entropy's label range, core/ops/cross_entropy.h) therefore do it
// on the device: a bad value raises a code in device memory, which is copied into pinned host
// memory behind the kernel, on the same stream, without waiting. The host looks at these copies
// - after every synchronizing read from that device (Tensor::item, to_vector, .to(kCPU),
//   StreamView::synchronize, cuda_synchronize): by then the checks queued before are usually done;
// - when the next check of that device is queued (only those already finished);
// - in check_device_errors(device), which waits for all of them.
// A failed check becomes one core::Error with its own message (cross-entropy names the label
// value, its position in the batch, what the labels are, and num_classes) and is reported once.
// Until then the work goes on: cross-entropy writes NaN for the bad rows, so the step cannot pass
// for a good one. On the CPU the same checks throw at once.
#pragma once

#include "mpigrad/core/device.h"

namespace mpigrad::core {

// Waits for every check queued on `device` and raises the first that failed; returns when all
// passed. Nothing to do for the CPU.
void check_device_errors(Device device);

}  // namespace mpigrad::core
