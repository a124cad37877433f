// Thread control: the explicit setting, the launcher-aware default, and that results do not
// depend on how many threads computed them (a run must reproduce on a node of another size).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/linalg.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/ops/softmax.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/core/threads.h"

namespace {

using namespace mpigrad::core;  // NOLINT

// The variables default_num_threads may read; each test starts from none of them set and puts
// back whatever the surrounding environment had.
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

TEST_CASE("default_num_threads: MPIGRAD_NUM_THREADS wins, else cores / ranks on the node") {
  CleanThreadEnvironment clean;
  const int alone = default_num_threads();
  CHECK(alone >= 1);
  CHECK(alone <= int(std::max(1u, std::thread::hardware_concurrency())));

  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  CHECK(default_num_threads() == std::max(1, alone / 2));
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "100000", 1);
  CHECK(default_num_threads() == 1);  // more ranks than cores still leaves one thread each

  setenv("MPIGRAD_NUM_THREADS", "3", 1);
  CHECK(default_num_threads() == 3);  // an explicit count overrides the division
  unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  setenv("MPIGRAD_NUM_THREADS", "5", 1);
  CHECK(default_num_threads() == 5);

  unsetenv("MPIGRAD_NUM_THREADS");
  CHECK(default_num_threads() == alone);
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
