// Launcher detection from environment variables the launchers set before exec.
#include "mpigrad/launch/job/launcher.h"

#include <cstdlib>
#include <string_view>

#include "mpigrad/core/enum_names.h"

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

namespace {
// For the start-up report: what the user typed, not a token to parse.
constexpr core::EnumName<Launcher> kLauncherNames[] = {{Launcher::OpenMpi, "Open MPI (mpirun)"},
                                                       {Launcher::SlurmPmix, "Slurm/PMIx (srun)"},
                                                       {Launcher::Hydra, "Hydra (mpiexec.hydra)"},
                                                       {Launcher::SingleProcess, "single process"}};
}  // namespace

std::string_view launcher_name(Launcher launcher) {
  return core::enum_name(launcher, kLauncherNames);
}

}  // namespace mpigrad::launch
