// Overlap: start an async all-reduce, compute, then wait. Checks the result; also prints how
// long communication, compute, and both together took with and without polling test() from the
// compute loop (the measurement behind MpiCommunicator's progress choice; no timing assertion).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/job/distributed_manager.h"

using namespace mpigrad;

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Stand-in for backward: `chunks` slices of arithmetic over a private buffer, calling `poll`
// between slices.
template <typename Poll>
double compute(std::vector<float>& scratch, int chunks, Poll poll) {
  double sink = 0;
  for (int c = 0; c < chunks; ++c) {
    for (float& x : scratch) x = x * 0.999f + 0.5f;
    sink += scratch[size_t(c) % scratch.size()];
    poll();
  }
  return sink;
}
}  // namespace

TEST_CASE("async all_reduce overlaps with compute and gives the right answer") {
  auto manager = launch::DistributedManager::initialize();
  launch::Communicator& world = manager.world();
  const int64_t n = int64_t(1) << 22;  // 16 MiB of float32
  std::vector<float> scratch(1 << 16, 1.0f);
  auto fresh = [&] { return core::full({n}, double(world.rank() + 1), core::kFloat32); };
  const float expected = float(world.size() * (world.size() + 1) / 2);

  world.barrier();
  core::Tensor warm = fresh();
  world.all_reduce(warm);
  auto start = std::chrono::steady_clock::now();
  core::Tensor alone = fresh();
  world.all_reduce(alone);
  double comm_s = seconds_since(start);

  // Calibrate the compute to about the communication time.
  start = std::chrono::steady_clock::now();
  compute(scratch, 20, [] {});
  double chunk_s = seconds_since(start) / 20;
  int chunks = std::max(4, int(comm_s / chunk_s));
  start = std::chrono::steady_clock::now();
  compute(scratch, chunks, [] {});
  double compute_s = seconds_since(start);

  double overlapped_s[2] = {0, 0};
  for (int polling = 0; polling < 2; ++polling) {
    core::Tensor tensor = fresh();
    world.barrier();
    start = std::chrono::steady_clock::now();
    launch::WorkPtr work = world.all_reduce_async(tensor);
    compute(scratch, chunks, [&] {
      if (polling) work->test();
    });
    work->wait();
    overlapped_s[polling] = seconds_since(start);
    std::vector<float> values = tensor.to_vector<float>();
    CHECK(values.front() == expected);
    CHECK(values.back() == expected);
  }
  if (world.rank() == 0) {
    std::printf(
        "[overlap] np %d, 16 MiB all_reduce: comm %.2f ms, compute %.2f ms, async+compute "
        "without polling %.2f ms, with polling %.2f ms (sequential would be %.2f ms)\n",
        world.size(), comm_s * 1e3, compute_s * 1e3, overlapped_s[0] * 1e3, overlapped_s[1] * 1e3,
        (comm_s + compute_s) * 1e3);
    std::fflush(stdout);
  }
}
