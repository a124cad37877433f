// The NCCL collective timeout, as a whole job (`mpigrad-test-nccl withhold-rank-1` under mpirun
// with 2 ranks, each with its own GPU; tests/comm/nccl/CMakeLists.txt checks how it ends).
//
// Rank 1 withholds its part of an all-reduce: it sleeps for five timeouts. Rank 0 queues the
// all-reduce, which returns at once (NCCL collectives are stream-ordered), and then waits for the
// result on the host, outside any communicator call. Its watchdog must see the all-reduce pending
// on the GPU past the timeout, report rank 1 as not arrived, abort the NCCL communicator and end
// the job with a non-zero exit; the job must not hang.
#include <chrono>
#include <cstdio>
#include <exception>
#include <thread>

#include "mpigrad/core/cuda.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "nccl_test.h"

namespace mpigrad::test {

int withhold_rank_1() {
  auto manager = launch::DistributedManager::initialize();
  if (manager.world_size() != 2) {
    std::fprintf(stderr, "withhold-rank-1 needs 2 ranks, not %d\n", manager.world_size());
    return 2;
  }
  const core::Device device = core::cuda(manager.local_rank() % core::cuda_device_count());
  auto nccl = launch::create_communicator(manager, launch::Backend::Nccl, device, "nccl world");
  core::Tensor value = core::Tensor::from_vector<float>({1.0f}, {1}).to(device);
  nccl->all_reduce(value);  // one that completes: the communicator works
  const float sum = value.to(core::kCPU).item<float>();
  if (sum != 2.0f) {
    std::fprintf(stderr, "the first all-reduce gave %g, expected 2\n", double(sum));
    return 1;
  }
  manager.world().barrier();
  const double timeout = manager.collective_config().timeout_seconds;
  if (manager.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::duration<double>(timeout * 5));
    return 0;
  }
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  std::printf(
      "collective starts at %lld\n",
      static_cast<long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()));
  std::fflush(stdout);
  nccl->all_reduce(value);
  try {
    (void)value.to(core::kCPU);  // blocks until the all-reduce completes, or is aborted
  } catch (const std::exception&) {
    // The aborted all-reduce may fail the copy; the watchdog's report is what this job is about.
  }
  // Aborted: the watchdog ends the job within moments. Still here much later means it did not.
  std::this_thread::sleep_for(std::chrono::duration<double>(timeout * 3));
  std::fprintf(stderr, "the job was not ended although rank 1 withheld its part\n");
  return 1;
}

}  // namespace mpigrad::test
