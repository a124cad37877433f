// Thread control: the explicit setting, the default from the affinity mask, and that results do not
// depend on how many threads computed them (a run must reproduce on a node of another size).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/join.h"
#include "mpigrad/core/ops/linalg.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/ops/softmax.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/core/threads.h"

namespace {

using namespace mpigrad::core;  // NOLINT

// MPIGRAD_NUM_THREADS, and the launchers' rank counts that default_num_threads must not read;
// each test starts from none of them set and puts back whatever the surrounding environment had.
constexpr const char* kThreadVariables[] = {"MPIGRAD_NUM_THREADS", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                            "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE",
                                            "PMI_LOCAL_SIZE"};

class CleanThreadEnvironment {
 public:
  CleanThreadEnvironment() {
    for (const char* name : kThreadVariables) {
      const char* value = std::getenv(name);
      saved_.push_back(value ? std::optional<std::string>(value) : std::nullopt);
      unsetenv(name);
    }
  }
  ~CleanThreadEnvironment() {
    for (size_t i = 0; i < saved_.size(); ++i) {
      if (saved_[i]) {
        setenv(kThreadVariables[i], saved_[i]->c_str(), 1);
      } else {
        unsetenv(kThreadVariables[i]);
      }
    }
  }
  CleanThreadEnvironment(const CleanThreadEnvironment&) = delete;
  CleanThreadEnvironment& operator=(const CleanThreadEnvironment&) = delete;

 private:
  std::vector<std::optional<std::string>> saved_;
};

// Restores the thread count a test changed.
struct ThreadCountRestorer {
  int previous = num_threads();
  ~ThreadCountRestorer() { set_num_threads(previous); }
};

}  // namespace

TEST_CASE("set_num_threads and num_threads round trip") {
  ThreadCountRestorer restore;
  set_num_threads(3);
  CHECK(num_threads() == 3);
  set_num_threads(1);
  CHECK(num_threads() == 1);
  set_num_threads(0);  // "at least 1"
  CHECK(num_threads() >= 1);
}

TEST_CASE("default_num_threads: MPIGRAD_NUM_THREADS wins, else the cores of the affinity mask") {
  CleanThreadEnvironment clean;
  const std::vector<int> cpus = affinity_cpus();
  REQUIRE(!cpus.empty());
  CHECK(std::is_sorted(cpus.begin(), cpus.end()));
  const int alone = default_num_threads();
  CHECK(alone == int(cpus.size()));
  CHECK(default_thread_choice().source == std::to_string(cpus.size()) +
                                              (cpus.size() == 1 ? " core" : " cores") +
                                              " in the affinity mask");

  // A launcher's rank counts are not read: the ranks sharing a node come from MPI
  // (DistributedManager), which srun -n N informs where its variables do not.
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  setenv("SLURM_NTASKS_PER_NODE", "2", 1);
  CHECK(default_num_threads() == alone);

  setenv("MPIGRAD_NUM_THREADS", "3", 1);
  CHECK(default_num_threads() == 3);  // an explicit count overrides the mask
  CHECK(default_thread_choice(0.5, "half a core").threads == 3);
  CHECK(default_thread_choice(0.5, "half a core").source == "MPIGRAD_NUM_THREADS");
  unsetenv("MPIGRAD_NUM_THREADS");
  CHECK(default_thread_choice(0.5, "half a core").threads == 1);  // at least one
  CHECK(default_thread_choice(2.0 / 3 * 3, "two").threads == 2);
  CHECK(default_num_threads() == alone);
}

TEST_CASE("core_share: each CPU of the mask counts 1/n for the n masks that hold it") {
  // --bind-to core: disjoint masks, every core is this rank's own.
  CHECK(core_share({0}, {{0}, {1}}) == 1.0);
  CHECK(core_share({0, 1}, {{0, 1}, {2, 3}}) == 2.0);
  // No binding: every rank may run on every core, so they divide them.
  CHECK(core_share({0, 1}, {{0, 1}, {0, 1}}) == 1.0);
  CHECK(core_share({0, 1, 2, 3}, {{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}}) ==
        doctest::Approx(4.0 / 3));
  // Two ranks bound to a socket of 4 cores each, a third on both sockets.
  CHECK(core_share({0, 1, 2, 3}, {{0, 1, 2, 3}, {4, 5, 6, 7}, {0, 1, 2, 3, 4, 5, 6, 7}}) == 2.0);
  // A mask the list lacks (the caller's own, say) counts alone.
  CHECK(core_share({5}, {{0}}) == 1.0);
}

