#include "mpigrad/core/threads.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

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

// Where the count in effect came from. An explicit choice is final; a default may be replaced by
// a better-informed one (the node's share after the mask alone).
struct ThreadState {
  std::mutex mutex;
  ThreadChoice choice;
  bool chosen = false;     // set_num_threads was called
  bool defaulted = false;  // a default was applied
};
ThreadState& thread_state() {
  static ThreadState state;
  return state;
}

// OpenMP gets the count; BLAS always runs on 1 thread, inside OpenMP's regions (one pool).
void apply(int threads) {
  omp_set_num_threads(threads);
  kernels::cpu::set_blas_threads(1);
}

// Applies `choice` unless a choice was made explicitly or, with `first_only`, any default was
// applied already; returns the choice in effect.
ThreadChoice apply_default(const ThreadChoice& choice, bool first_only) {
  ThreadState& state = thread_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.chosen || (first_only && state.defaulted)) return state.choice;
  state.defaulted = true;
  state.choice = {std::max(1, choice.threads), choice.source};
  apply(state.choice.threads);
  return state.choice;
}

}  // namespace

std::vector<int> affinity_cpus() {
  std::vector<int> cpus;
  // Machines with more CPUs than cpu_set_t holds need a larger set; EINVAL says so.
  for (int capacity = CPU_SETSIZE; capacity <= (1 << 16); capacity *= 4) {
    cpu_set_t* set = CPU_ALLOC(capacity);
    if (set == nullptr) break;
    const size_t bytes = CPU_ALLOC_SIZE(capacity);
    CPU_ZERO_S(bytes, set);
    const int rc = sched_getaffinity(0, bytes, set);
    if (rc == 0) {
      for (int cpu = 0; cpu < capacity; ++cpu) {
        if (CPU_ISSET_S(cpu, bytes, set)) cpus.push_back(cpu);
      }
    }
    CPU_FREE(set);
    if (rc == 0 || errno != EINVAL) break;
  }
  if (cpus.empty()) {
    const int cores = std::max(1, int(std::thread::hardware_concurrency()));
    for (int cpu = 0; cpu < cores; ++cpu) cpus.push_back(cpu);
  }
  return cpus;
}

double core_share(const std::vector<int>& mine, const std::vector<std::vector<int>>& masks) {
  double share = 0;
  for (int cpu : mine) {
    int holders = 0;
    for (const std::vector<int>& mask : masks) {
      holders += std::binary_search(mask.begin(), mask.end(), cpu) ? 1 : 0;
    }
    share += 1.0 / std::max(holders, 1);
  }
  return share;
}

ThreadChoice default_thread_choice(double cores, const std::string& source) {
  if (int forced = env_positive_int("MPIGRAD_NUM_THREADS")) return {forced, "MPIGRAD_NUM_THREADS"};
  // A share of 1.9999 cores (three ranks on six cores, in floating point) is 2.
  return {std::max(1, int(std::floor(cores + 1e-6))), source};
}

ThreadChoice default_thread_choice() {
  const size_t cores = affinity_cpus().size();
  return default_thread_choice(
      double(cores),
      std::to_string(cores) + (cores == 1 ? " core" : " cores") + " in the affinity mask");
}

int default_num_threads() {
  return default_thread_choice().threads;
}

int num_threads() {
  return omp_get_max_threads();
}

void set_num_threads(int threads) {
  if (threads < 1) threads = 1;
  ThreadState& state = thread_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.chosen = true;
  state.choice = {threads, "set_num_threads"};
  apply(threads);
}

ThreadChoice apply_default_threads(const ThreadChoice& choice) {
  return apply_default(choice, false);
}

ThreadChoice thread_choice() {
  ThreadState& state = thread_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.chosen || state.defaulted) return state.choice;
  return {num_threads(), "the OpenMP default (no default applied yet)"};
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

