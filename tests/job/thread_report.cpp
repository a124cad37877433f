// Prints, on every rank, how many threads its CPU kernels use and why (core/threads.h): the
// program run by check_threads.sh under taskset, mpirun --bind-to core and --bind-to none.
//   mpigrad-thread-report [--set N] [--unset-launcher-env]
// --set N calls core::set_num_threads(N) first, before the CPU backend's first use and before the
// DistributedManager: neither may replace it. --unset-launcher-env removes the rank-count
// variables a launcher may set (as srun -n N without --ntasks-per-node leaves them unset), so the
// ranks sharing a node can only come from MPI.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/core/threads.h"
#include "mpigrad/launch/job/distributed_manager.h"

using namespace mpigrad;

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--set" && i + 1 < argc) {
      core::set_num_threads(std::atoi(argv[++i]));
    } else if (arg == "--unset-launcher-env") {
      for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                               "SLURM_NTASKS_PER_NODE", "PMI_LOCAL_SIZE"}) {
        unsetenv(name);
      }
    } else {
      std::fprintf(stderr, "usage: %s [--set N] [--unset-launcher-env]\n", argv[0]);
      return 2;
    }
  }
  // The CPU backend's first use, before the manager exists.
  const float total = core::sum(core::ones({1000})).item<float>();
  auto manager = launch::DistributedManager::initialize(&argc, &argv);
  // And again after it.
  const float again = core::sum(core::ones({1000})).item<float>();
  const core::ThreadChoice choice = core::thread_choice();
  std::printf("rank %d/%d: %d thread(s) (%s); num_threads %d; sums %g %g\n", manager.rank(),
              manager.world_size(), choice.threads, choice.source.c_str(), core::num_threads(),
              double(total), double(again));
  std::printf("rank %d/%d: %s\n", manager.rank(), manager.world_size(), manager.describe().c_str());
  return 0;
}
