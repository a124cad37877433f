// Neighbor lists for interatomic potentials: the radius graph of each structure of a ragged
// batch (docs/interatomic-potentials.md), rebuilt per batch in the loader's worker thread.
//
// An edge k joins a source (sender) atom to a target (receiver) atom closer than the cutoff,
// counting periodic images: the edge's vector is
//     positions[target] - positions[source] + shift[k],
// the displacement from the source's image to the target, with shift[k] = image[k] . cell, image
// an integer triple (zero along an axis without pbc). An atom may neighbor its own images; an
// atom with itself at image (0, 0, 0) is a self loop, left out unless asked for.
//
// The search is a cell list over fractional coordinates: atoms are wrapped into the cell along
// periodic axes and binned so that a bin is at least the cutoff thick (measured perpendicular to
// the cell's faces, so triclinic cells are exact); each atom looks at the bins within the cutoff,
// across the periodic boundary with the image that crossing gives. A cutoff larger than the cell
// simply looks several cells out. Linear in the atoms for a fixed density; every distance is
// taken in double precision.
//
// Order, deterministic whatever the input order of the search: edges by target, then source,
// then image (lexicographic). With max_neighbors > 0 each target keeps its max_neighbors
// nearest sources (ties broken by that order).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mpigrad/data/data_loader.h"

namespace mpigrad::data {

struct NeighborListOptions {
  double cutoff = 0.0;        // > 0; edges are pairs strictly closer than this
  int64_t max_neighbors = 0;  // 0: no limit; else each target keeps its nearest
  bool self_loops = false;    // an edge from each atom to itself (image 0, length 0)
};

// One structure's edges, in the order above; rows are the structure's own (0 .. atoms - 1).
struct StructureEdges {
  std::vector<int64_t> source, target;
  std::vector<int64_t> image;  // [edges * 3] integer cell offsets
  std::vector<double> shift;   // [edges * 3] Cartesian: image . cell
  int64_t size() const { return int64_t(source.size()); }
};

// The radius graph of one structure: `positions` holds atoms * 3 coordinates, `cell` the three
// lattice vectors as rows (row-major 3x3), `pbc` whether each axis is periodic. A cell may be
// anything (zeros too) when no axis is periodic. core::Error, naming `where`, for a cutoff that
// is not positive and finite, a non-finite position, a periodic axis with a singular cell, or a
// cutoff so much larger than the cell that the images to search pass a million.
StructureEdges radius_graph(std::span<const double> positions, const std::array<double, 9>& cell,
                            const std::array<bool, 3>& pbc, const NeighborListOptions& options,
                            const std::string& where = "radius_graph");

// The graph of a whole ragged batch, on the device its positions are on: `positions` float32
// [V, 3], `atoms_ptr` int64 [B + 1], `cell` float32 [B, 3, 3] and `pbc` bool [B, 3] (either may be
// undefined: no periodic axis). It runs the all-pairs search of kernels/neighbor_list.h through
// that device's backend (one thread per atom on a GPU), which finds the edges, order and shifts
// radius_graph finds structure by structure, as batch rows: edge_index int64 [2, E], edge_shifts
// float32 [E, 3] and edges_ptr int64 [B + 1], all on positions' device. The work is quadratic in
// a structure's atoms, which suits batches of small structures; the per-structure frames are
// prepared on the host (atoms_ptr, cell and pbc are read there). Errors are radius_graph's, naming
// `names[b]` (the dataset index) for structure b when given, else b.
struct BatchGraph {
  core::Tensor edge_index, edge_shifts, edges_ptr;
};
BatchGraph radius_graph_batch(const core::Tensor& positions, const core::Tensor& atoms_ptr,
                              const core::Tensor& cell, const core::Tensor& pbc,
                              const NeighborListOptions& options,
                              std::span<const int64_t> names = {});

// A batch transform that (re)builds the graph of a ragged batch (the layout of
// docs/interatomic-potentials.md): it reads `positions` (float32 [V, 3]), `atoms_ptr` (int64
// [B + 1]), and `cell` (float32 [B, 3, 3]) and `pbc` (bool [B, 3]) when present (absent: no
// periodic axis), and writes `edge_index` (int64 [2, E]: row 0 the sources, row 1 the targets, as
// batch rows), `edge_shifts` (float32 [E, 3]) and `edges_ptr` (int64 [B + 1]), replacing any the
// store gave. Errors name the batch's structure (its dataset index) and the field. A batch whose
// positions are on a CUDA device gets its graph there, from radius_graph_batch.
BatchTransform radius_graph_transform(NeighborListOptions options);

}  // namespace mpigrad::data
