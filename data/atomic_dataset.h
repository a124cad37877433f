// A Dataset over one atomic store (data/atomic_store.h: ALCHEMI's Zarr v3 layout, or the same in
// HDF5): index i is the store's i-th structure that is not soft-deleted, as in ALCHEMI's reader.
//
// get_batch(indices) returns the ragged batch of B = indices.size() structures, in that order:
//   positions       float32 [V, 3]   atoms of the B structures concatenated in batch order
//   atomic_numbers  int64   [V]
//   batch           int64   [V]      each atom's structure, 0..B-1
//   atoms_ptr       int64   [B+1]    0, n0, n0+n1, ...
//   num_atoms       int64   [B]
//   energy          float32 [B]      when stored (ALCHEMI's [S, 1] becomes [B])
//   forces          float32 [V, 3]   when stored
//   cell            float32 [B,3,3]  rows are the lattice vectors; zeros when not stored
//   pbc             bool    [B, 3]   false when not stored
//   stress          float32 [B,3,3]  when stored
//   edge_index      int64   [2, E]   when the store holds neighbor_list: row 0 the source
//   (ALCHEMI's
//                                    sender, neighbor_list[:, 0]), row 1 the target, as rows of
//                                    this batch's atoms (the store's rows minus the structure's
//                                    atoms_ptr, plus its first atom here)
//   edge_shifts     float32 [E, 3]   with edge_index: Cartesian image shifts, the store's `shifts`,
//                                    else its integer neighbor_list_shifts times the cell, else 0
//   edges_ptr       int64   [B+1]    whenever the batch has edge fields
//   then every other core/ and custom/ field as stored: atom [V, ...], edge [E, ...], system
//   [B, ...]. The vector of edge k is positions[edge_index[1][k]] - positions[edge_index[0][k]]
//   + edge_shifts[k]. The known fields are converted to the dtypes above; the others keep theirs.
// A batch reads only its own structures' rows (each rank reads only its share), through the
// store's cache of decoded chunks. Errors name the store and the array: a field whose shape does
// not fit its meaning (positions not [V, 3], ...) when the dataset is built, a neighbor_list
// entry outside its structure's atoms when it is read.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mpigrad/data/atomic_store.h"
#include "mpigrad/data/dataset.h"

namespace mpigrad::data {

struct AtomicDatasetOptions {
  // Store fields to read (by name, as "forces" or "neighbor_list"); empty: all of them.
  // positions and atomic_numbers are always read.
  std::vector<std::string> fields;
  int64_t cache_bytes = int64_t(64) << 20;  // the store's cache of decoded chunks
};

class AtomicDataset : public Dataset {
 public:
  explicit AtomicDataset(const std::string& path, AtomicDatasetOptions options = {});
  explicit AtomicDataset(std::shared_ptr<const AtomicStore> store,
                         AtomicDatasetOptions options = {});

  int64_t size() const override { return int64_t(store_->active().size()); }
  const std::vector<FieldInfo>& fields() const override { return fields_; }
  Batch get_batch(std::span<const int64_t> indices) const override;
  std::string describe() const override;

  const AtomicStore& store() const { return *store_; }
  int64_t num_atoms(int64_t index) const;
  std::vector<int64_t> atom_counts() const;  // of every index, in order

 private:
  // How a batch field is made from the store.
  struct Source {
    FieldInfo info;
    const StoreField* stored = nullptr;  // the field read (null for derived fields)
  };
  void check_shape(const StoreField& field, std::initializer_list<int64_t> row,
                   const char* meaning) const;
  core::Tensor read_field(const StoreField& field, const std::vector<int64_t>& samples,
                          core::DType dtype) const;

  std::shared_ptr<const AtomicStore> store_;
  std::vector<Source> sources_;
  std::vector<FieldInfo> fields_;
  const StoreField* neighbor_list_ = nullptr;
  const StoreField* shifts_ = nullptr;       // Cartesian
  const StoreField* unit_shifts_ = nullptr;  // integer image offsets
  const StoreField* cell_ = nullptr;
  const StoreField* shift_cell_ = nullptr;  // the cell unit_shifts_ are in
};

// Each sample's atom count, for a dataset of structures: an AtomicDataset, or a MultiDataset of
// them; empty for any other dataset.
std::vector<int64_t> dataset_atom_counts(const Dataset& dataset);

}  // namespace mpigrad::data
