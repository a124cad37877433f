#include "mpigrad/data/atom_budget_sampler.h"

#include <numeric>

#include "mpigrad/core/error.h"

namespace mpigrad::data {

AtomBudgetBatchSampler::AtomBudgetBatchSampler(std::vector<int64_t> atom_counts,
                                               AtomBudgetOptions options)
    : counts_(std::move(atom_counts)), options_(options) {
  MPIGRAD_CHECK(options_.max_atoms >= 1, "AtomBudgetBatchSampler: max_atoms must be >= 1, got ",
                options_.max_atoms);
  MPIGRAD_CHECK(
      options_.num_replicas >= 1 && options_.rank >= 0 && options_.rank < options_.num_replicas,
      "AtomBudgetBatchSampler: rank ", options_.rank, " outside [0, ", options_.num_replicas, ")");
  MPIGRAD_CHECK(!counts_.empty(), "AtomBudgetBatchSampler: no structures");
  for (size_t i = 0; i < counts_.size(); ++i) {
    MPIGRAD_CHECK(counts_[i] >= 0, "AtomBudgetBatchSampler: structure ", i, " has ", counts_[i],
                  " atoms");
    MPIGRAD_CHECK(counts_[i] <= options_.max_atoms, "AtomBudgetBatchSampler: structure ", i,
                  " has ", counts_[i], " atoms, more than max_atoms = ", options_.max_atoms,
                  "; no batch can hold it (raise max_atoms)");
  }
  const int64_t batches = int64_t(grouped().size());
  MPIGRAD_CHECK(!options_.drop_last || batches >= options_.num_replicas,
                "AtomBudgetBatchSampler: ", batches, " batches of at most ", options_.max_atoms,
                " atoms, fewer than the ", options_.num_replicas,
                " ranks, and drop_last leaves none (use drop_last = false or a smaller max_atoms)");
}

std::vector<std::vector<int64_t>> AtomBudgetBatchSampler::grouped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (cached_epoch_ == epoch_) return cached_;
  const int64_t n = int64_t(counts_.size());
  std::vector<int64_t> order;
  if (options_.shuffle) {
    order = random_permutation(n, options_.seed + uint64_t(epoch_));
  } else {
    order.resize(size_t(n));
    std::iota(order.begin(), order.end(), 0);
  }
  std::vector<std::vector<int64_t>> batches;
  int64_t atoms = 0;
  for (int64_t index : order) {
    const int64_t count = counts_[size_t(index)];
    if (batches.empty() || atoms + count > options_.max_atoms) {
      batches.emplace_back();
      atoms = 0;
    }
    batches.back().push_back(index);
    atoms += count;
  }
  cached_ = std::move(batches);
  cached_epoch_ = epoch_;
  return cached_;
}

int64_t AtomBudgetBatchSampler::size() const {
  return batches_per_rank(int64_t(grouped().size()), options_.num_replicas, options_.drop_last);
}

std::vector<std::vector<int64_t>> AtomBudgetBatchSampler::global_batches_list() const {
  std::vector<std::vector<int64_t>> batches = grouped();
  even_out_batches(batches, size(), options_.num_replicas, options_.drop_last);
  return batches;
}

std::vector<std::vector<int64_t>> AtomBudgetBatchSampler::batches() const {
  return rank_batches(global_batches_list(), options_.rank, options_.num_replicas);
}

}  // namespace mpigrad::data
