// HierarchicalAllReduce under mpirun (np 1, 2, 4) on every node layout the world allows (np 4 as
// 1 node x 4, 2 x 2 and 4 x 1; np 2 as 1 x 2 and 2 x 1): averages of every floating dtype and of
// odd sizes, bitwise identical on every rank; padded buffers; many rounds with ranks arriving
// late and waits in any order; and a rank of a node that does not start, which must end in an
// error on every rank (its node by the shared memory, the other node by the status word) with no
// collective left pending.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../simulated_nodes.h"
#include "mpigrad/core/error.h"
#include "mpigrad/launch/ddp/transports/hierarchical_all_reduce.h"
#include "mpigrad/launch/job/distributed_manager.h"

using namespace mpigrad;
using core::Tensor;
using launch::HierarchicalAllReduce;
using launch::LinkWait;
using launch::SharedBufferSpec;

namespace {

// Rank r's value at element i in round k: integers, so every partial sum and the average over
// 1, 2 or 4 ranks are exact even in bfloat16.
double contribution(int rank, int64_t i, int round) {
  return double(rank * 2 + round + i % 3);
}
double expected(int ranks, int64_t i, int round) {
  return double(ranks - 1) + round + double(i % 3);  // mean over r of 2r + round + i % 3
}

void fill(const Tensor& buffer, int64_t numel, int rank, int round) {
  std::vector<double> values(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) values[size_t(i)] = contribution(rank, i, round);
  Tensor target = buffer.narrow(0, 0, numel);
  target.copy_(Tensor::from_vector<double>(values, {numel}));
}

int wrong_elements(const Tensor& buffer, int64_t numel, int ranks, int round) {
  std::vector<double> got = buffer.to_vector<double>();
  int wrong = 0;
  for (int64_t i = 0; i < int64_t(got.size()); ++i) {
    wrong += got[size_t(i)] != (i < numel ? expected(ranks, i, round) : 0.0);  // padding stays 0
  }
  return wrong;
}

std::unique_ptr<HierarchicalAllReduce> make(launch::Communicator& world, int simulated_nodes,
                                            const std::vector<SharedBufferSpec>& specs,
                                            double timeout = 60,
                                            LinkWait link_wait = LinkWait::Blocking) {
  test::SimulatedNodes simulated(simulated_nodes);
  std::string why_not;
  auto hierarchical = HierarchicalAllReduce::create(world, world.split_node_local("node"), specs,
                                                    timeout, &why_not, std::nullopt, link_wait);
  INFO(why_not);
  REQUIRE(hierarchical != nullptr);
  return hierarchical;
}

}  // namespace

TEST_CASE("hierarchical averaging: every floating dtype and odd sizes, identical on all ranks") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  const int ranks = world.size(), rank = world.rank();
  const std::vector<SharedBufferSpec> specs{{core::kFloat32, 100003}, {core::kFloat64, 3},
                                            {core::kBFloat16, 77},    {core::kFloat16, 1025},
                                            {core::kFloat32, 0},      {core::kFloat32, 1}};
  for (int nodes : test::node_layouts(ranks)) {
    for (LinkWait link_wait : {LinkWait::Blocking, LinkWait::Sleeping}) {
      INFO("simulated nodes " << nodes << (link_wait == LinkWait::Sleeping ? ", sleeping" : ""));
      auto hierarchical = make(world, nodes, specs, 60, link_wait);
      CHECK(hierarchical->nodes() == test::layout_nodes(nodes));
      CHECK(hierarchical->ranks_per_node() == ranks / test::layout_nodes(nodes));
      REQUIRE(hierarchical->buffer_count() == specs.size());
      for (int round = 1; round <= 2; ++round) {
        for (size_t b = 0; b < specs.size(); ++b) {
          const Tensor& buffer = hierarchical->buffer(b);
          CHECK(buffer.dtype() == specs[b].dtype);
          CHECK(buffer.numel() >= specs[b].numel);
          CHECK(buffer.is_contiguous());
          fill(buffer, specs[b].numel, rank, round);
          hierarchical->start(b);
          CHECK(hierarchical->in_flight(b));
        }
        for (size_t b = 0; b < specs.size(); ++b) {
          hierarchical->wait(b);
          CHECK_FALSE(hierarchical->in_flight(b));
          INFO("buffer " << b << " dtype " << specs[b].dtype << " round " << round);
          CHECK(wrong_elements(hierarchical->buffer(b), specs[b].numel, ranks, round) == 0);
          // Bitwise the same on every rank: compare with rank 0's copy.
          Tensor reference = hierarchical->buffer(b).clone();
          world.broadcast(reference, 0);
          CHECK(reference.to_vector<double>() == hierarchical->buffer(b).to_vector<double>());
        }
      }
    }
  }
}