namespace {

constexpr const char* kWaitReasonVariable = "MPIGRAD_OPENMP_WAIT";
constexpr int kRunnableSamples = 5;

// /proc/stat's first line, in clock ticks summed over the online CPUs: all time, and all but
// idle and iowait less this process's own.
struct CpuTimes {
  bool known = false;
  uint64_t total = 0, busy = 0;
  int cpus = 0;
};

CpuTimes read_cpu_times() {
  CpuTimes times;
  std::FILE* file = std::fopen("/proc/stat", "r");
  if (file == nullptr) return times;
  char line[512];
  int cpus = 0;
  bool first = true;
  while (std::fgets(line, sizeof(line), file) != nullptr) {
    if (std::strncmp(line, "cpu", 3) != 0) break;
    if (first) {
      // cpu  user nice system idle iowait irq softirq steal ...
      unsigned long long field[8] = {};
      const int read =
          std::sscanf(line + 3, "%llu %llu %llu %llu %llu %llu %llu %llu", &field[0], &field[1],
                      &field[2], &field[3], &field[4], &field[5], &field[6], &field[7]);
      if (read < 5) break;
      for (int i = 0; i < read; ++i) times.total += field[i];
      times.busy = times.total - field[3] - field[4];
      first = false;
    } else {
      ++cpus;  // one "cpuN" line per online CPU
    }
  }
  std::fclose(file);
  times.cpus = cpus;
  times.known = !first && cpus > 0;
  // Less this process's own time (every thread): a BLAS library's workers, started as it loads,
  // may still be spinning, and they are not other load.
  if (times.known) {
    std::FILE* self = std::fopen("/proc/self/stat", "r");
    if (self == nullptr) return times;
    char text[1024];
    const size_t length = std::fread(text, 1, sizeof(text) - 1, self);
    std::fclose(self);
    text[length] = '\0';
    // "pid (comm) state ppid ...": utime and stime are the 12th and 13th fields after the
    // parenthesis (which may hold spaces).
    const char* after = std::strrchr(text, ')');
    unsigned long long user = 0, system = 0;
    if (after == nullptr ||
        std::sscanf(after + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &user,
                    &system) != 2) {
      times.known = false;
      return times;
    }
    times.busy -= std::min<uint64_t>(times.busy, user + system);
  }
  return times;
}

std::string format_load(double load) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", load);
  return text;
}

}  // namespace

OpenMPWaitChoice choose_openmp_wait(const NodeLoad& node) {
  const int threads = std::max(1, node.threads_per_rank), ranks = std::max(1, node.ranks_on_node);
  const int cpus = std::max(1, node.cpus);
  const int64_t demand = int64_t(threads) * ranks;
  std::string shape = std::to_string(threads) + (threads == 1 ? " thread x " : " threads x ") +
                      std::to_string(ranks) + (ranks == 1 ? " rank on " : " ranks on ") +
                      std::to_string(cpus) + (cpus == 1 ? " CPU" : " CPUs");
  const OpenMPWaitChoice passive{"OMP_WAIT_POLICY", "passive", ""};
  if (demand > cpus) return {passive.variable, passive.value, shape + ": oversubscribed"};
  if (node.load_average < 0) {
    return {passive.variable, passive.value, shape + ", load unknown"};
  }
  // A job that ended a moment ago still weighs on the 1-minute average, but no longer runs; our
  // own ranks run now but are not other load.
  double others = node.load_average;
  if (node.running_now >= 0)
    others = std::min(others, double(std::max(0, node.running_now - ranks)));
  if (node.busy_cpus >= 0) others = std::min(others, node.busy_cpus);
  shape += ", other load " + format_load(others);
  if (others > double(cpus - demand) + kFreeCoreLoadSlack) {
    return {passive.variable, passive.value, shape + ": cores busy"};
  }
  return {"GOMP_SPINCOUNT", std::to_string(kOpenMPShortSpin), shape + ": cores free"};
}

