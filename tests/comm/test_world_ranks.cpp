// World ranks (communicator.h, WorldRanks): every communicator knows the rank in mpigrad's world
// of each of its members, through splits of splits, simulated nodes and an adopted host
// communicator, and its errors name this rank by that number ("[rank r/w]", rank_label.h),
// never by its rank in a sub-communicator.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "../error_message.h"
#include "../simulated_nodes.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/comm/process_group.h"
#include "mpigrad/launch/comm/rank_label.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/mpi_interop.h"

using namespace mpigrad;

namespace {

std::vector<int> world_ranks_of(const launch::Communicator& communicator) {
  std::vector<int> ranks;
  for (int q = 0; q < communicator.size(); ++q) ranks.push_back(communicator.world_rank_of(q));
  return ranks;
}

// The ranks of `world` with rank % 2 == parity, highest first (split with key = -rank).
std::vector<int> parity_descending(int size, int parity) {
  std::vector<int> ranks;
  for (int r = size - 1; r >= 0; --r) {
    if (r % 2 == parity) ranks.push_back(r);
  }
  return ranks;
}

}  // namespace

TEST_CASE("the world and its duplicates number their ranks as the world does") {
  auto manager = launch::DistributedManager::initialize();
  launch::Communicator& world = manager.world();
  const int rank = world.rank(), size = world.size();
  CHECK(world.world_rank() == rank);
  CHECK(world.world_size() == size);
  CHECK(world.world_label() == launch::rank_label(rank, size));
  std::vector<int> all;
  for (int r = 0; r < size; ++r) all.push_back(r);
  CHECK(world_ranks_of(world) == all);
  REQUIRE(world.world_ranks() != nullptr);
  // Every rank's host is known (one all-gather when the world is built): one host under plain
  // mpirun, two under scripts/cluster-sim.sh --nodes 2 (the first and last ranks' differ).
  CHECK(world.world_ranks()->host(rank) == launch::host_name());
  CHECK((world.world_ranks()->host(size - 1) == world.world_ranks()->host(0)) ==
        (test::real_node_count() == 1));

  auto copy = launch::create_communicator(manager, launch::Backend::Mpi, core::kCPU, "copy");
  CHECK(copy->world_rank() == rank);
  CHECK(copy->world_size() == size);
  CHECK(world_ranks_of(*copy) == all);
}

TEST_CASE("a split communicator reports the world ranks of its members, through splits of splits") {
  auto manager = launch::DistributedManager::initialize();
  launch::Communicator& world = manager.world();
  const int rank = world.rank(), size = world.size();
  // Reversed order: the split's rank 0 is the highest world rank of the parity.
  auto parity = world.split(rank % 2, -rank, "parity");
  REQUIRE(parity != nullptr);
  const std::vector<int> members = parity_descending(size, rank % 2);
  CHECK(world_ranks_of(*parity) == members);
  CHECK(parity->world_rank() == rank);
  CHECK(parity->world_size() == size);
  CHECK(parity->world_label() == launch::rank_label(rank, size));
  CHECK(parity->world_ranks()->host(members[0]) == world.world_ranks()->host(members[0]));
  CHECK(parity->world_ranks()->host(rank) == launch::host_name());

  // A split of the split: pairs of consecutive parity ranks.
  auto pair = parity->split(parity->rank() / 2, parity->rank(), "pair");
  REQUIRE(pair != nullptr);
  const size_t first = size_t(parity->rank() / 2 * 2);
  std::vector<int> expected(members.begin() + long(first),
                            members.begin() + long(std::min(first + 2, members.size())));
  CHECK(world_ranks_of(*pair) == expected);
  CHECK(pair->world_rank() == rank);

  // Process groups of the world: their communicator's world ranks are the parent ranks.
  launch::ProcessGroup blocks = launch::ProcessGroup::blocks(world, 2);
  CHECK(world_ranks_of(blocks.communicator()) == blocks.parent_ranks());
}