TEST_CASE("hierarchical averaging: the thread's priority follows its wait; its CPU clock counts") {
  // Sleeping: where this process may give a thread nice -20 (root with CAP_SYS_NICE, or
  // RLIMIT_NICE 40), the communication thread has it; elsewhere it is never below the process's
  // priority. Blocking: nice 19.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  errno = 0;
  const int process_nice = getpriority(PRIO_PROCESS, 0);
  REQUIRE(errno == 0);
  bool may_raise = false;
  std::thread probe(
      [&] { may_raise = setpriority(PRIO_PROCESS, id_t(syscall(SYS_gettid)), -20) == 0; });
  probe.join();
  const int nodes = test::node_layouts(world.size()).back();  // the most nodes the world allows
  auto sleeping = make(world, nodes, {{core::kFloat32, 1000}}, 60, LinkWait::Sleeping);
  if (may_raise) {
    CHECK(sleeping->thread_nice() == -20);
  } else {
    CHECK(sleeping->thread_nice() <= process_nice);
    CHECK(sleeping->thread_nice() >= -20);
  }
  // Blocking spins in MPI, so it yields to everything else.
  auto blocking = make(world, nodes, {{core::kFloat32, 1000}}, 60, LinkWait::Blocking);
  CHECK(blocking->thread_nice() == 19);
  CHECK(sleeping->link_wait() == LinkWait::Sleeping);
  CHECK(blocking->link_wait() == LinkWait::Blocking);
  // Both still average, from their threads, whose CPU clock counts the work (it runs on the
  // thread: its clock never goes back, and a 1 M element average takes it forward).
  for (HierarchicalAllReduce* hierarchical : {sleeping.get(), blocking.get()}) {
    fill(hierarchical->buffer(0), 1000, world.rank(), 1);
    const double cpu_before = hierarchical->thread_cpu_seconds();
    CHECK(cpu_before >= 0.0);
    hierarchical->start(0);
    hierarchical->wait(0);
    CHECK(wrong_elements(hierarchical->buffer(0), 1000, world.size(), 1) == 0);
    CHECK(hierarchical->thread_cpu_seconds() >= cpu_before);
  }
  auto large = make(world, nodes, {{core::kFloat32, 1 << 20}}, 60, LinkWait::Sleeping);
  const double cpu_before = large->thread_cpu_seconds();
  for (int round = 1; round <= 4; ++round) {
    large->start(0);
    large->wait(0);
  }
  CHECK(large->thread_cpu_seconds() > cpu_before);
}

TEST_CASE("hierarchical ZeRO-1 collectives wait sleeping as they wait blocking") {
  // ReduceScatter then AllGather (launch/ddp/bucket_transport.h) with each way of waiting, with
  // and without the bf16 wire: each rank's shard holds the average, then every rank every shard.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  const int ranks = world.size(), rank = world.rank();
  const int64_t numel = 4099;
  const std::vector<SharedBufferSpec> specs{{core::kFloat32, numel}};
  for (int nodes : test::node_layouts(ranks)) {
    for (LinkWait link_wait : {LinkWait::Blocking, LinkWait::Sleeping}) {
      for (bool bf16_wire : {false, true}) {
        INFO("simulated nodes " << nodes << (link_wait == LinkWait::Sleeping ? ", sleeping" : "")
                                << (bf16_wire ? ", bf16 wire" : ""));
        test::SimulatedNodes simulated(nodes);
        auto hierarchical = HierarchicalAllReduce::create(
            world, world.split_node_local("node"), specs, 60, nullptr,
            bf16_wire ? std::optional<core::DType>(core::kBFloat16) : std::nullopt, link_wait);
        REQUIRE(hierarchical != nullptr);
        fill(hierarchical->buffer(0), numel, rank, 1);
        hierarchical->start(0, launch::BucketCollective::ReduceScatter);
        hierarchical->wait(0);
        const auto [first, last] = hierarchical->shard(0, rank);
        const std::vector<double> reduced = hierarchical->buffer(0).to_vector<double>();
        int wrong = 0;
        for (int64_t i = first; i < std::min(last, numel); ++i) {
          wrong += reduced[size_t(i)] != expected(ranks, i, 1);  // small integers: exact in bf16
        }
        CHECK(wrong == 0);
        hierarchical->buffer(0).narrow(0, first, last - first).fill_(double(rank));
        hierarchical->start(0, launch::BucketCollective::AllGather);
        hierarchical->wait(0);
        const std::vector<double> gathered = hierarchical->buffer(0).to_vector<double>();
        wrong = 0;
        for (int r = 0; r < ranks; ++r) {
          const auto [begin, end] = hierarchical->shard(0, r);
          for (int64_t i = begin; i < end; ++i) wrong += gathered[size_t(i)] != double(r);
        }
        CHECK(wrong == 0);
      }
    }
  }
}