TEST_CASE("a count chosen with set_num_threads is never replaced by a default") {
  ThreadCountRestorer restore;
  set_num_threads(3);
  ThreadChoice in_effect = apply_default_threads({1, "a default"});
  CHECK(in_effect.threads == 3);
  CHECK(in_effect.source == "set_num_threads");
  CHECK(num_threads() == 3);
  initialize_cpu_runtime();
  CHECK(num_threads() == 3);
  CHECK(thread_choice().source == "set_num_threads");
}

TEST_CASE("results are identical with 1 and 4 threads") {
  ThreadCountRestorer restore;
  Generator generator(31337);
  // Large enough that every kernel splits the work across threads.
  Tensor x = randn({1 << 20}, generator);
  Tensor y = randn({1 << 20}, generator);
  Tensor rows = randn({512, 1024}, generator);

  auto compute = [&] {
    std::vector<std::vector<float>> results;
    results.push_back(sum(x).to_vector<float>());
    results.push_back(mean(x * y).to_vector<float>());
    results.push_back(max(x).to_vector<float>());
    results.push_back(sum(rows, {0}).to_vector<float>());
    results.push_back(sum(rows, {1}).to_vector<float>());
    results.push_back(var(rows, {1}).to_vector<float>());
    results.push_back((exp(x) * y + tanh(y)).to_vector<float>());
    results.push_back(softmax(rows, 1).to_vector<float>());
    return results;
  };
  set_num_threads(1);
  const auto serial = compute();
  set_num_threads(4);
  const auto parallel = compute();
  REQUIRE(serial.size() == parallel.size());
  for (size_t i = 0; i < serial.size(); ++i) {
    INFO("result ", i);
    CHECK(serial[i] == parallel[i]);
  }
  // A float32 sum of a million standard normals: the double accumulator keeps it exact enough
  // that it agrees with a host-side double sum to float precision.
  double host_sum = 0.0;
  for (float v : x.to_vector<float>()) host_sum += v;
  CHECK(std::abs(serial[0][0] - host_sum) <= 1e-3 + 1e-6 * std::abs(host_sum));
}

TEST_CASE("a large matmul cut into a block per thread equals the product on one thread") {
  ThreadCountRestorer restore;
  Generator generator(7);
  // Tall (cut by rows) and wide (cut by columns) products, each with A or B stored transposed,
  // over OpenBLAS's single-thread threshold, with sizes that do not divide evenly.
  const Tensor tall = randn({517, 300}, generator), wide = randn({37, 300}, generator);
  const Tensor right = randn({300, 1031}, generator), narrow = randn({300, 45}, generator);
  auto compute = [&] {
    std::vector<std::vector<float>> results;
    results.push_back(matmul(tall, narrow).to_vector<float>());
    results.push_back(matmul(tall.t().contiguous().t(), narrow).to_vector<float>());
    results.push_back(matmul(wide, right).to_vector<float>());
    results.push_back(matmul(wide, right.t().contiguous().t()).to_vector<float>());
    // A batch of fewer large entries than threads: each entry is cut up.
    results.push_back(matmul(stack({tall, tall * 2.0}), narrow).to_vector<float>());
    return results;
  };
  set_num_threads(1);
  const auto serial = compute();
  set_num_threads(4);
  const auto parallel = compute();
  REQUIRE(serial.size() == parallel.size());
  for (size_t i = 0; i < serial.size(); ++i) {
    INFO("product ", i);
    CHECK(serial[i] == parallel[i]);
  }
  // And the product is right: one element against a double dot product.
  double dot = 0;
  const std::vector<float> a = tall.to_vector<float>(), b = narrow.to_vector<float>();
  for (int64_t k = 0; k < 300; ++k)
    dot += double(a[size_t(516 * 300 + k)]) * b[size_t(k * 45 + 44)];
  CHECK(serial[0][size_t(516 * 45 + 44)] == doctest::Approx(dot).epsilon(1e-4));
}

