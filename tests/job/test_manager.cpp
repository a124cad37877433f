// DistributedManager (attach, topology, device, launcher), adoption of a host communicator,
// backend selection, argument errors, MPIGRAD_DEBUG_COLLECTIVES mismatches, and the helpers.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>

#include "mpigrad/core/cuda.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/comm/mpi_communicator.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/mpi_interop.h"
#include "mpigrad/launch/observe/rank_logging.h"

using namespace mpigrad;

namespace {
int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}
}  // namespace

TEST_CASE("initialize() attaches to an MPI it did not start and reports the topology") {
  // The doctest runner called MPI_Init_thread, so the manager must not own MPI.
  auto manager = launch::DistributedManager::initialize();
  CHECK_FALSE(manager.owns_mpi());
  CHECK(manager.rank() == world_rank());
  CHECK(manager.world_size() == world_size());
  CHECK(manager.is_main_process() == (world_rank() == 0));
  // One machine: everyone shares the node.
  CHECK(manager.node_count() == 1);
  CHECK(manager.local_size() == world_size());
  CHECK(manager.local_rank() == world_rank());
  // The CPU, or with a visible GPU (CUDA builds) cuda(local_rank % device_count).
  const int gpus = core::cuda_device_count();
  CHECK(manager.device() == (gpus > 0 ? core::cuda(manager.local_rank() % gpus) : core::kCPU));
  manager.set_device(core::kCPU);
  CHECK(manager.thread_level() == launch::ThreadLevel::Multiple);
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) {
    CHECK(manager.launcher() == launch::Launcher::OpenMpi);
  } else {
    // A plain ./program: a world of size 1.
    CHECK(manager.launcher() == launch::Launcher::SingleProcess);
    CHECK(manager.world_size() == 1);
  }
  std::string line = manager.describe();
  CHECK(line.find("rank " + std::to_string(world_rank())) == 0);
  CHECK(line.find("adopted MPI") != std::string::npos);

  // The world is a duplicate, never MPI_COMM_WORLD itself.
  int compare = MPI_UNEQUAL;
  MPI_Comm_compare(launch::native_communicator(manager.world()), MPI_COMM_WORLD, &compare);
  CHECK(compare == MPI_CONGRUENT);

  manager.finalize();
  manager.finalize();  // twice is harmless
  CHECK_THROWS_WITH_AS(manager.rank(), doctest::Contains("after finalize()"), core::Error);
  int finalized = 1;
  MPI_Finalized(&finalized);
  CHECK(finalized == 0);  // it did not own MPI, so it did not finalize it
}

TEST_CASE("adoption: the host owns MPI, hands over a sub-communicator, and keeps using MPI") {
  const int rank = world_rank(), size = world_size();
  MPI_Comm host_comm = MPI_COMM_NULL;  // the host's own sub-communicator: even / odd ranks
  REQUIRE(MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &host_comm) == MPI_SUCCESS);
  int host_size = 0;
  MPI_Comm_size(host_comm, &host_size);
  {
    launch::DistributedOptions options;
    options.device = core::kCPU;
    auto manager = rank % 2 == 0
                       ? launch::adopt_communicator(host_comm, options)
                       : launch::adopt_communicator_fortran(MPI_Comm_c2f(host_comm), options);
    CHECK_FALSE(manager.owns_mpi());
    CHECK(manager.world_size() == host_size);
    CHECK(manager.rank() == rank / 2);
    int compare = MPI_UNEQUAL;
    MPI_Comm_compare(launch::native_communicator(manager.world()), host_comm, &compare);
    CHECK(compare == MPI_CONGRUENT);  // a duplicate, not the host's handle

    // The host sends on its communicator while mpigrad reduces on its duplicate; the traffic
    // cannot mix.
    int token = rank, received = -1;
    int partner = host_size > 1 ? (manager.rank() ^ 1) : manager.rank();
    if (partner >= host_size) partner = manager.rank();
    MPI_Request requests[2];
    MPI_Irecv(&received, 1, MPI_INT, partner, 42, host_comm, &requests[0]);
    MPI_Isend(&token, 1, MPI_INT, partner, 42, host_comm, &requests[1]);
    core::Tensor value = core::Tensor::from_vector<int64_t>({int64_t(rank)}, {1});
    manager.world().all_reduce(value);
    MPI_Waitall(2, requests, MPI_STATUSES_IGNORE);
    int64_t expected = 0;
    for (int r = rank % 2; r < size; r += 2) expected += r;
    CHECK(value.item<int64_t>() == expected);
    CHECK(received >= 0);
  }
  // The manager is gone; MPI is still up and the host's communicators still work.
  int finalized = 1;
  MPI_Finalized(&finalized);
  CHECK(finalized == 0);
  int one = 1, total = 0;
  REQUIRE(MPI_Allreduce(&one, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS);
  CHECK(total == size);
  REQUIRE(MPI_Allreduce(&one, &total, 1, MPI_INT, MPI_SUM, host_comm) == MPI_SUCCESS);
  CHECK(total == host_size);
  MPI_Comm_free(&host_comm);
}

