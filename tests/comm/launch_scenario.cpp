// Whole-job scenarios for check_failure.sh: programs that start MPI themselves (no doctest
// runner) and end in a given way.
//   own:    initialize() starts MPI, checks what it reports, all-reduces, finalizes; exit 0.
//   sleep:  rank 1 sleeps past the collective timeout while the others wait in an all-reduce.
//   throw:  rank 1 throws an uncaught exception while the others wait.
//   return: rank 1 catches its error, prints it and returns 1 from main while the others wait.
//   die:    rank 1 is killed (SIGKILL) while the others wait: the report calls it gone, with its
//           host, and the job ends non-zero, also under mpirun --enable-recovery.
//   loop SECONDS: every rank all-reduces every 10 ms for SECONDS, then exits 0 (run through
//           scripts/cluster-sim.sh --partition-after, the network goes away meanwhile).
//   sleep-split: as sleep, but in an all-reduce over the odd ranks (np 4: ranks 1 and 3, which
//           are ranks 0 and 1 of that communicator): the report must name world ranks.
//   elsewhere-sleep, elsewhere-die (np 4): rank 0 waits in an all-reduce over the world while
//           the others are blocked on other communicators: rank 1 in the odd ranks' (1, 3),
//           rank 2 in its pair's (2, 3), both waiting for rank 3, which sleeps or is killed.
//           Rank 0's report must say where each of them waits, and for whom.
//   queued-stuck (np 2): rank 0's watchdog watches a stand-in for a GPU stream whose collective
//           #0 never completes (as NCCL's would when a peer withholds its part), while rank 1
//           sleeps: the report must say "on the GPU", name rank 1, and call the stand-in's abort
//           before ending the job. The GPU path of the watchdog, checked where there is no GPU.
//   crossed (np 2): rank 0 waits in an all-reduce over the world, rank 1 in a barrier over
//           another communicator of both: each waits for the other, and the report says so.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/comm/collective_watchdog.h"
#include "mpigrad/launch/comm/mpi_communicator.h"
#include "mpigrad/launch/comm/mpi_handle.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/observe/rank_logging.h"

using namespace mpigrad;

namespace {

void announce_collective_start(const launch::DistributedManager& manager) {
  if (!manager.is_main_process()) return;
  auto now = std::chrono::system_clock::now().time_since_epoch();
  std::printf(
      "collective starts at %lld\n",
      static_cast<long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()));
  std::fflush(stdout);
}

int own(int argc, char** argv) {
  auto manager = launch::DistributedManager::initialize(&argc, &argv);
  launch::RankLogger log(manager.rank(), manager.world_size());
  log.info(manager.describe());
  if (!manager.owns_mpi()) {
    log.error("initialize() did not start MPI although nothing had");
    return 1;
  }
  core::Tensor value = core::Tensor::from_vector<float>({float(manager.rank() + 1)}, {1});
  manager.world().all_reduce(value);
  float expected = float(manager.world_size() * (manager.world_size() + 1) / 2);
  if (value.item<float>() != expected) {
    log.error("all_reduce gave " + std::to_string(value.item<float>()) + ", expected " +
              std::to_string(expected));
    return 1;
  }
  manager.finalize();
  return 0;
}

int fail_on_rank_1(int argc, char** argv, const std::string& mode) {
  auto manager = launch::DistributedManager::initialize(&argc, &argv);
  core::Tensor value = core::Tensor::from_vector<float>({1.0f}, {1});
  manager.world().barrier();
  announce_collective_start(manager);
  if (manager.rank() == 1) {
    if (mode == "die") {
      std::raise(SIGKILL);
    } else if (mode == "sleep") {
      double timeout = manager.collective_config().timeout_seconds;
      std::this_thread::sleep_for(std::chrono::duration<double>(timeout * 5));
    } else if (mode == "throw") {
      throw std::runtime_error("rank 1 throws on purpose");
    } else {
      try {
        throw std::runtime_error("rank 1 fails on purpose");
      } catch (const std::exception& error) {
        launch::RankLogger(manager.rank(), manager.world_size()).error(error.what());
        return 1;
      }
    }
  }
  manager.world().all_reduce(value);
  return 0;
}

// Rank 3 waits for rank 1 in the odd ranks' communicator; the even ranks finish theirs and
// wait in MPI_Finalize, where no watchdog runs, so the odd group's report is the one printed.
int sleep_in_split(int argc, char** argv) {
  auto manager = launch::DistributedManager::initialize(&argc, &argv);
  const int rank = manager.rank();
  auto parity = manager.world().split(rank % 2, rank, rank % 2 ? "odd" : "even");
  core::Tensor value = core::Tensor::from_vector<float>({1.0f}, {1});
  manager.world().barrier();
  announce_collective_start(manager);
  if (rank == 1) {
    double timeout = manager.collective_config().timeout_seconds;
    std::this_thread::sleep_for(std::chrono::duration<double>(timeout * 5));
  }
  parity->all_reduce(value);
  return 0;
}