TEST_CASE("OpenMP's wait: a short spin on free cores, passive when oversubscribed or loaded") {
  const std::string spin = std::to_string(kOpenMPShortSpin);
  // The idle 2-core VM, 2 threads: free, so spin.
  OpenMPWaitChoice idle = choose_openmp_wait({2, 1, 2, 0.05, 2});
  CHECK(idle.variable == "GOMP_SPINCOUNT");
  CHECK(idle.value == spin);
  CHECK(idle.reason == "2 threads x 1 rank on 2 CPUs, other load 0.05: cores free");
  // More threads than CPUs: passive whatever the load.
  OpenMPWaitChoice over = choose_openmp_wait({2, 2, 2, 0.0, 2});
  CHECK(over.variable == "OMP_WAIT_POLICY");
  CHECK(over.value == "passive");
  CHECK(over.reason == "2 threads x 2 ranks on 2 CPUs: oversubscribed");
  CHECK(choose_openmp_wait({4, 1, 2, 0.0, 1}).value == "passive");
  // The loaded VM (load 8-9, tasks runnable now): passive.
  OpenMPWaitChoice loaded = choose_openmp_wait({2, 1, 2, 8.5, 10});
  CHECK(loaded.value == "passive");
  CHECK(loaded.reason == "2 threads x 1 rank on 2 CPUs, other load 8.50: cores busy");
  // One other task on the cores we need: busy. Half a core of it: still free.
  CHECK(choose_openmp_wait({2, 1, 2, 1.0, 2}).value == "passive");
  CHECK(choose_openmp_wait({2, 1, 2, 0.5, 2}).value == spin);
  // Room left by our threads takes other load: 8 of 16 CPUs used, 7 others running.
  CHECK(choose_openmp_wait({4, 2, 16, 7.0, 9}).value == spin);
  CHECK(choose_openmp_wait({4, 2, 16, 9.0, 11}).value == "passive");
  // A job that just ended weighs on the average but runs no more: only our own ranks run now.
  OpenMPWaitChoice after = choose_openmp_wait({2, 1, 2, 1.6, 1});
  CHECK(after.value == spin);
  CHECK(after.reason.find("other load 0.00") != std::string::npos);
  // A burst of tasks now on a quiet average: the average decides.
  CHECK(choose_openmp_wait({2, 1, 2, 0.1, 6}).value == spin);
  // A load average near 1 on CPUs that were idle while observed (a VM's): free. CPUs that
  // were busy: the average decides.
  CHECK(choose_openmp_wait({2, 1, 2, 0.9, 2, 0.02}).value == spin);
  CHECK(choose_openmp_wait({2, 1, 2, 0.9, 2, 0.02}).reason.find("other load 0.02") !=
        std::string::npos);
  CHECK(choose_openmp_wait({2, 1, 2, 1.0, 2, 1.0}).value == "passive");
  CHECK(choose_openmp_wait({2, 1, 2, 8.5, 10, 2.0}).value == "passive");
  // Without /proc/loadavg, or without its running count.
  CHECK(choose_openmp_wait({2, 1, 2, -1, -1}).reason ==
        "2 threads x 1 rank on 2 CPUs, load unknown");
  CHECK(choose_openmp_wait({2, 1, 2, -1, -1}).value == "passive");
  CHECK(choose_openmp_wait({2, 1, 2, 0.2, -1}).value == spin);
  CHECK(choose_openmp_wait({2, 1, 2, 3.0, -1}).value == "passive");
}

TEST_CASE("OpenMP's wait: the runnable count is the median of the snapshots") {
  CHECK(runnable_from_readings({}) == -1);
  CHECK(runnable_from_readings({3}) == 3);
  CHECK(runnable_from_readings({1, 1, 5, 1, 1}) == 1);  // one kernel thread's instant
  CHECK(runnable_from_readings({4, 0, 4, 4, 3}) == 4);  // one idle instant of a busy node
  CHECK(runnable_from_readings({2, 9, 1, 7, 5}) == 5);
}

TEST_CASE("OpenMP's wait: busy CPUs between two /proc/stat readings") {
  CHECK(busy_cpus_between(100, 1000, 150, 1100, 2) == doctest::Approx(1.0));
  CHECK(busy_cpus_between(100, 1000, 100, 1000, 2) == -1);  // no time passed
  CHECK(busy_cpus_between(100, 1000, 100, 990, 2) == -1);   // went back: unknown
  // This process's own ticks, taken out of busy, grew faster than the node's: idle, not 5e18.
  CHECK(busy_cpus_between(500, 1000, 497, 1100, 2) == 0);
  CHECK(busy_cpus_between(100, 1000, 400, 1100, 2) == 2);  // more than all: capped
}

TEST_CASE("OpenMP's wait: the node as seen from the environment, mask and /proc/loadavg") {
  CleanThreadEnvironment clean;
  const int cpus = int(affinity_cpus().size());
  NodeLoad alone = observe_node_load();
  CHECK(alone.cpus == cpus);
  CHECK(alone.ranks_on_node == 1);
  CHECK(alone.threads_per_rank == cpus);
  CHECK(alone.load_average >= 0);
  CHECK(alone.running_now >= 1);  // this process runs
  CHECK(alone.busy_cpus >= 0);
  CHECK(alone.busy_cpus <= double(std::thread::hardware_concurrency()) + 0.01);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  CHECK(observe_node_load().ranks_on_node == 2);
  CHECK(observe_node_load().threads_per_rank == std::max(1, cpus / 2));
  unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  setenv("MPI_LOCALNRANKS", "3", 1);
  CHECK(observe_node_load().ranks_on_node == 3);
  setenv("MPIGRAD_NUM_THREADS", "5", 1);
  CHECK(observe_node_load().threads_per_rank == 5);
}

