// Process groups: contiguous blocks, colors, the node-local group; each with its own
// communicator, used concurrently with the world.
#include <doctest/doctest.h>

#include <vector>

#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/comm/process_group.h"
#include "mpigrad/launch/job/distributed_manager.h"

using namespace mpigrad;

TEST_CASE("ProcessGroup::blocks splits into contiguous blocks of k ranks") {
  auto manager = launch::DistributedManager::initialize();
  launch::Communicator& world = manager.world();
  const int rank = world.rank(), size = world.size();
  for (int k : {1, 2, 3}) {
    CAPTURE(k);
    launch::ProcessGroup group = launch::ProcessGroup::blocks(world, k);
    int first = (rank / k) * k;
    int expected_size = std::min(k, size - first);
    CHECK(group.color() == rank / k);
    CHECK(group.size() == expected_size);
    CHECK(group.rank() == rank - first);
    std::vector<int> members;
    for (int r = first; r < first + expected_size; ++r) members.push_back(r);
    CHECK(group.parent_ranks() == members);
    // A sum over the block only.
    core::Tensor value = core::Tensor::from_vector<int64_t>({int64_t(rank)}, {1});
    group.communicator().all_reduce(value);
    int64_t expected = 0;
    for (int r : members) expected += r;
    CHECK(value.item<int64_t>() == expected);
    // The world is unaffected and still in step.
    core::Tensor all = core::ones({2}, core::kFloat32);
    world.all_reduce(all);
    CHECK(all.to_vector<float>()[1] == float(size));
  }
  CHECK_THROWS_WITH_AS(launch::ProcessGroup::blocks(world, 0), doctest::Contains("at least 1"),
                       core::Error);
}

TEST_CASE("ProcessGroup::by_color and the node-local group") {
  auto manager = launch::DistributedManager::initialize();
  launch::Communicator& world = manager.world();
  const int rank = world.rank(), size = world.size();
  launch::ProcessGroup parity = launch::ProcessGroup::by_color(world, rank % 2);
  std::vector<int> members;
  for (int r = rank % 2; r < size; r += 2) members.push_back(r);
  CHECK(parity.parent_ranks() == members);
  CHECK(parity.communicator().name() == "world color " + std::to_string(rank % 2));

  // Async collectives on two communicators in flight at once.
  core::Tensor in_group = core::full({100}, double(rank), core::kFloat64);
  core::Tensor in_world = core::full({100}, 1.0, core::kFloat32);
  launch::WorkPtr a = parity.communicator().all_reduce_async(in_group, launch::ReduceOp::Max);
  launch::WorkPtr b = world.all_reduce_async(in_world);
  b->wait();
  a->wait();
  CHECK(in_group.to_vector<double>()[7] == double(members.back()));
  CHECK(in_world.to_vector<float>()[7] == float(size));

  launch::ProcessGroup node = launch::ProcessGroup::node_local(world);
  CHECK(node.size() == manager.local_size());
  CHECK(node.rank() == manager.local_rank());
  CHECK(manager.node_local().size() == manager.local_size());
  core::Tensor count = core::ones({1}, core::kInt32);
  node.communicator().all_reduce(count);
  CHECK(count.item<int32_t>() == manager.local_size());
}