TEST_CASE("on simulated nodes the node-local and inter-node communicators report world ranks") {
  const int size = launch::DistributedManager::initialize().world_size();
  if (size % 2 != 0) return;  // needs two nodes of equal size
  test::SimulatedNodes simulated(2);
  auto manager = launch::DistributedManager::initialize();
  launch::Communicator& world = manager.world();
  const int rank = world.rank(), per_node = size / 2;
  auto node = world.split_node_local("node");
  std::vector<int> node_members;
  for (int q = 0; q < per_node; ++q) node_members.push_back(rank / per_node * per_node + q);
  CHECK(world_ranks_of(*node) == node_members);
  CHECK(node->world_rank() == rank);
  // The inter-node group of this local rank, as HierarchicalAllReduce splits it: at np 4, local
  // rank 1's group holds world ranks 1 and 3 (its ranks 0 and 1), and must say 1 and 3.
  auto cross = world.split(node->rank(), rank, "inter-node");
  CHECK(world_ranks_of(*cross) == std::vector<int>{node->rank(), node->rank() + per_node});
  CHECK(cross->world_rank() == rank);
  CHECK(cross->world_label() == launch::rank_label(rank, size));
}

TEST_CASE("argument errors on a sub-communicator name this rank in the world") {
  auto manager = launch::DistributedManager::initialize();
  launch::Communicator& world = manager.world();
  const int rank = world.rank(), size = world.size();
  auto parity = world.split(rank % 2, -rank, "parity");
  REQUIRE(parity != nullptr);
  const std::string label = launch::rank_label(rank, size);
  core::Tensor ints = core::ones({4}, core::kInt32);
  // Checked by Communicator, the same for every backend.
  CHECK(test::error_message([&] { parity->all_reduce(ints, core::ones({5}, core::kInt32)); }) ==
        label + " all_reduce on communicator 'parity': input has 4 elements but output has 5");
  CHECK(test::error_message([&] {
          parity->broadcast(ints, parity->size());
        }).starts_with(label + " broadcast on communicator 'parity': root "));
  CHECK(test::error_message([&] { parity->all_reduce(ints, launch::ReduceOp::Avg); })
            .starts_with(label + " all_reduce on communicator 'parity': reduce op avg needs a "
                                 "floating dtype"));
  // Checked by the MPI backend itself: no MPI reduction for bool.
  const std::string bool_error =
      test::error_message([&] { parity->all_reduce(core::ones({4}, core::kBool)); });
  CHECK(bool_error.starts_with(label + " all_reduce on communicator 'parity': "));
  CHECK(bool_error.find("bool") != std::string::npos);
  // A refused call takes no collective's number: the communicator is still in step.
  parity->all_reduce(ints);
  CHECK(ints.to_vector<int32_t>()[0] == parity->size());
}

TEST_CASE("an adopted communicator is the world: ranks are its own, not MPI_COMM_WORLD's") {
  int mpi_rank = 0, mpi_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
  // The host code reverses MPI_COMM_WORLD's ranks and hands that communicator over.
  MPI_Comm reversed = MPI_COMM_NULL;
  REQUIRE(MPI_Comm_split(MPI_COMM_WORLD, 0, -mpi_rank, &reversed) == MPI_SUCCESS);
  {
    auto manager = launch::adopt_communicator(reversed);
    const int rank = manager.rank(), size = manager.world_size();
    CHECK(rank == mpi_size - 1 - mpi_rank);
    CHECK(manager.world().world_rank() == rank);
    auto parity = manager.world().split(rank % 2, -rank, "parity");
    REQUIRE(parity != nullptr);
    CHECK(world_ranks_of(*parity) == parity_descending(size, rank % 2));
    CHECK(parity->world_rank() == rank);
    CHECK(test::error_message([&] {
            parity->all_gather(core::ones({2}), core::ones({1}));
          }).starts_with(launch::rank_label(rank, size) + " all_gather on communicator "));
  }
  MPI_Comm_free(&reversed);
}
