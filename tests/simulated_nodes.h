// SimulatedNodes: sets MPIGRAD_SIMULATE_NODES for the lifetime of a test scope, so one MPI test
// run covers several node layouts of the same ranks (np 4 as 1 node x 4 ranks, 2 x 2 and 4 x 1).
// The variable is read when a communicator is split by node (launch/comm/communicator.h), so only
// what is built inside the scope follows it; the previous value comes back at the end.
// node_layouts(size) lists the layouts worth testing for a world of `size` ranks: 0 (the real
// topology: one node under plain mpirun, K under scripts/cluster-sim.sh --nodes K) and every
// K > 1 that divides size and keeps each simulated node inside a real one.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace mpigrad::test {

class SimulatedNodes {
 public:
  explicit SimulatedNodes(int nodes) {
    if (const char* old = std::getenv("MPIGRAD_SIMULATE_NODES")) previous_ = old;
    if (nodes > 0) {
      setenv("MPIGRAD_SIMULATE_NODES", std::to_string(nodes).c_str(), 1);
    } else {
      unsetenv("MPIGRAD_SIMULATE_NODES");
    }
  }
  ~SimulatedNodes() {
    if (previous_) {
      setenv("MPIGRAD_SIMULATE_NODES", previous_->c_str(), 1);
    } else {
      unsetenv("MPIGRAD_SIMULATE_NODES");
    }
  }
  SimulatedNodes(const SimulatedNodes&) = delete;
  SimulatedNodes& operator=(const SimulatedNodes&) = delete;

 private:
  std::optional<std::string> previous_;
};

// The nodes mpirun really placed the ranks on, from Open MPI's environment (ranks in the job
// over ranks on this node, equal on every node under both launchers we test with), so that it
// needs no collective; 1 without Open MPI's launcher.
inline int real_node_count() {
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (size == nullptr || local == nullptr) return 1;
  const int ranks = std::atoi(size), on_this_node = std::atoi(local);
  return on_this_node > 0 && ranks % on_this_node == 0 ? ranks / on_this_node : 1;
}

// The number of nodes a layout of node_layouts() stands for.
inline int layout_nodes(int simulated_nodes) {
  return simulated_nodes > 0 ? simulated_nodes : real_node_count();
}

inline std::vector<int> node_layouts(int size) {
  std::vector<int> layouts{0};
  for (int nodes = 2; nodes <= size; ++nodes) {
    if (size % nodes == 0 && nodes % real_node_count() == 0) layouts.push_back(nodes);
  }
  return layouts;
}

}  // namespace mpigrad::test
