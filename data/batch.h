// What a dataset yields: one tensor per field (x, y, ...) whose leading dimension is the batch,
// plus the global sample indices and, for a MultiDataset, which child each sample came from.
// Fields of fixed-shape data hold one row per sample; an atomic dataset's batches are ragged
// (each structure has its own number of atoms and edges) and say so with their FieldLevel.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mpigrad/core/checked_math.h"
#include "mpigrad/core/dtype.h"
#include "mpigrad/core/shape.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::data {

// How a field's batch tensor grows with the B samples of a batch, and so how batches are joined
// and split by structure (data/ragged_batch.h). V and E are the batch's atoms and edges.
enum class FieldLevel {
  Sample,       // [B, shape...]: one row per sample (every field of fixed-shape data)
  Atom,         // [V, shape...]: the samples' atoms, concatenated in batch order
  Edge,         // [E, shape...]: the samples' edges, concatenated in batch order
  AtomPointer,  // int64 [B + 1]: CSR offsets of each sample's atoms (atoms_ptr)
  EdgePointer,  // int64 [B + 1]: CSR offsets of each sample's edges (edges_ptr)
  AtomSample,   // int64 [V]: each atom's sample, 0..B-1 (batch)
  EdgeAtoms,    // int64 [2, E]: each edge's source and target, as atom rows of the batch
};
std::string_view field_level_name(FieldLevel level);  // "sample", "atom", ...

// One field of a dataset: its name, element type, the shape of a single sample (of one atom or
// edge for those levels) and its level.
struct FieldInfo {
  std::string name;
  core::DType dtype = core::kFloat32;
  core::Shape sample_shape;  // without the leading N (V, E); [] for pointers, [2] for EdgeAtoms
  FieldLevel level = FieldLevel::Sample;
  bool ragged() const { return level != FieldLevel::Sample; }
  // Checked: the shape comes from a file, and its bytes may not fit in int64.
  int64_t sample_bytes() const {
    return core::checked_mul(sample_shape.numel(), int64_t(core::element_size(dtype)), "field '",
                             name, "' per-sample shape ", sample_shape, " in bytes");
  }
  friend bool operator==(const FieldInfo& a, const FieldInfo& b) {
    return a.name == b.name && a.dtype == b.dtype && a.sample_shape == b.sample_shape &&
           a.level == b.level;
  }
};

struct Batch {
  // Field name -> tensor, in the dataset's field order: [batch, sample_shape...] for Sample
  // fields, the shapes FieldLevel gives for the others.
  std::vector<std::pair<std::string, core::Tensor>> fields;
  // Global index of each sample in the dataset the loader reads.
  std::vector<int64_t> indices;
  // int64 [batch]: the child dataset of each sample; undefined unless read from a MultiDataset.
  core::Tensor dataset_index;
  // The loader's epoch when it read the batch (DataLoader::set_epoch): what per-epoch random
  // transforms draw from (data/augment.h). 0 outside a loader.
  int64_t epoch = 0;

  int64_t size() const { return int64_t(indices.size()); }
  bool has(const std::string& name) const;
  // The field's tensor; throws core::Error naming the field and the fields present.
  const core::Tensor& operator[](const std::string& name) const;
  core::Tensor& operator[](const std::string& name);
  // Replaces or appends a field.
  void set(const std::string& name, core::Tensor tensor);
};

}  // namespace mpigrad::data
