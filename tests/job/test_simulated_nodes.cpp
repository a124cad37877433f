// MPIGRAD_SIMULATE_NODES under mpirun (np 1, 2, 4): the manager's node count, local ranks and
// log line, and the node-local communicator, follow the simulated layout; a count that does not
// divide the world is one error on every rank.
#include <doctest/doctest.h>

#include <string>

#include "../simulated_nodes.h"
#include "mpigrad/core/error.h"
#include "mpigrad/launch/comm/communicator.h"
#include "mpigrad/launch/comm/process_group.h"
#include "mpigrad/launch/job/distributed_manager.h"

using namespace mpigrad;

TEST_CASE("MPIGRAD_SIMULATE_NODES=K cuts the ranks into K equal nodes, in rank order") {
  for (int nodes : test::node_layouts(launch::DistributedManager::initialize().world_size())) {
    if (nodes == 0) continue;
    INFO("simulated nodes " << nodes);
    test::SimulatedNodes simulated(nodes);
    CHECK(launch::simulated_node_count() == nodes);
    // The MPI runner owns MPI; each manager attaches to it and is gone before MPI_Finalize.
    auto manager = launch::DistributedManager::initialize();
    const int per_node = manager.world_size() / nodes;
    CHECK(manager.node_count() == nodes);
    CHECK(manager.local_size() == per_node);
    CHECK(manager.local_rank() == manager.rank() % per_node);
    CHECK(manager.describe().find(std::to_string(nodes) + " simulated node") != std::string::npos);
    // The node-local communicator holds exactly this rank's block.
    core::Tensor mine = core::Tensor::from_vector<int32_t>({manager.rank()}, {1});
    core::Tensor block = core::zeros({per_node}, core::kInt32);
    manager.node_local().all_gather(mine, block);
    std::vector<int32_t> ranks = block.to_vector<int32_t>();
    for (int i = 0; i < per_node; ++i) {
      CHECK(ranks[size_t(i)] == manager.rank() / per_node * per_node + i);
    }
    launch::ProcessGroup node = launch::ProcessGroup::node_local(manager.world());
    CHECK(node.size() == per_node);
  }
}

TEST_CASE("MPIGRAD_SIMULATE_NODES that does not divide the ranks is an error naming it") {
  auto manager = launch::DistributedManager::initialize();
  test::SimulatedNodes simulated(manager.world_size() + 1);
  std::string message;
  try {
    manager.world().split_node_local("node");
  } catch (const core::Error& error) {
    message = error.what();
  }
  CHECK(message.find("MPIGRAD_SIMULATE_NODES=" + std::to_string(manager.world_size() + 1)) !=
        std::string::npos);
  CHECK(message.find("do not split into") != std::string::npos);
}

TEST_CASE("MPIGRAD_SIMULATE_NODES must be a positive number") {
  test::SimulatedNodes simulated(0);
  setenv("MPIGRAD_SIMULATE_NODES", "two", 1);
  CHECK_THROWS_WITH_AS(launch::simulated_node_count(),
                       doctest::Contains("MPIGRAD_SIMULATE_NODES='two'"), core::Error);
}
