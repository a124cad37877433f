// Which program started this process, read from the environment it left behind. Used for the
// start-up report and to explain odd worlds ("srun without --mpi=pmix" gives N worlds of size 1).
#pragma once

#include <string_view>

namespace mpigrad::launch {

enum class Launcher {
  OpenMpi,        // Open MPI's mpirun/mpiexec (OMPI_COMM_WORLD_SIZE)
  SlurmPmix,      // srun, with PMIx or PMI2 (SLURM_STEP_ID with SLURM_PROCID, or PMIX_RANK)
  Hydra,          // MPICH/Intel MPI's mpiexec.hydra (PMI_RANK)
  SingleProcess,  // a plain ./program: a world of size 1
};

Launcher detect_launcher();
std::string_view launcher_name(Launcher launcher);

}  // namespace mpigrad::launch
