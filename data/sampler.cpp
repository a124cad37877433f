#include "mpigrad/data/sampler.h"

#include <unistd.h>

#include <algorithm>
#include <numeric>

#include "mpigrad/core/checked_math.h"
#include "mpigrad/core/error.h"
#include "mpigrad/kernels/philox.h"

namespace mpigrad::data {

namespace {

__extension__ typedef unsigned __int128 UInt128;  // GCC and Clang; exact 64x64 -> 128 multiply

// Draw k of the Philox stream for `seed` as a uniform integer in [0, bound): a 64-bit word
// (two stream words) scaled by multiplication, whose bias (< bound / 2^64) is negligible.
class UniformIntegers {
 public:
  explicit UniformIntegers(uint64_t seed) : seed_(seed) {}
  uint64_t next(uint64_t bound) {
    if (lane_ == 4) {
      block_ = kernels::philox_block(seed_, counter_++);
      lane_ = 0;
    }
    uint64_t bits = (uint64_t(block_.word[lane_]) << 32) | block_.word[lane_ + 1];
    lane_ += 2;
    return uint64_t((static_cast<UInt128>(bits) * bound) >> 64);
  }

 private:
  uint64_t seed_;
  uint64_t counter_ = 0;
  kernels::PhiloxBlock block_{};
  int lane_ = 4;
};

// An epoch's order is materialized as int64 indices (PyTorch does the same with randperm). A
// dataset whose size would make that list outgrow the machine is refused up front, naming the
// size, instead of failing in an allocation (or being killed by the OOM killer) mid-run.
// `indices` is how many int64 an epoch holds at once for `samples` samples.
void check_index_memory(int64_t samples, int64_t indices, const char* who) {
  const long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_bytes <= 0) return;  // unknown: nothing to compare with
  const double memory = double(pages) * double(page_bytes);
  const double needed = double(indices) * double(sizeof(int64_t));
  MPIGRAD_CHECK(needed <= memory / 2, who, ": an epoch's order of ", samples, " samples needs ",
                needed / double(1 << 30),
                " GiB of indices, more than half of "
                "this machine's ",
                memory / double(1 << 30),
                " GiB of memory; use a subset of the "
                "data (fewer samples per file, or fewer shards)");
}

}  // namespace

std::vector<int64_t> random_permutation(int64_t n, uint64_t seed) {
  MPIGRAD_CHECK(n >= 0, "random_permutation: negative size ", n);
  std::vector<int64_t> permutation(static_cast<size_t>(n));
  std::iota(permutation.begin(), permutation.end(), 0);
  UniformIntegers uniform(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    int64_t j = int64_t(uniform.next(uint64_t(i + 1)));
    std::swap(permutation[size_t(i)], permutation[size_t(j)]);
  }
  return permutation;
}

// ---- SequentialSampler / RandomSampler ----------------------------------------------------------

SequentialSampler::SequentialSampler(int64_t size) : size_(size) {
  MPIGRAD_CHECK(size >= 0, "SequentialSampler: negative dataset size ", size);
  check_index_memory(size, size, "SequentialSampler");
}

std::vector<int64_t> SequentialSampler::indices() const {
  std::vector<int64_t> order(static_cast<size_t>(size_));
  std::iota(order.begin(), order.end(), 0);
  return order;
}

RandomSampler::RandomSampler(int64_t dataset_size, uint64_t seed, bool replacement,
                             int64_t num_samples)
    : dataset_size_(dataset_size),
      seed_(seed),
      replacement_(replacement),
      num_samples_(num_samples < 0 ? dataset_size : num_samples) {
  MPIGRAD_CHECK(dataset_size >= 0, "RandomSampler: negative dataset size ", dataset_size);
  MPIGRAD_CHECK(replacement || num_samples_ <= dataset_size, "RandomSampler: num_samples ",
                num_samples_, " exceeds the dataset's ", dataset_size,
                " samples; that needs replacement = true");
  MPIGRAD_CHECK(num_samples_ == 0 || dataset_size > 0,
                "RandomSampler: cannot draw from an empty dataset");
  check_index_memory(dataset_size, std::max(num_samples_, replacement ? 0 : dataset_size),
                     "RandomSampler");
}

std::vector<int64_t> RandomSampler::indices() const {
  uint64_t seed = seed_ + uint64_t(epoch_);
  if (!replacement_) {
    std::vector<int64_t> order = random_permutation(dataset_size_, seed);
    order.resize(size_t(num_samples_));
    return order;
  }
  std::vector<int64_t> draws(static_cast<size_t>(num_samples_));
  UniformIntegers uniform(seed);
  for (auto& draw : draws) draw = int64_t(uniform.next(uint64_t(dataset_size_)));
  return draws;
}