TEST_CASE("backend selection") {
  CHECK(launch::parse_backend("auto") == launch::Backend::Auto);
  CHECK(launch::parse_backend("mpi") == launch::Backend::Mpi);
  CHECK(launch::parse_backend("nccl") == launch::Backend::Nccl);
  CHECK_THROWS_WITH_AS(launch::parse_backend("gloo"),
                       doctest::Contains("expected one of auto | mpi | nccl"), core::Error);
  auto manager = launch::DistributedManager::initialize();
  auto mpi = launch::create_communicator(manager, launch::Backend::Auto, core::kCPU, "grads");
  CHECK(mpi->backend() == launch::Backend::Mpi);
  CHECK(mpi->name() == "grads");
  CHECK(mpi->size() == manager.world_size());
  core::Tensor value = core::ones({3}, core::kFloat32);
  mpi->all_reduce(value);
  CHECK(value.to_vector<float>()[2] == float(manager.world_size()));
  // NCCL itself is tested in tests/comm/nccl; here only the errors where it cannot be had.
  if (!core::cuda_is_available()) {
    const char* why = core::cuda_built() ? "no CUDA device is visible" : "built without CUDA/NCCL";
    CHECK_THROWS_WITH_AS(launch::create_communicator(manager, launch::Backend::Nccl),
                         doctest::Contains(why), core::Error);
    CHECK_THROWS_WITH_AS(launch::create_communicator(manager, launch::Backend::Auto, core::cuda(0)),
                         doctest::Contains(why), core::Error);
  }
}

TEST_CASE("a device that cannot be had is the error of device(), not of the manager") {
  // More GPUs than any machine here has: the manager is built, and device() names the problem.
  ::setenv("MPIGRAD_DEVICE", "cuda:64", 1);
  auto manager = launch::DistributedManager::initialize();
  ::unsetenv("MPIGRAD_DEVICE");
  CHECK_THROWS_WITH_AS(manager.device(),
                       doctest::Contains("MPIGRAD_DEVICE=cuda:64: cuda:64 is "
                                         "not available"),
                       core::Error);
  CHECK(manager.describe().find("device unavailable (") != std::string::npos);
  manager.set_device(core::kCPU);
  CHECK(manager.device() == core::kCPU);
}

TEST_CASE("bad arguments give one clear error on the calling rank, before any communication") {
  auto manager = launch::DistributedManager::initialize();
  launch::Communicator& world = manager.world();
  const uint64_t started = static_cast<launch::MpiCommunicator&>(world).collectives_started();
  core::Tensor ints = core::ones({4}, core::kInt32);
  CHECK_THROWS_WITH_AS(world.all_reduce(ints, launch::ReduceOp::Avg),
                       doctest::Contains("floating dtype"), core::Error);
  CHECK_THROWS_WITH_AS(world.all_reduce(ints, core::ones({5}, core::kInt32)),
                       doctest::Contains("output has 5"), core::Error);
  CHECK_THROWS_WITH_AS(world.all_reduce(ints, core::ones({4}, core::kInt64)),
                       doctest::Contains("input is int32 but output is int64"), core::Error);
  CHECK_THROWS_WITH_AS(world.all_reduce(core::ones({4}, core::kBool)), doctest::Contains("bool"),
                       core::Error);
  CHECK_THROWS_WITH_AS(world.all_gather(ints, core::ones({3}, core::kInt32)),
                       doctest::Contains("output must hold"), core::Error);
  CHECK_THROWS_WITH_AS(world.broadcast(ints, world.size()), doctest::Contains("root"), core::Error);
  core::Tensor matrix = core::ones({4, 4}, core::kFloat32);
  CHECK_THROWS_WITH_AS(world.all_reduce(matrix.t()), doctest::Contains("not contiguous"),
                       core::Error);
  std::vector<int64_t> wrong(size_t(world.size() + 1), 1);
  CHECK_THROWS_WITH_AS(world.all_gather_v(ints, ints, wrong), doctest::Contains("one per rank"),
                       core::Error);
  // Nothing above reached MPI: the communicator is still in step on every rank.
  world.barrier();
  CHECK(static_cast<launch::MpiCommunicator&>(world).collectives_started() == started + 1);
}

