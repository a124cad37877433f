// `mpigrad devices`: the GPUs this process can use, or one line saying why there is none.
#pragma once

namespace mpigrad::launch {

// Prints one line per visible GPU (name, memory, compute capability, multiprocessors) and the
// CUDA versions, and returns 0; with no GPU prints core::CudaVisibility::describe() (the CUDA
// error quoted) and returns 2; with a broken GPU prints the same and returns 1.
int run_devices_command(int argc, char** argv);

}  // namespace mpigrad::launch
