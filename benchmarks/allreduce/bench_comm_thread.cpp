// mpigrad-bench-comm-thread: how fast a communication thread moves data while the rank's cores
// compute, at each thread priority. This is the measurement behind HierarchicalAllReduce's
// communication thread (launch/ddp/transports/hierarchical_all_reduce.h, "How the thread
// waits"). Run it across nodes, one rank per node, over a real link:
//   scripts/cluster-sim.sh --nodes 2 --ranks-per-node 1 --rate 2gbit -- mpigrad-bench-comm-thread
//
// Each rank runs, on a second thread, `pieces` all-reduces (sum) of `piece` elements on a
// communicator split off the world, each started nonblocking and waited for as that transport
// does (Work::wait_sleeping), with the thread at each nice value in turn. It does so with
// nothing beside it, and with `busy` threads (default: as many as the rank has cores) spinning
// on arithmetic beside it, as backward keeps a rank's cores busy. It prints the time per batch
// of pieces, the best of --repeats, and the rate. A nice value below the process's own needs
// root, CAP_SYS_NICE or RLIMIT_NICE: the line says which value the thread really got.
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/bench_util.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/job/distributed_manager.h"

using namespace mpigrad;

namespace {

struct Options {
  std::vector<int> nice{-20, -10, 0, 19};
  int pieces = 36;
  int64_t piece = 256 * 1024;  // elements: 1 MiB of float32, as the transport's pieces
  int busy = -1;               // busy threads per rank; -1: the cores this rank may use
  int repeats = 2;
  std::string json;
};

// `text` as a whole integer in [low, high], or an error naming `option`.
int64_t integer(const std::string& option, const std::string& text, int64_t low, int64_t high) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  MPIGRAD_CHECK(used > 0 && used == text.size() && value >= low && value <= high, option, " '",
                text, "' must be a whole number from ", low, " to ", high);
  return value;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      MPIGRAD_CHECK(i + 1 < argc, arg, " needs a value");
      return argv[++i];
    };
    if (arg == "--nice") {
      o.nice.clear();
      std::stringstream list(value());
      for (std::string item; std::getline(list, item, ',');) {
        o.nice.push_back(int(integer(arg, item, -20, 19)));
      }
      MPIGRAD_CHECK(!o.nice.empty(), arg, " needs at least one nice value");
    } else if (arg == "--pieces") {
      o.pieces = int(integer(arg, value(), 1, 1 << 20));
    } else if (arg == "--piece") {
      o.piece = integer(arg, value(), 1, int64_t(1) << 32);
    } else if (arg == "--busy") {
      o.busy = int(integer(arg, value(), 0, 1024));
    } else if (arg == "--repeats") {
      o.repeats = int(integer(arg, value(), 1, 1000));
    } else if (arg == "--json") {
      o.json = value();
    } else {
      std::printf(
          "usage: %s [--nice -20,-10,0,19] [--pieces 36] [--piece 262144] [--busy N] "
          "[--repeats 2] [--json FILE]\n",
          argv[0]);
      std::exit(arg == "--help" || arg == "-h" ? 0 : 2);
    }
  }
  return o;
}

int cores_of_this_process() {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
}

int run(int argc, char** argv) {
  const Options options = parse(argc, argv);
  auto manager = launch::DistributedManager::initialize(&argc, &argv);
  launch::Communicator& world = manager.world();
  std::unique_ptr<launch::Communicator> link = world.split(0, world.rank(), "comm thread");
  const int busy = options.busy >= 0 ? options.busy : cores_of_this_process();
  bench::Results results;
  results.add("ranks", world.size(), "ranks");
  results.add("busy_threads_per_rank", busy, "threads");
  results.add("pieces", options.pieces, "all-reduces", "per timed batch");
  for (core::DType dtype : {core::kFloat32, core::kBFloat16}) {
    const core::Tensor values = core::zeros({options.piece}).to(dtype);
    const double bytes = double(options.pieces) * double(values.nbytes());
    for (int beside : {0, busy}) {
      for (int nice : options.nice) {
        double best = 1e30;
        int got = 0;
        for (int repeat = 0; repeat < options.repeats; ++repeat) {
          world.barrier();
          std::atomic<bool> stop{false};
          std::vector<std::thread> spinners;
          for (int t = 0; t < beside; ++t) {
            spinners.emplace_back([&stop] {
              volatile double x = 1;
              while (!stop.load(std::memory_order_relaxed)) x = x * 1.0000001 + 1e-9;
            });
          }
          double seconds = 0;
          std::thread communicating([&] {
            const id_t tid = id_t(syscall(SYS_gettid));
            (void)setpriority(PRIO_PROCESS, tid, nice);
            errno = 0;
            got = getpriority(PRIO_PROCESS, tid);
            const auto begin = std::chrono::steady_clock::now();
            for (int p = 0; p < options.pieces; ++p) {
              link->all_reduce_async(values, launch::ReduceOp::Sum)->wait_sleeping();
            }
            seconds =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
          });
          communicating.join();
          stop = true;
          for (std::thread& spinner : spinners) spinner.join();
          core::Tensor slowest = core::full({1}, seconds, core::kFloat64);
          world.all_reduce(slowest, launch::ReduceOp::Max);
          best = std::min(best, slowest.item<double>());
        }
        const std::string key = std::string(core::dtype_name(dtype)) + "_busy" +
                                std::to_string(beside) + "_nice" + std::to_string(nice);
        results.add(key + "_ms", best * 1e3, "ms",
                    "thread at nice " + std::to_string(got) + ", " + std::to_string(beside) +
                        " busy threads beside it");
        results.add(key + "_mb_per_s", bytes / best / 1e6, "MB/s");
      }
    }
  }
  if (!manager.is_main_process()) return 0;
  return results.report(options.json, "mpigrad-bench-comm-thread");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "mpigrad-bench-comm-thread: %s\n", error.what());
    return 1;
  }
}