TEST_CASE("OpenMP's wait: the log says what is set and who chose it") {
  constexpr const char* kNames[] = {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MPIGRAD_OPENMP_WAIT"};
  std::vector<std::optional<std::string>> saved;
  for (const char* name : kNames) {
    const char* value = std::getenv(name);
    saved.push_back(value ? std::optional<std::string>(value) : std::nullopt);
    unsetenv(name);
  }
  CHECK(openmp_wait_description() == "the OpenMP runtime's default (nothing set)");
  setenv("GOMP_SPINCOUNT", "7", 1);
  CHECK(openmp_wait_description() == "GOMP_SPINCOUNT=7 (set by the user)");
  // What apply_openmp_wait_defaults chose, while the variable still holds it.
  setenv("MPIGRAD_OPENMP_WAIT", "GOMP_SPINCOUNT=7 (1 thread x 1 rank on 1 CPU: cores free)", 1);
  CHECK(openmp_wait_description() == "GOMP_SPINCOUNT=7 (1 thread x 1 rank on 1 CPU: cores free)");
  setenv("GOMP_SPINCOUNT", "8", 1);
  CHECK(openmp_wait_description() == "GOMP_SPINCOUNT=8 (set by the user)");
  setenv("OMP_WAIT_POLICY", "active", 1);
  CHECK(openmp_wait_description() == "OMP_WAIT_POLICY=active GOMP_SPINCOUNT=8 (set by the user)");
  for (size_t i = 0; i < saved.size(); ++i) {
    if (saved[i]) {
      setenv(kNames[i], saved[i]->c_str(), 1);
    } else {
      unsetenv(kNames[i]);
    }
  }
}

#if defined(MPIGRAD_OPENMP_SPIN_PROBE)
namespace {

// The probe's output ("<spin count the runtime uses> <OMP_WAIT_POLICY> <GOMP_SPINCOUNT>") under
// `environment` (arguments to env(1)).
std::string run_probe(const std::string& environment) {
  const std::string command =
      "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u MPIGRAD_NUM_THREADS -u MPIGRAD_OPENMP_WAIT "
      "-u OMPI_COMM_WORLD_LOCAL_SIZE -u MPI_LOCALNRANKS " +
      environment + " " MPIGRAD_OPENMP_SPIN_PROBE;
  std::FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[256] = {};
  std::string out;
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) out += buffer;
  CHECK(pclose(pipe) == 0);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

TEST_CASE("OpenMP's wait policy: chosen unless the user chose one, set before the runtime starts") {
  // Oversubscribed (2 threads x 64 ranks): passive, no spinning, not libgomp's 300000.
  CHECK(run_probe("MPIGRAD_NUM_THREADS=2 OMPI_COMM_WORLD_LOCAL_SIZE=64") == "0 passive unset");
  // Alone, the choice depends on the machine's load now; the runtime runs with whichever was set.
  const std::string chosen = run_probe("MPIGRAD_NUM_THREADS=2 OMPI_COMM_WORLD_LOCAL_SIZE=1");
  const std::string spin = std::to_string(kOpenMPShortSpin);
  CHECK((chosen == "0 passive unset" || chosen == spin + " unset " + spin));
  // The user's choice stays, either variable.
  CHECK(run_probe("MPIGRAD_NUM_THREADS=2 GOMP_SPINCOUNT=7") == "7 unset 7");
  const std::string active = run_probe("MPIGRAD_NUM_THREADS=2 OMP_WAIT_POLICY=active");
  CHECK(active.substr(active.find(' ')) == " active unset");
  CHECK(active.substr(0, active.find(' ')) != "0");
  // One thread has nothing to spin: the program is not started again.
  const std::string alone = run_probe("MPIGRAD_NUM_THREADS=1");
  CHECK(alone.substr(alone.find(' ')) == " unset unset");
  CHECK(alone.substr(0, alone.find(' ')) != "0");
  // Why the program must execute itself again: a variable set in the running process is never
  // read, the runtime having read its environment when it was loaded.
  const long before = openmp_spin_count();
  REQUIRE(before >= 0);
  const char* previous = std::getenv("GOMP_SPINCOUNT");
  const std::string saved = previous ? previous : "";
  setenv("GOMP_SPINCOUNT", std::to_string(before + 12345).c_str(), 1);
  CHECK(openmp_spin_count() == before);
  if (previous) {
    setenv("GOMP_SPINCOUNT", saved.c_str(), 1);
  } else {
    unsetenv("GOMP_SPINCOUNT");
  }
}
#endif
