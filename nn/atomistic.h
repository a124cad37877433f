// Interatomic potentials: models that map a batch of atomic structures to one energy per
// structure. Forces (-dE/dpositions) and stress (the strain derivative) are taken from that
// energy by the training step (launch/train/atomistic_steps.h), so a model only defines E.
//
// The graph is ragged: the V atoms of B structures concatenated, each atom's structure in
// `batch`, and E directed edges between atoms of the same structure. Edge k carries a message
// from its source edge_index[0][k] to its target edge_index[1][k], and its vector is
//     positions[edge_index[1][k]] - positions[edge_index[0][k]] + edge_shifts[k]
// (edge_shifts: the Cartesian periodic-image offset; zeros for a cluster), the layout of
// docs/interatomic-potentials.md and data/neighbor_list.h. Aggregation onto atoms is an
// index_add over edge_index[1]; onto structures, an index_add over `batch`.
//
// Two routes: nn::SchNet (nn/schnet.h), built in, and a graph exported from PyTorch to ONNX
// whose inputs are named after the fields below (nn/onnx/onnx_energy_model.h).
#pragma once

#include <cstdint>
#include <string>

#include "mpigrad/nn/module.h"

namespace mpigrad::nn {

struct AtomicGraph {
  Tensor positions;       // [V, 3] float32
  Tensor atomic_numbers;  // [V] int64
  Tensor edge_index;      // [2, E] int64: row 0 sources, row 1 targets
  Tensor edge_shifts;     // [E, 3] float32
  Tensor batch;           // [V] int64: each atom's structure, 0 .. num_structures - 1
  Tensor cell;            // [B, 3, 3] float32: lattice vectors as rows (zeros without a cell)
  int64_t num_structures = 0;
};

// Throws core::Error, naming `where`, unless the graph's tensors have the shapes and dtypes above
// (V, E and B agreeing) and sit on one device. (positions, edge_shifts and cell may also be
// float64 together, for finite-difference checks.)
void check_atomic_graph(const AtomicGraph& graph, const std::string& where);

// The vector of every edge, [E, 3] (target - source + shift), differentiable in the positions and
// the shifts.
Tensor edge_vectors(const AtomicGraph& graph);

// The edges of a neighbor list that come in reverse pairs: edge e (source s, target t, shift
// v) and an edge (t, s, -v), whose vectors are each other's negatives for any positions, so
// their lengths (and whatever a model computes from the length alone) are equal. A full
// neighbor list holds every pair both ways, so a model can compute a filter once per pair.
// Pairs are matched on the values of edge_index and edge_shifts (copied to the host); an edge
// without a partner (a self loop, a list cut by max_neighbors) stands alone.
struct EdgePairs {
  Tensor first;  // int64 [P]: one edge of each pair, and each unpaired edge, in edge order
  Tensor pair;   // int64 [E]: for every edge, its entry of `first`
  int64_t count = 0;
};
EdgePairs pair_reverse_edges(const AtomicGraph& graph);

// The vectors of the edges `edges` (int64 [n]) only: edge_vectors(graph)[edges].
Tensor edge_vectors(const AtomicGraph& graph, const Tensor& edges);

// Per-atom values [V] (or [V, 1]) summed into each structure: [B].
Tensor sum_over_structures(const Tensor& per_atom, const AtomicGraph& graph);

class AtomisticModel : public Module {
 public:
  // The energy of each structure, [B] float32, differentiable in graph.positions,
  // graph.edge_shifts and graph.cell (and the parameters) to any order.
  virtual Tensor energy(const AtomicGraph& graph) = 0;
  // A potential takes a whole graph: core::Error saying to call energy().
  Tensor forward(const Tensor& input) override;
};

}  // namespace mpigrad::nn
