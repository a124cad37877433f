// Ragged batches: batches whose structures have their own numbers of atoms and edges, described
// field by field by FieldLevel (data/batch.h). The contract of an atomic batch of B structures
// (data/atomic_dataset.h): atoms concatenated in batch order with `batch` (each atom's structure)
// and `atoms_ptr` [B+1]; edges likewise with `edges_ptr`; `edge_index` [2, E] in batch rows.
//
// gather_structures() builds one batch from structures of several others, which is how a
// MultiDataset answers a request that spans its children (in the order asked for), driven by the
// levels alone: Sample rows and the Atom and Edge rows of each structure are copied, pointers and
// the batch index are rebuilt from the counts, and EdgeAtoms rows are moved to the structure's new
// first atom. A batch with no pointer fields (fixed-shape data) is gathered row by row.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mpigrad/core/tensor.h"
#include "mpigrad/data/batch.h"

namespace mpigrad::data {

// Structure `position` of part `part`.
struct StructurePick {
  size_t part = 0;
  int64_t position = 0;
};

// The batch of picks.size() structures, structure i being picks[i] of `parts`, each part holding
// `fields` in that order. Throws core::Error when a part lacks a field, has a tensor whose shape
// disagrees with its level, or has Atom (Edge) fields without an AtomPointer (EdgePointer) field.
// The result carries no indices or dataset_index: the caller sets them.
Batch gather_structures(std::span<const Batch> parts, std::span<const StructurePick> picks,
                        const std::vector<FieldInfo>& fields);

// int64 [counts.size() + 1]: 0, c0, c0 + c1, ...
core::Tensor offsets_from_counts(std::span<const int64_t> counts);
// int64 [sum counts]: i repeated counts[i] times.
core::Tensor sample_of_rows(std::span<const int64_t> counts);

}  // namespace mpigrad::data
