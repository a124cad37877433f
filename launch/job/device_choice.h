// Which device each rank works on, chosen once per rank at start-up (DistributedManager does it,
// then makes the GPU the process's home device, core/cuda.h), and the check that a GPU backend
// has a GPU for every rank.
//
// The rule, first match wins:
//   1. DistributedOptions::device, when the program gives one;
//   2. MPIGRAD_DEVICE in the environment: `cpu`; `cuda` (the automatic GPU below, and an error
//      when there is none); or `cuda:N` (that GPU, on every rank that reads the variable: for one
//      rank per node, or a launcher script that sets it per rank);
//   3. automatic: with visible GPUs cuda:(local_rank % GPUs), otherwise the CPU.
// A broken GPU (core::CudaVisibility::broken) is an error for every choice that needs CUDA, never
// a quiet fall-back to the CPU; `cpu` never looks at CUDA at all. The automatic rule lets ranks
// share a GPU when a node runs more ranks than it has GPUs (the MPI backend copes with that);
// NCCL cannot, and check_one_gpu_per_rank() refuses it with one error naming both counts.
// Pure functions of their arguments, so the rules are tested on machines without a GPU.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "mpigrad/core/cuda.h"
#include "mpigrad/core/device.h"

namespace mpigrad::launch {

// `requested`: DistributedOptions::device; `environment`: MPIGRAD_DEVICE's value ("" if unset);
// `local_rank` of `local_size` ranks on this node; `visibility`: core::cuda_visibility().
// Throws core::Error (prefixed with `where`, e.g. "[rank 1/4]") when the choice cannot be met.
core::Device choose_rank_device(const std::optional<core::Device>& requested,
                                std::string_view environment, int local_rank, int local_size,
                                const core::CudaVisibility& visibility, const std::string& where);

// Throws core::Error unless each of the `local_size` ranks on this node can have its own GPU
// among `device_count`: what NCCL (`backend`, as the user spells it) needs.
void check_one_gpu_per_rank(int local_size, int device_count, const std::string& backend,
                            const std::string& where);

}  // namespace mpigrad::launch
