// What a run trains on, from the paths `[data] train` (or test) lists: one place that tells the
// two kinds of data apart and builds the dataset and the order of its batches.
//   - atomic stores (a Zarr v3 folder, or an HDF5 file with groups meta/ and core/): one store is
//     an AtomicDataset, several a MultiDataset of them (each store a child, in the order given);
//   - plain HDF5 files: one Hdf5Dataset, the files being its shards, joined in order.
// A list mixing the two kinds is an error naming a path of each.
//
// make_batch_sampler() gives the order of batches such a dataset needs on `num_replicas` ranks:
// an atom budget (max_atoms > 0) over atomic data, ALCHEMI's MultiDatasetBatchSampler over several
// stores, else whole batches of batch_size samples from a DistributedSampler (or a plain sampler
// on one rank), PyTorch's rules. Every rank yields the same number of batches.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mpigrad/data/atomic_dataset.h"
#include "mpigrad/data/dataset.h"
#include "mpigrad/data/hdf5_dataset.h"
#include "mpigrad/data/multi_dataset.h"
#include "mpigrad/data/sampler.h"

namespace mpigrad::data {

struct TrainingDataOptions {
  Hdf5DatasetOptions hdf5;      // plain HDF5 files
  AtomicDatasetOptions atomic;  // atomic stores
};

// True for an atomic store (AtomicStore::detect); throws for a path that does not exist.
bool is_atomic_store(const std::string& path);

std::shared_ptr<Dataset> open_training_data(const std::vector<std::string>& paths,
                                            const TrainingDataOptions& options = {});

struct BatchingOptions {
  int64_t batch_size = 1;  // structures (samples) per batch, unless max_atoms
  int64_t max_atoms = 0;   // > 0: batches by atom budget (atomic data only)
  // Several atomic stores: each batch's share of each store (ALCHEMI's samples_per_dataset;
  // default: in proportion to their sizes), the epoch's length and whether draws repeat.
  std::optional<BatchComposition> samples_per_dataset;
  EpochPolicy epoch_policy = EpochPolicy::DatasetSize;
  bool replacement = true;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
  int64_t num_replicas = 1;
  int64_t rank = 0;
};

// Never null. Throws core::Error for max_atoms over data without atoms, for max_atoms together
// with samples_per_dataset (a batch cannot have both a fixed mix and a budget), and for
// samples_per_dataset over a single dataset.
std::shared_ptr<BatchSamplerBase> make_batch_sampler(const Dataset& dataset,
                                                     const BatchingOptions& options);

}  // namespace mpigrad::data
