// What the DDP tests loop over: every node layout of the world (tests/simulated_nodes.h: 0 =
// the real topology, one node under plain mpirun; K = K simulated nodes) with shared memory on and
// off, and the bucket transport DDP must pick for each (launch/ddp/transport_choice.h), so every
// such test also checks the choice. On real nodes auto measures the links
// (launch/ddp/transport_cost_model.h): scripts/cluster-sim.sh's links (CPU-bound below 1.3 GB/s
// here) are slower than a rank's copy, where the model picks hierarchical too.
#pragma once

#include <vector>

#include "../simulated_nodes.h"
#include "mpigrad/launch/ddp/transport_choice.h"

namespace mpigrad::test {

struct TransportCase {
  int nodes = 0;  // simulated nodes, 0 for the real topology
  bool shared_memory = true;
};

inline std::vector<TransportCase> transport_cases(int ranks) {
  std::vector<TransportCase> cases;
  for (int nodes : node_layouts(ranks)) {
    cases.push_back({nodes, true});
    cases.push_back({nodes, false});
  }
  return cases;
}

inline launch::TransportKind expected_transport(int simulated_nodes, int ranks,
                                                bool shared_memory = true) {
  if (!shared_memory || ranks == 1) return launch::TransportKind::Communicator;
  return layout_nodes(simulated_nodes) > 1 ? launch::TransportKind::Hierarchical
                                           : launch::TransportKind::SharedMemory;
}

}  // namespace mpigrad::test
