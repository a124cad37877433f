// Launcher detection from environment variables the launchers set before exec.
#include "mpigrad/launch/job/launcher.h"

#include <cstdlib>
#include <string_view>

namespace mpigrad::launch {

Launcher detect_launcher() {
  auto set = [](const char* name) { return std::getenv(name) != nullptr; };
  // Open MPI started without mpirun ("singleton") exports PMIx variables of its own during
  // MPI_Init; it marks itself with OMPI_MCA_ess=singleton.
  if (const char* ess = std::getenv("OMPI_MCA_ess");
      ess != nullptr && std::string_view(ess) == "singleton") {
    return Launcher::SingleProcess;
  }
  // Open MPI first: its mpirun also exports PMIX_RANK, and inside a Slurm allocation the batch
  // step's SLURM_PROCID is inherited by mpirun's children.
  if (set("OMPI_COMM_WORLD_SIZE")) return Launcher::OpenMpi;
  if ((set("SLURM_STEP_ID") && set("SLURM_PROCID")) || set("PMIX_RANK")) return Launcher::SlurmPmix;
  if (set("PMI_RANK")) return Launcher::Hydra;
  return Launcher::SingleProcess;
}

std::string_view launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::OpenMpi:
      return "Open MPI (mpirun)";
    case Launcher::SlurmPmix:
      return "Slurm/PMIx (srun)";
    case Launcher::Hydra:
      return "Hydra (mpiexec.hydra)";
    case Launcher::SingleProcess:
      return "single process";
  }
  return "?";
}

}  // namespace mpigrad::launch
