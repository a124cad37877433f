#include "mpigrad/core/threads.h"

#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "mpigrad/kernels/matmul.h"

namespace mpigrad::core {

namespace {

// A positive integer from the environment, or 0 when unset or malformed.
int env_positive_int(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return 0;
  char* end = nullptr;
  long parsed = std::strtol(value, &end, 10);
  return (*end == '\0' && parsed > 0 && parsed < 1 << 20) ? int(parsed) : 0;
}

// Ranks sharing this node, as the launcher reports it; 1 when started without one.
int ranks_on_node() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE",
                           "PMI_LOCAL_SIZE"}) {
    if (int ranks = env_positive_int(name)) return ranks;
  }
  return 1;
}

}  // namespace

int default_num_threads() {
  if (int forced = env_positive_int("MPIGRAD_NUM_THREADS")) return forced;
  int cores = int(std::thread::hardware_concurrency());
  if (cores <= 0) cores = 1;
  int threads = cores / ranks_on_node();
  return threads > 0 ? threads : 1;
}

int num_threads() {
  return omp_get_max_threads();
}

void set_num_threads(int threads) {
  if (threads < 1) threads = 1;
  omp_set_num_threads(threads);
  kernels::cpu::set_blas_threads(threads);
}

std::string blas_core_name() {
  return kernels::cpu::blas_core_name();
}

std::string blas_core_warning() {
  std::string core = blas_core_name();
  bool generic = core == "Prescott" || core == "prescott" || core == "Core2" || core == "core2";
  if (!generic) return "";
  __builtin_cpu_init();
  const char* suggestion = nullptr;
  if (__builtin_cpu_supports("avx512f")) {
    suggestion = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2")) {
    suggestion = "Haswell";
  }
  if (suggestion == nullptr) return "";
  return "mpigrad: warning: OpenBLAS is using its generic '" + core +
         "' kernels on a CPU that supports " +
         (std::strcmp(suggestion, "SkylakeX") == 0 ? "AVX-512" : "AVX2") +
         "; sgemm runs several times slower. Set OPENBLAS_CORETYPE=" + suggestion +
         " in the environment before starting the program.";
}

bool launcher_rank_zero() {
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (rank == nullptr) rank = std::getenv("PMI_RANK");
  if (rank == nullptr) rank = std::getenv("SLURM_PROCID");
  return rank == nullptr || std::strcmp(rank, "0") == 0;
}

void initialize_cpu_runtime() {
  static std::once_flag once;
  std::call_once(once, [] {
    set_num_threads(default_num_threads());
    // Once per job, not once per rank.
    std::string warning = blas_core_warning();
    if (launcher_rank_zero() && !warning.empty()) std::fprintf(stderr, "%s\n", warning.c_str());
  });
}

}  // namespace mpigrad::core