TEST_CASE("MPIGRAD_DEBUG_COLLECTIVES turns mismatched collectives into a clear error") {
  launch::DistributedOptions options;
  options.collectives.debug_collectives = true;
  auto manager = launch::adopt_communicator(MPI_COMM_WORLD, options);
  launch::Communicator& world = manager.world();
  const int rank = world.rank();
  core::Tensor value = core::ones({rank == 1 ? 5 : 4}, core::kFloat32);
  if (world.size() == 1) {
    world.all_reduce(value);  // nothing to disagree with
    CHECK(value.to_vector<float>()[0] == 1.0f);
    return;
  }
  // Different counts. The manager has numbered its own collectives (the node count) before.
  const std::string disagree =
      "ranks disagree on collective #" +
      std::to_string(static_cast<launch::MpiCommunicator&>(world).collectives_started());
  CHECK_THROWS_WITH_AS(world.all_reduce(value), doctest::Contains(disagree.c_str()), core::Error);
  // Different operations.
  core::Tensor same = core::ones({4}, core::kFloat32);
  try {
    if (rank == 0) {
      world.broadcast(same, 0);
    } else {
      world.all_reduce(same);
    }
    CHECK_MESSAGE(false, "a mismatched collective went through");
  } catch (const core::Error& error) {
    std::string message = error.what();
    CHECK(message.find("rank 0: broadcast(dtype float32, count 4, root 0)") != std::string::npos);
    CHECK(message.find("rank 1: all_reduce(dtype float32, count 4, op sum)") != std::string::npos);
  }
  // Different dtypes.
  core::Tensor typed = core::ones({4}, rank == 0 ? core::kFloat64 : core::kFloat32);
  CHECK_THROWS_WITH_AS(world.all_reduce(typed), doctest::Contains("dtype float64"), core::Error);
  // Different roots of a gather.
  CHECK_THROWS_WITH_AS(world.gather(same, core::ones({4 * world.size()}), rank == 0 ? 0 : 1),
                       doctest::Contains("gather(dtype float32, count 4, root 1)"), core::Error);
  // The v forms agree when every rank passes the same counts, though each sends its own number
  // of elements; different counts are a mismatch.
  std::vector<int64_t> counts(size_t(world.size()));
  for (int r = 0; r < world.size(); ++r) counts[size_t(r)] = r + 1;
  core::Tensor mine = core::full({rank + 1}, double(rank));
  core::Tensor all = core::zeros({std::accumulate(counts.begin(), counts.end(), int64_t(0))});
  world.all_gather_v(mine, all, counts);
  CHECK(all.to_vector<float>().back() == float(world.size() - 1));
  world.gather_v(mine, all, counts, world.size() - 1);
  std::vector<int64_t> other = counts;
  other.back() += 1;
  core::Tensor more = core::zeros({all.numel() + 1});
  CHECK_THROWS_WITH_AS(
      rank == 0 ? world.all_gather_v(mine, more, other) : world.all_gather_v(mine, all, counts),
      doctest::Contains("ranks disagree"), core::Error);
  // After the errors the ranks are still in step.
  world.all_reduce(same);
  CHECK(same.to_vector<float>()[0] == float(world.size()));
}

TEST_CASE("rank-aware seeding and main-process-only logging") {
  CHECK(launch::rank_seed(1234, 0) == 1234);
  CHECK(launch::rank_seed(1234, 3) == 1237);
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  REQUIRE(out != nullptr);
  REQUIRE(err != nullptr);
  auto read = [](std::FILE* file) {
    std::rewind(file);
    std::string text;
    for (int c; (c = std::fgetc(file)) != EOF;) text += char(c);
    return text;
  };
  launch::RankLogger main_logger(0, 4, out, err);
  launch::RankLogger other_logger(2, 4, out, err);
  main_logger.info("epoch 1");
  other_logger.info("epoch 1 from rank 2");
  other_logger.warning("slow shard");
  main_logger.error("bad config");
  CHECK(read(out) == "epoch 1\n");
  CHECK(read(err) == "[rank 2/4] warning: slow shard\n[rank 0/4] error: bad config\n");
  std::fclose(out);
  std::fclose(err);
}
