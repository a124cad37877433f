// How many threads the CPU kernels and BLAS use. Several ranks usually share a node, so the
// default is the node's cores divided by the ranks on the node (read from the launcher's
// environment: Open MPI, Slurm, MPICH/Hydra); MPIGRAD_NUM_THREADS overrides it.
//
// Debian's OpenBLAS 0.3.21 does not recognise some AVX-512 CPUs and falls back to its generic
// "Prescott" kernels, which makes sgemm about 6x slower. The first use of the CPU backend checks
// for that and prints one warning saying to set OPENBLAS_CORETYPE (the library reads it at load
// time, so it must be set before the program starts).
#pragma once

#include <string>

namespace mpigrad::core {

int num_threads();
void set_num_threads(int threads);  // CPU kernels and BLAS alike; at least 1
int default_num_threads();

// The BLAS kernel family in use ("SkylakeX", "Haswell", "Prescott", or "unknown").
std::string blas_core_name();
// The warning text when BLAS runs a generic kernel on a CPU with AVX-512 or AVX2, else "".
std::string blas_core_warning();

// True in the launcher's rank 0 (Open MPI, MPICH/Hydra, Slurm), or in a process started without
// a launcher: the one process of a job that prints the once-per-job warnings of core, which runs
// before (or without) any communicator.
bool launcher_rank_zero();

// Applies the thread count and prints the BLAS warning once per process; idempotent. Called by
// the CPU backend on first use, so programs need not call it.
void initialize_cpu_runtime();

}  // namespace mpigrad::core