// Ranks 1 and 2 block a moment after rank 0, so that rank 0's watchdog fires first and its
// report is the one the test reads (the others' come half a second later, if at all).
void after_rank_0(const launch::DistributedManager& manager) {
  if (manager.rank() == 0) return;
  std::this_thread::sleep_for(
      std::chrono::duration<double>(manager.collective_config().timeout_seconds * 0.25));
}

int waiting_elsewhere(int argc, char** argv, bool die) {
  auto manager = launch::DistributedManager::initialize(&argc, &argv);
  const int rank = manager.rank();
  auto odd_or_even = manager.world().split(rank % 2, rank, rank % 2 ? "odd" : "even");
  auto pair = manager.world().split(rank / 2, rank, "pair " + std::to_string(rank / 2));
  core::Tensor value = core::Tensor::from_vector<float>({1.0f}, {1});
  manager.world().barrier();
  announce_collective_start(manager);
  after_rank_0(manager);
  if (rank == 0) manager.world().all_reduce(value);
  if (rank == 1) odd_or_even->all_reduce(value);
  if (rank == 2) pair->all_reduce(value);
  if (rank == 3) {
    if (die) std::raise(SIGKILL);
    double timeout = manager.collective_config().timeout_seconds;
    std::this_thread::sleep_for(std::chrono::duration<double>(timeout * 5));
  }
  return 0;
}

int crossed(int argc, char** argv) {
  auto manager = launch::DistributedManager::initialize(&argc, &argv);
  auto side = manager.world().split(0, manager.rank(), "side");
  core::Tensor value = core::Tensor::from_vector<float>({1.0f}, {1});
  manager.world().barrier();
  announce_collective_start(manager);
  after_rank_0(manager);
  if (manager.rank() == 0) {
    manager.world().all_reduce(value);
  } else {
    side->barrier();
  }
  return 0;
}

// A GPU stream whose collective #0 never completes.
class StuckQueue final : public launch::QueuedCollectives {
 public:
  bool oldest_pending(Pending& pending) override {
    pending.sequence = 0;
    pending.op = "all_reduce";
    pending.bytes = 4;
    pending.error = "the stand-in's asynchronous error";
    return true;
  }
  void abort() override {
    std::fprintf(stderr, "the stand-in's abort was called\n");
    std::fflush(stderr);
  }
  const char* abort_call() const override { return "the stand-in's abort"; }
};

int queued_stuck(int argc, char** argv) {
  auto manager = launch::DistributedManager::initialize(&argc, &argv);
  const auto& world = dynamic_cast<launch::MpiCommunicator&>(manager.world());
  launch::MpiCommHandle control =
      launch::duplicate_communicator(world.handle().comm, "the stand-in's control communicator");
  launch::CollectiveWatchdog watchdog(control, "stand-in", world.world_ranks(),
                                      manager.collective_config().timeout_seconds, true);
  StuckQueue stuck;
  manager.world().barrier();
  announce_collective_start(manager);
  if (manager.rank() == 0) {
    (void)watchdog.next_sequence();  // collective #0, queued and never complete
    watchdog.watch_queued(&stuck);
  }
  const double timeout = manager.collective_config().timeout_seconds;
  std::this_thread::sleep_for(std::chrono::duration<double>(timeout * 5));
  if (manager.rank() == 0) watchdog.watch_queued(nullptr);
  return 0;
}

int loop(int argc, char** argv, double seconds) {
  auto manager = launch::DistributedManager::initialize(&argc, &argv);
  core::Tensor value = core::Tensor::from_vector<float>({1.0f}, {1});
  announce_collective_start(manager);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    manager.world().all_reduce(value);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "own") return own(argc, argv);
  if (mode == "sleep" || mode == "throw" || mode == "return" || mode == "die")
    return fail_on_rank_1(argc, argv, mode);
  if (mode == "sleep-split") return sleep_in_split(argc, argv);
  if (mode == "elsewhere-sleep" || mode == "elsewhere-die")
    return waiting_elsewhere(argc, argv, mode == "elsewhere-die");
  if (mode == "crossed") return crossed(argc, argv);
  if (mode == "queued-stuck") return queued_stuck(argc, argv);
  if (mode == "loop" && argc > 2) return loop(argc, argv, std::atof(argv[2]));
  std::fprintf(
      stderr,
      "usage: %s own|sleep|sleep-split|elsewhere-sleep|elsewhere-die|crossed|queued-stuck|throw|"
      "return|die|"
      "loop SECONDS\n",
      argv[0]);
  return 2;
}