// ---- DistributedSampler -------------------------------------------------------------------------

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t num_replicas, int64_t rank,
                                       bool shuffle, uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  MPIGRAD_CHECK(num_replicas >= 1, "DistributedSampler: num_replicas must be >= 1, got ",
                num_replicas);
  MPIGRAD_CHECK(rank >= 0 && rank < num_replicas, "DistributedSampler: rank ", rank,
                " outside [0, ", num_replicas, ")");
  MPIGRAD_CHECK(dataset_size >= num_replicas, "DistributedSampler: the dataset has ", dataset_size,
                " samples, fewer than the ", num_replicas,
                " ranks; every rank needs at least one sample");
  // PyTorch: with drop_last the tail is dropped so every rank gets the same count, otherwise
  // ceil(N / R) each with padding.
  if (drop_last && dataset_size % num_replicas != 0) {
    num_samples_ = (dataset_size - num_replicas + num_replicas - 1) / num_replicas;
  } else {
    num_samples_ = core::ceil_div(dataset_size, num_replicas);
  }
  // indices() holds the whole padded order, then this rank's share.
  check_index_memory(
      dataset_size,
      core::checked_add(std::max(dataset_size, total_size()), num_samples_,
                        "DistributedSampler: the indices of ", dataset_size, " samples"),
      "DistributedSampler");
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> all;
  if (shuffle_) {
    all = random_permutation(dataset_size_, seed_ + uint64_t(epoch_));
  } else {
    all.resize(size_t(dataset_size_));
    std::iota(all.begin(), all.end(), 0);
  }
  const size_t total = size_t(total_size());
  if (!drop_last_) {
    // Repeat from the start (several times over when the padding exceeds the list).
    const size_t original = all.size();
    all.reserve(total);
    for (size_t i = original; i < total; ++i) all.push_back(all[i % original]);
  } else {
    all.resize(total);
  }
  std::vector<int64_t> mine;
  mine.reserve(size_t(num_samples_));
  for (size_t i = size_t(rank_); i < total; i += size_t(num_replicas_)) mine.push_back(all[i]);
  return mine;
}

// ---- BatchSampler -------------------------------------------------------------------------------

BatchSampler::BatchSampler(std::shared_ptr<Sampler> sampler, int64_t batch_size, bool drop_last)
    : sampler_(std::move(sampler)), batch_size_(batch_size), drop_last_(drop_last) {
  MPIGRAD_CHECK(sampler_ != nullptr, "BatchSampler: no sampler given");
  MPIGRAD_CHECK(batch_size >= 1, "BatchSampler: batch_size must be >= 1, got ", batch_size);
}

int64_t BatchSampler::size() const {
  int64_t n = sampler_->size();
  return drop_last_ ? n / batch_size_ : core::ceil_div(n, batch_size_);  // no n + batch_size
}

std::vector<std::vector<int64_t>> BatchSampler::batches() const {
  std::vector<int64_t> order = sampler_->indices();
  std::vector<std::vector<int64_t>> result;
  for (size_t start = 0; start < order.size(); start += size_t(batch_size_)) {
    size_t end = std::min(order.size(), start + size_t(batch_size_));
    if (drop_last_ && end - start < size_t(batch_size_)) break;
    result.emplace_back(order.begin() + std::ptrdiff_t(start), order.begin() + std::ptrdiff_t(end));
  }
  return result;
}

int64_t batches_per_rank(int64_t global_batches, int64_t ranks, bool drop_last) {
  return drop_last ? global_batches / ranks : (global_batches + ranks - 1) / ranks;
}

void even_out_batches(std::vector<std::vector<int64_t>>& batches, int64_t per_rank, int64_t ranks,
                      bool drop_last) {
  const size_t original = batches.size(), total = size_t(per_rank * ranks);
  if (drop_last) {
    batches.resize(total);
  } else {
    for (size_t i = original; i < total; ++i) batches.push_back(batches[i % original]);
  }
}

std::vector<std::vector<int64_t>> rank_batches(std::vector<std::vector<int64_t>> all, int64_t rank,
                                               int64_t ranks) {
  std::vector<std::vector<int64_t>> mine;
  for (size_t i = size_t(rank); i < all.size(); i += size_t(ranks))
    mine.push_back(std::move(all[i]));
  return mine;
}

}  // namespace mpigrad::data
