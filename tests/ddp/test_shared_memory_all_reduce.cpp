// SharedMemoryAllReduce under mpirun (np 1, 2, 4): averages of every floating dtype and of odd
// sizes (empty, fewer elements than ranks, not a multiple of a cache line), identical on every
// rank; repeated rounds with progress() and waits out of order; buffers that outlive the object;
// a rank that never starts is named in the timeout error; and argument errors.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../simulated_nodes.h"
#include "mpigrad/launch/ddp/transports/shared_memory_all_reduce.h"
#include "mpigrad/launch/job/distributed_manager.h"

using namespace mpigrad;
using core::Tensor;
using launch::SharedBufferSpec;
using launch::SharedMemoryAllReduce;

namespace {

// Rank r's value at element i in round k: the average over ranks is exactly representable.
double contribution(int rank, int64_t i, int round) {
  return double(rank * 4 + round) + double(i % 7);
}
double expected(int ranks, int64_t i, int round) {
  return (ranks - 1) * 2.0 + round + double(i % 7);  // mean over r of 4r + round + i % 7
}

void fill(const Tensor& buffer, int rank, int round) {
  std::vector<double> values(size_t(buffer.numel()));
  for (int64_t i = 0; i < buffer.numel(); ++i) values[size_t(i)] = contribution(rank, i, round);
  Tensor target = buffer;
  target.copy_(Tensor::from_vector<double>(values, {buffer.numel()}));
}

std::unique_ptr<SharedMemoryAllReduce> make(launch::Communicator& world,
                                            const std::vector<SharedBufferSpec>& specs,
                                            double timeout = 60) {
  std::string why_not;
  auto shared = SharedMemoryAllReduce::create(world, specs, timeout, &why_not);
  INFO(why_not);
  REQUIRE(shared != nullptr);
  return shared;
}

// Shared memory reaches only the ranks of one node: under scripts/cluster-sim.sh the tests run
// on each node's ranks (under plain mpirun that is the whole world).
std::unique_ptr<launch::Communicator> on_this_node(launch::DistributedManager& manager) {
  test::SimulatedNodes real(0);
  return manager.world().split_node_local("node");
}

// The world rank of this node's local rank `local` (cluster-sim.sh places ranks in blocks).
int world_rank_of(const launch::DistributedManager& manager, const launch::Communicator& node,
                  int local) {
  return manager.rank() - node.rank() + local;
}

}  // namespace

TEST_CASE("shared-memory averaging: every floating dtype and odd sizes, identical on all ranks") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto node = on_this_node(manager);
  auto& world = *node;
  const int ranks = world.size(), rank = world.rank();
  const std::vector<SharedBufferSpec> specs{{core::kFloat32, 100003}, {core::kFloat64, 3},
                                            {core::kBFloat16, 77},    {core::kFloat16, 1025},
                                            {core::kFloat32, 0},      {core::kFloat32, 1}};
  auto shared = make(world, specs);
  CHECK(shared->rank() == rank);
  CHECK(shared->size() == ranks);
  REQUIRE(shared->buffer_count() == specs.size());
  for (size_t b = 0; b < specs.size(); ++b) {
    const Tensor& buffer = shared->buffer(b);
    CHECK(buffer.dtype() == specs[b].dtype);
    CHECK(buffer.numel() == specs[b].numel);
    CHECK(buffer.is_contiguous());
    CHECK(reinterpret_cast<uintptr_t>(buffer.data_ptr()) % 64 == 0);
    std::vector<double> initial = buffer.to_vector<double>();
    CHECK(std::count(initial.begin(), initial.end(), 0.0) == buffer.numel());  // zero at creation
    fill(buffer, rank, 0);
    shared->start(b);
    CHECK(shared->in_flight(b));
  }
  for (size_t b = 0; b < specs.size(); ++b) {
    shared->wait(b);
    CHECK_FALSE(shared->in_flight(b));
    std::vector<double> got = shared->buffer(b).to_vector<double>();
    int wrong = 0;
    for (int64_t i = 0; i < specs[b].numel; ++i) wrong += got[size_t(i)] != expected(ranks, i, 0);
    INFO("buffer " << b << " dtype " << specs[b].dtype);
    CHECK(wrong == 0);
    // Bitwise the same on every rank: compare with rank 0's copy.
    Tensor reference = shared->buffer(b).clone();
    world.broadcast(reference, 0);
    CHECK(reference.to_vector<double>() == shared->buffer(b).to_vector<double>());
  }
}

