// Batches by atom count instead of structure count: AtomBudgetBatchSampler walks the epoch's
// order of structures (a permutation from seed + epoch with shuffle, else in order) and closes a
// batch when adding the next structure would take it past `max_atoms`. Graph networks cost in
// proportion to atoms and edges, so a budget keeps every step's work and memory about the same
// where a fixed count of structures would swing with their sizes.
//
// Distributed use follows the other samplers' rules (data/multi_dataset.h): the global list of
// batches is built identically on every rank, then split by whole batches, rank r taking batches
// r, r + R, ...; drop_last = false pads the list by repeating it from its start, drop_last = true
// truncates it, so every rank yields the same number of batches. With shuffle the number of
// batches can change from epoch to epoch (size() is the current epoch's).
//
// A structure with more atoms than max_atoms is an error naming it: no batch could hold it.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "mpigrad/data/sampler.h"

namespace mpigrad::data {

struct AtomBudgetOptions {
  int64_t max_atoms = 0;  // > 0: atoms a batch may hold
  bool shuffle = false;
  uint64_t seed = 0;
  int64_t num_replicas = 1;
  int64_t rank = 0;
  bool drop_last = false;
};

class AtomBudgetBatchSampler : public BatchSamplerBase {
 public:
  // atom_counts[i]: the atoms of sample i (data/atomic_dataset.h: dataset_atom_counts).
  AtomBudgetBatchSampler(std::vector<int64_t> atom_counts, AtomBudgetOptions options);

  int64_t size() const override;  // batches this rank yields in the current epoch
  std::vector<std::vector<int64_t>> batches() const override;
  void set_epoch(int64_t epoch) override { epoch_ = epoch; }
  bool is_distributed() const override { return options_.num_replicas > 1; }

  int64_t num_replicas() const { return options_.num_replicas; }
  int64_t rank() const { return options_.rank; }
  int64_t epoch() const { return epoch_; }
  int64_t max_atoms() const { return options_.max_atoms; }
  // The current epoch's batches before the split across ranks, and with padding or truncation.
  std::vector<std::vector<int64_t>> grouped() const;
  std::vector<std::vector<int64_t>> global_batches_list() const;

 private:
  std::vector<int64_t> counts_;
  AtomBudgetOptions options_;
  int64_t epoch_ = 0;
  // The grouping of one epoch, computed once (size() and batches() both need it).
  mutable std::mutex mutex_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<std::vector<int64_t>> cached_;
};

static_assert(DistributedSamplerLike<AtomBudgetBatchSampler>);

}  // namespace mpigrad::data