NodeLoad observe_node_load() {
  NodeLoad node;
  node.cpus = int(affinity_cpus().size());
  int ranks = env_positive_int("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (ranks == 0) ranks = env_positive_int("MPI_LOCALNRANKS");
  node.ranks_on_node = std::max(1, ranks);
  // What the DistributedManager will apply later: the override, or an equal share of the mask.
  const int forced = env_positive_int("MPIGRAD_NUM_THREADS");
  node.threads_per_rank = forced > 0 ? forced : std::max(1, node.cpus / node.ranks_on_node);
  // "0.25 0.97 1.05 4/128 12458": three averages, then runnable / all tasks. The runnable count
  // is a snapshot: the median of a few, 10 ms apart.
  std::vector<int> readings;
  const CpuTimes first = read_cpu_times();
  for (int sample = 0; sample < kRunnableSamples; ++sample) {
    if (sample > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::FILE* file = std::fopen("/proc/loadavg", "r");
    if (file == nullptr) break;
    double one = 0, five = 0, fifteen = 0;
    int running = 0, total = 0;
    const int read =
        std::fscanf(file, "%lf %lf %lf %d/%d", &one, &five, &fifteen, &running, &total);
    std::fclose(file);
    if (read >= 1) node.load_average = one;
    if (read == 5) readings.push_back(running);
  }
  node.running_now = runnable_from_readings(std::move(readings));
  const CpuTimes last = read_cpu_times();
  if (first.known && last.known)
    node.busy_cpus = busy_cpus_between(first.busy, first.total, last.busy, last.total, last.cpus);
  return node;
}

double busy_cpus_between(uint64_t busy_before, uint64_t total_before, uint64_t busy_after,
                         uint64_t total_after, int cpus) {
  if (total_after <= total_before || cpus <= 0) return -1;
  if (busy_after <= busy_before) return 0;
  const double share = double(busy_after - busy_before) / double(total_after - total_before);
  return std::min(share, 1.0) * double(cpus);
}

int runnable_from_readings(std::vector<int> readings) {
  if (readings.empty()) return -1;
  const auto middle = readings.begin() + std::ptrdiff_t(readings.size() / 2);
  std::nth_element(readings.begin(), middle, readings.end());
  return *middle;
}

void apply_openmp_wait_defaults(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  const NodeLoad node = observe_node_load();
  // One thread has no workers to wait (MPIGRAD_NUM_THREADS=1, one core per rank), and the
  // second start costs about 0.1 s of CPU.
  if (node.threads_per_rank == 1) return;
  const OpenMPWaitChoice choice = choose_openmp_wait(node);
  const std::string described = choice.variable + "=" + choice.value + " (" + choice.reason + ")";
  if (setenv(kWaitReasonVariable, described.c_str(), 1) != 0) return;
  if (setenv(choice.variable.c_str(), choice.value.c_str(), 1) != 0) return;
  execv("/proc/self/exe", argv);
  // The exec failed (no /proc): run on with the runtime's defaults, and say nothing, since
  // nothing is wrong. The variables stay set for any child process.
}

std::string openmp_wait_description() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  if (policy == nullptr && spin == nullptr) return "the OpenMP runtime's default (nothing set)";
  // Ours only while the variable still holds what we set (a child may have been given its own).
  if (const char* reason = std::getenv(kWaitReasonVariable)) {
    const std::string text = reason;
    const size_t equals = text.find('='), space = text.find(' ');
    if (equals != std::string::npos && space != std::string::npos && equals < space) {
      const char* now = std::getenv(text.substr(0, equals).c_str());
      if (now != nullptr && text.substr(equals + 1, space - equals - 1) == now) return text;
    }
  }
  std::string described;
  if (policy != nullptr) described = std::string("OMP_WAIT_POLICY=") + policy;
  if (spin != nullptr)
    described += (described.empty() ? "" : " ") + std::string("GOMP_SPINCOUNT=") + spin;
  return described + " (set by the user)";
}

long openmp_spin_count() {
  std::FILE* capture = std::tmpfile();
  if (capture == nullptr) return -1;
  std::fflush(stderr);
  const int saved = dup(STDERR_FILENO);
  long count = -1;
  if (saved >= 0 && dup2(fileno(capture), STDERR_FILENO) >= 0) {
    omp_display_env(1);
    std::fflush(stderr);
    dup2(saved, STDERR_FILENO);
    std::rewind(capture);
    std::vector<char> line(4096);
    while (std::fgets(line.data(), int(line.size()), capture) != nullptr) {
      // libgomp prints "  GOMP_SPINCOUNT = '10000'".
      const char* at = std::strstr(line.data(), "GOMP_SPINCOUNT = '");
      if (at != nullptr) count = std::strtol(at + std::strlen("GOMP_SPINCOUNT = '"), nullptr, 10);
    }
  }
  if (saved >= 0) close(saved);
  std::fclose(capture);
  return count;
}

void initialize_cpu_runtime() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Only when nothing was chosen or applied yet: a program's set_num_threads, or the node's
    // share that a DistributedManager applied before this first use, stays.
    apply_default(default_thread_choice(), true);
    // Once per job, not once per rank.
    std::string warning = blas_core_warning();
    if (launcher_rank_zero() && !warning.empty()) std::fprintf(stderr, "%s\n", warning.c_str());
  });
}

}  // namespace mpigrad::core