TEST_CASE("shared-memory averaging: rounds repeat, progress() does a share, waits in any order") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto node = on_this_node(manager);
  auto& world = *node;
  const int ranks = world.size(), rank = world.rank();
  auto shared = make(world, {{core::kFloat32, 4096}, {core::kFloat32, 513}});
  for (int round = 1; round <= 3; ++round) {
    fill(shared->buffer(0), rank, round);
    fill(shared->buffer(1), rank, round);
    shared->start(0);
    shared->start(1);
    shared->progress();  // may or may not find the other ranks there yet; never blocks
    shared->wait(1);
    shared->wait(0);
    shared->wait(0);  // a second wait is a no-op
    for (size_t b = 0; b < 2; ++b) {
      std::vector<double> got = shared->buffer(b).to_vector<double>();
      int wrong = 0;
      for (size_t i = 0; i < got.size(); ++i) wrong += got[i] != expected(ranks, int64_t(i), round);
      INFO("round " << round << " buffer " << b);
      CHECK(wrong == 0);
    }
  }
  std::string message;
  try {
    shared->start(0);
    shared->start(0);
  } catch (const core::Error& error) {
    message = error.what();
  }
  CHECK(message.find("buffer 0 is already in flight") != std::string::npos);
  shared->wait(0);
  // The buffers are views of a mapping that lives as long as they do.
  Tensor kept = shared->buffer(1);
  shared.reset();
  CHECK(kept.to_vector<double>()[5] == expected(ranks, 5, 3));
}

TEST_CASE("shared-memory averaging: many rounds with ranks arriving late and leaving early") {
  // Each rank writes its next contribution right after its wait returns, while slower ranks may
  // still be in theirs, and arrives at the next start after a random delay (long enough that
  // the others spin, yield and run progress() inside their waits). Every round must still
  // average exactly: nothing may write into a buffer after its owner's wait has returned.
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto node = on_this_node(manager);
  auto& world = *node;
  const int ranks = world.size(), rank = world.rank();
  auto shared = make(world, {{core::kFloat32, 4096}}, /*timeout=*/60);
  std::mt19937 random(uint32_t(rank) * 7919u + 1u);
  int wrong_rounds = 0;
  for (int round = 1; round <= 1000; ++round) {
    fill(shared->buffer(0), rank, round % 50);
    if (random() % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(random() % 400));
    shared->start(0);
    shared->wait(0);
    std::vector<double> got = shared->buffer(0).to_vector<double>();
    bool ok = true;
    for (size_t i = 0; i < got.size(); ++i) {
      ok = ok && got[i] == expected(ranks, int64_t(i), round % 50);
    }
    wrong_rounds += ok ? 0 : 1;
  }
  CHECK(wrong_rounds == 0);
}

