// The atomic structures a host MD code hands to an embedded interatomic potential (the atoms calls
// of mpigrad/mpigrad_c.h and the Fortran module), checked and turned into the ragged batch of
// docs/interatomic-potentials.md that launch/train/atomistic_steps.h reads: positions float32
// [V, 3], atomic_numbers int64 [V], batch, atoms_ptr, num_atoms, cell float32 [B, 3, 3], pbc bool
// [B, 3], and the neighbor list edge_index int64 [2, E] with edge_shifts float32 [E, 3].
//
// The neighbor list is the host's when it gives one (edge_index with source row 0 and target row
// 1, numbered from index_base, so a Fortran host passes its own 1-based atom numbers; edge_shifts
// the Cartesian image offsets of the edge convention, zeros when left out), and otherwise the
// radius graph of [graph] cutoff, max_neighbors and self_loops (data/neighbor_list.h). A host's
// list may hold more pairs than the cutoff's (a Verlet list with a skin): a potential whose
// cutoff function is zero from the cutoff on (schnet) gives the same energy and forces.
//
// Every failure is an EmbedError naming the array as the caller called it: Shape for extents,
// DType for element types, Value for contents (an atomic number the model does not know, an edge
// joining two structures, a non-finite coordinate).
#pragma once

#include <cstdint>

#include "mpigrad/core/device.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/data/batch.h"
#include "mpigrad/data/neighbor_list.h"

namespace mpigrad::launch {

// The caller's arrays, as C-order views of its memory (any dtype the checks accept).
struct HostAtoms {
  core::Tensor positions;       // [V, 3] float32 or float64
  core::Tensor atomic_numbers;  // [V] int32 or int64
  core::Tensor num_atoms;       // [B] int32 or int64, summing to V; undefined: one structure
  core::Tensor cell;            // [B, 3, 3] (or [3, 3] for one structure), rows the lattice
                                // vectors; undefined: no cell
  core::Tensor pbc;             // [B, 3] (or [3]) integer, nonzero: periodic; undefined: none
  core::Tensor edge_index;      // [2, E] int32 or int64; undefined: the radius graph
  core::Tensor edge_shifts;     // [E, 3] float32 or float64; undefined: zeros
  int64_t index_base = 0;       // the number edge_index gives the first atom (1 from Fortran)
};

struct AtomsBatchOptions {
  data::NeighborListOptions graph;       // cutoff 0: the host must give its neighbor list
  int64_t max_atomic_number = 0;         // > 0: atomic numbers 1 .. this; 0: any positive one
  const char* model_name = "the model";  // in the message about an unknown atomic number
  core::Device device = core::kCPU;
};

// The structures' count: num_atoms's length, or 1.
int64_t structure_count(const HostAtoms& atoms);

// The ragged batch of `atoms` on options.device, its indices 0 .. B - 1. EmbedError as above.
data::Batch atoms_batch(const HostAtoms& atoms, const AtomsBatchOptions& options);

// The labels of a training step added to `batch`: energy [B] (or [B, 1]) and forces [V, 3],
// float32 or float64, as float32; `forces` may be undefined when the loss weighs no forces.
void add_atoms_labels(data::Batch& batch, const core::Tensor& energy, const core::Tensor& forces,
                      bool forces_needed, core::Device device);

}  // namespace mpigrad::launch