TEST_CASE("hierarchical averaging: many rounds with ranks arriving late, waits in any order") {
  // Each rank refills its buffers right after its waits return, while slower ranks may still be
  // in theirs, and starts the next round after a random delay. Every round must still average
  // exactly: nothing may write into a buffer after its owner's wait has returned.
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  const int ranks = world.size(), rank = world.rank();
  const std::vector<SharedBufferSpec> specs{{core::kFloat32, 4096}, {core::kFloat32, 999}};
  for (int nodes : test::node_layouts(ranks)) {
    INFO("simulated nodes " << nodes);
    auto hierarchical = make(world, nodes, specs);
    std::mt19937 random(uint32_t(rank) * 7919u + uint32_t(nodes));
    int wrong_rounds = 0;
    for (int round = 1; round <= 200; ++round) {
      for (size_t b = 0; b < specs.size(); ++b) {
        fill(hierarchical->buffer(b), specs[b].numel, rank, round % 20);
        if (random() % 3 == 0) {
          std::this_thread::sleep_for(std::chrono::microseconds(random() % 300));
        }
        hierarchical->start(b);
      }
      const bool backwards = random() % 2 == 0;
      for (size_t k = 0; k < specs.size(); ++k) hierarchical->wait(backwards ? 1 - k : k);
      for (size_t b = 0; b < specs.size(); ++b) {
        wrong_rounds +=
            wrong_elements(hierarchical->buffer(b), specs[b].numel, ranks, round % 20) != 0;
      }
    }
    CHECK(wrong_rounds == 0);
  }
}

TEST_CASE("hierarchical averaging: a rank that does not start fails every rank, naming it") {
  // np 4 as 2 nodes x 2 ranks: rank 1 (node 0) starts buffer 0 of round 2 only after rank 0 has
  // timed out. Rank 0 names rank 1; rank 2 (rank 0's partner on node 1) hears it through the
  // status word; rank 1 then finds rank 0 gone, and rank 3 hears that from rank 1. Nothing may
  // hang, and every inter-node collective must have its partner (the barrier at the end).
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  if (world.size() != 4) return;
  const int rank = world.rank();
  const std::vector<SharedBufferSpec> specs{{core::kFloat32, 256}, {core::kFloat32, 64}};
  for (LinkWait link_wait : {LinkWait::Blocking, LinkWait::Sleeping}) {
    INFO((link_wait == LinkWait::Sleeping ? "sleeping" : "blocking"));
    auto hierarchical = make(world, 2, specs, /*timeout=*/0.5, link_wait);
    for (size_t b = 0; b < specs.size(); ++b) hierarchical->start(b);
    for (size_t b = 0; b < specs.size(); ++b) hierarchical->wait(b);  // round 1 is fine
    std::string message;
    try {
      if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      for (size_t b = 0; b < specs.size(); ++b) hierarchical->start(b);
      for (size_t b = 0; b < specs.size(); ++b) hierarchical->wait(b);
    } catch (const core::Error& error) {
      message = error.what();
    }
    INFO(message);
    CHECK(message.find("hierarchical all-reduce on communicator 'world' [rank " +
                       std::to_string(rank) + "/4]") != std::string::npos);
    if (rank == 0) {
      CHECK(message.find("waited more than 0.5 s for bucket 0 (round 2): rank(s) 1 of this node "
                         "have not started it") != std::string::npos);
    }
    if (rank == 1 || rank == 2) CHECK(message.find("rank 0 gave up") != std::string::npos);
    if (rank == 3) CHECK(message.find(" gave up") != std::string::npos);
    // Every later call repeats the failure.
    CHECK_THROWS_WITH_AS(hierarchical->wait(0),
                         doctest::Contains("unusable after an earlier failure"), core::Error);
    hierarchical.reset();  // joins the communication thread: nothing of it is left waiting
    world.barrier();
  }
}

TEST_CASE("hierarchical averaging rejects non-floating buffers") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  std::vector<SharedBufferSpec> specs{{core::kInt64, 8}};
  CHECK_THROWS_WITH_AS(
      HierarchicalAllReduce::create(world, world.split_node_local("node"), specs, 1.0),
      doctest::Contains("floating dtype"), core::Error);
}