TEST_CASE("shared-memory averaging: a timeout names the missing rank and the others fail at once") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto node = on_this_node(manager);
  auto& world = *node;
  if (world.size() == 1) return;
  auto shared = make(world, {{core::kFloat32, 64}}, /*timeout=*/0.3);
  std::string message;
  if (world.rank() == 0) {
    shared->start(0);
    try {
      shared->wait(0);
    } catch (const core::Error& error) {
      message = error.what();
    }
    std::string missing = "rank(s) " + std::to_string(world_rank_of(manager, world, 1));
    for (int r = 2; r < world.size(); ++r)
      missing += ", " + std::to_string(world_rank_of(manager, world, r));
    CHECK(message.find(missing + (world.size() == 2 ? " have not started it" : "")) !=
          std::string::npos);
    CHECK(message.find("[rank " + std::to_string(manager.rank()) + "/") != std::string::npos);
    CHECK(message.find("buffer 0") != std::string::npos);
  }
  world.barrier();  // the others arrive only after rank 0 has given up
  if (world.rank() != 0) {
    shared->start(0);
    try {
      shared->wait(0);  // fails at once: rank 0 marked its segment
    } catch (const core::Error& error) {
      message = error.what();
    }
    CHECK(message.find("rank " + std::to_string(world_rank_of(manager, world, 0)) + " gave up") !=
          std::string::npos);
  }
  // Every later call repeats the failure instead of trying again.
  CHECK_THROWS_WITH_AS(shared->progress(), doctest::Contains("unusable after an earlier failure"),
                       core::Error);
}

TEST_CASE("shared-memory averaging: a rank starting the buffers in another order is out of step") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto node = on_this_node(manager);
  auto& world = *node;
  if (world.size() == 1) return;
  auto shared = make(world, {{core::kFloat32, 64}, {core::kFloat32, 64}}, /*timeout=*/30);
  // Round 1 as it should be; then rank 1 skips buffer 0, as if its backward had failed halfway.
  for (size_t b = 0; b < 2; ++b) shared->start(b);
  for (size_t b = 0; b < 2; ++b) shared->wait(b);
  if (world.rank() != 1) shared->start(0);
  shared->start(1);
  std::string message;
  try {
    shared->wait(1);  // every rank has started buffer 1, but not as the same start
  } catch (const core::Error& error) {
    message = error.what();
  }
  CHECK(message.find("ranks out of step") != std::string::npos);
  CHECK(message.find("started buffer 1") != std::string::npos);
  world.barrier();
}

TEST_CASE("shared-memory averaging: different buffer lists on different ranks are an error") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto node = on_this_node(manager);
  auto& world = *node;
  if (world.size() == 1) return;
  // The same total size in a different order: only a comparison of the layouts can tell.
  std::vector<SharedBufferSpec> specs{{core::kFloat32, 16}, {core::kFloat32, 32}};
  if (world.rank() == 1) std::swap(specs[0], specs[1]);
  const std::string odd_one = "rank " + std::to_string(world_rank_of(manager, world, 1));
  CHECK_THROWS_WITH_AS(
      SharedMemoryAllReduce::create(world, specs, 10.0),
      doctest::Contains((odd_one + " asked for a different list of buffers").c_str()), core::Error);
}

TEST_CASE("shared-memory averaging: a full /dev/shm falls back with a reason and leaves nothing") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto node = on_this_node(manager);
  auto& world = *node;
  const std::vector<SharedBufferSpec> huge{{core::kFloat32, int64_t(1) << 42}};  // 16 TiB
  std::string why_not;
  CHECK(SharedMemoryAllReduce::create(world, huge, 10.0, &why_not) == nullptr);
  CHECK(why_not.find("could not create a shared-memory segment of 16777216 MiB") !=
        std::string::npos);
  const std::string mine = "mpigrad-" + std::to_string(getpid()) + "-";
  int left = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    left += entry.path().filename().string().starts_with(mine);
  }
  CHECK(left == 0);
}

TEST_CASE("shared-memory averaging rejects non-floating buffers") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  std::vector<SharedBufferSpec> specs{{core::kInt64, 8}};
  CHECK_THROWS_WITH_AS(SharedMemoryAllReduce::create(manager.world(), specs, 1.0),
                       doctest::Contains("floating dtype"), core::Error);
}

TEST_CASE("shared-memory averaging refuses ranks on different nodes, saying why") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  if (test::real_node_count() == 1) return;  // only under scripts/cluster-sim.sh
  const std::vector<SharedBufferSpec> specs{{core::kFloat32, 64}};
  std::string why_not;
  CHECK(SharedMemoryAllReduce::create(manager.world(), specs, 10.0, &why_not) == nullptr);
  INFO(why_not);
  CHECK(!why_not.empty());
}
