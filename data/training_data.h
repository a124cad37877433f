// Opening the atomic data of `[data] train` and `[data] test` for interatomic potentials: stores
// in ALCHEMI's layout (meta/atoms_ptr, core/<field>, ...), as a Dataset whose batches are ragged
// (the layout of docs/interatomic-potentials.md: positions [V, 3], atomic_numbers [V], batch
// [V], atoms_ptr [B + 1], num_atoms [B], energy [B], forces [V, 3], cell [B, 3, 3], pbc [B, 3],
// stress [B, 3, 3], and edge_index [2, E], edge_shifts [E, 3], edges_ptr [B + 1] when the store
// holds a neighbor_list).
//
// INTERFACE FOR ISSUE 35'S DATA PART. `mpigrad train` (launch/commands/checked_run.cpp) opens
// atomic data through this one function. data/training_data_stub.cpp is a stand-in until the
// data part (the Zarr and HDF5 readers, AtomicDataset, the multi-store sampler) is merged: it
// reads one HDF5 file in that layout whole into memory. The data part replaces the stub with its
// own implementation of this declaration and deletes the stub.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mpigrad/data/dataset.h"

namespace mpigrad::data {

struct TrainingDataRequest {
  std::vector<std::string> paths;  // the stores of the key, in order
  std::string key;                 // "[data] train": what errors name
  int64_t rank = 0;                // this rank among `ranks` (each may read only its share)
  int64_t ranks = 1;
};

// The stores as one Dataset of structures. core::Error naming the key, the store and the array
// for a store that cannot be read.
std::shared_ptr<Dataset> open_training_data(const TrainingDataRequest& request);

}  // namespace mpigrad::data
