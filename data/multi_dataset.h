// Training on several datasets at once with a controlled mix per batch.
//
// MultiDataset joins child datasets into one index space (child 0's samples first); to_global and
// to_local convert, and every batch it yields carries each sample's dataset_index.
//
// MultiDatasetBatchSampler fixes how many samples of each child every batch holds, with the rules
// of ALCHEMI's MultiDatasetBatchSampler (nvalchemi.data.datapipes.samplers), each pinned by
// tests/data/test_multi_dataset.cpp:
// - from `weights` (default: the child sizes) or from `samples_per_dataset`, never both;
//   samples_per_dataset of integers are exact counts that must sum to the batch size; a single
//   float makes the whole list ratios; ratios and weights become counts by largest remainder
//   (ties to the lower dataset index); BatchComposition::balanced() gives equal shares. A child
//   with a positive weight, ratio or count but no samples is an error.
// - The epoch's length, with k_d samples of child d (n_d samples) per batch, over the children
//   with k_d > 0: c_d = ceil(n_d / k_d) with replacement, floor(n_d / k_d) without, and
//     dataset_size: ceil(sum n_d / batch_size) batches with replacement; without, min_size's;
//     min_size:     min over d of c_d, ending when the first child runs out;
//     max_size:     max over d of c_d; without replacement an error unless every c_d is equal.
//   `num_batches` > 0 replaces the policy; without replacement it may not exceed min c_d.
// - Without replacement each child is walked through an order of its samples (a permutation
//   from seed + epoch with shuffle, else in order), k_d at a time. With replacement, each batch
//   draws its k_d samples uniformly (shuffle), or walks each child in order, wrapping around
//   (no shuffle). With shuffle each batch's samples are then shuffled among themselves.
// - The global list of batches is built first, identically on every rank, then split by whole
//   batches: rank r takes batches r, r + R, ... With drop_last = false the list is padded by
//   repeating it from its start so every rank yields the same number of batches; with
//   drop_last = true the tail is truncated (fewer batches than ranks is then an error here, where
//   ALCHEMI would give every rank an empty epoch).
// The random streams are mpigrad's (Philox), not torch's, so orders differ from ALCHEMI's while
// following the same rules.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "mpigrad/core/enum_names.h"
#include "mpigrad/data/dataset.h"
#include "mpigrad/data/sampler.h"

namespace mpigrad::data {

class MultiDataset : public Dataset {
 public:
  // The children must agree on their fields (names, dtypes, per-sample shapes and levels). Ragged
  // children (atomic datasets) are joined structure by structure (data/ragged_batch.h).
  explicit MultiDataset(std::vector<std::shared_ptr<Dataset>> children);

  int64_t size() const override { return offsets_.back(); }
  const std::vector<FieldInfo>& fields() const override { return children_[0]->fields(); }
  // Reads each child's samples in one get_batch call; sets Batch::dataset_index.
  Batch get_batch(std::span<const int64_t> indices) const override;
  std::string describe() const override;

  int num_datasets() const { return int(children_.size()); }
  const Dataset& child(int dataset) const { return *children_.at(size_t(dataset)); }
  std::vector<int64_t> sizes() const;
  int64_t to_global(int dataset, int64_t local) const;
  std::pair<int, int64_t> to_local(int64_t global) const;  // (dataset, local index)

 private:
  std::vector<std::shared_ptr<Dataset>> children_;
  std::vector<int64_t> offsets_;  // offsets_[d] = first global index of child d; back() = size
};

enum class EpochPolicy { DatasetSize, MinSize, MaxSize };
inline constexpr core::EnumName<EpochPolicy> kEpochPolicyNames[] = {
    {EpochPolicy::DatasetSize, "dataset_size"},
    {EpochPolicy::MinSize, "min_size"},
    {EpochPolicy::MaxSize, "max_size"}};
// "dataset_size", "min_size" or "max_size"; anything else is a core::Error listing them.
EpochPolicy parse_epoch_policy(const std::string& text);
std::string epoch_policy_name(EpochPolicy policy);

// `total` split in proportion to `weights` by largest remainder: floors first, then one more to
// the largest fractional parts (ties to the lower index). Weights must be >= 0 with a positive sum.
std::vector<int64_t> largest_remainder(const std::vector<double>& weights, int64_t total);

// samples_per_dataset: exact counts, ratios, or balanced.
class BatchComposition {
 public:
  static BatchComposition counts(std::vector<int64_t> counts);
  static BatchComposition ratios(std::vector<double> ratios);
  static BatchComposition balanced();
  // Python-like values: integers are counts unless any value is a float.
  static BatchComposition from_values(const std::vector<std::variant<int64_t, double>>& values);
  // "16,16" (counts), "0.7,0.3" or "2,1.0" (ratios: a decimal point or exponent makes a float),
  // or "balanced".
  static BatchComposition parse(const std::string& text);

  // Samples of each of num_datasets datasets in a batch of batch_size.
  std::vector<int64_t> resolve(int64_t batch_size, int num_datasets) const;
  std::string str() const;
  // As parse() reads it back: "16,16", "0.7,0.3" (ratios always with a decimal point), "balanced".
  std::string text() const;
  // The ratios, for a composition of ratios (empty otherwise).
  const std::vector<double>& ratio_values() const { return ratios_; }

 private:
  enum class Kind { Counts, Ratios, Balanced };
  Kind kind_ = Kind::Balanced;
  std::vector<int64_t> counts_;
  std::vector<double> ratios_;
};

struct MultiDatasetBatchSamplerOptions {
  int64_t batch_size = 1;
  std::optional<std::vector<double>> weights;           // default: the child sizes
  std::optional<BatchComposition> samples_per_dataset;  // exclusive with weights
  bool replacement = true;                              // ALCHEMI's default
  bool shuffle = true;  // random orders and draws, and samples shuffled within each batch
  EpochPolicy epoch_policy = EpochPolicy::DatasetSize;
  int64_t num_batches = 0;  // > 0: batches per epoch (before the split), instead of the policy
  int64_t num_replicas = 1;
  int64_t rank = 0;
  bool drop_last = false;
  uint64_t seed = 0;
};

class MultiDatasetBatchSampler : public BatchSamplerBase {
 public:
  MultiDatasetBatchSampler(std::vector<int64_t> dataset_sizes,
                           MultiDatasetBatchSamplerOptions options);
  MultiDatasetBatchSampler(const MultiDataset& dataset, MultiDatasetBatchSamplerOptions options)
      : MultiDatasetBatchSampler(dataset.sizes(), std::move(options)) {}

  int64_t size() const override;  // batches this rank yields per epoch
  // This rank's batches of global (MultiDataset) indices for the current epoch.
  std::vector<std::vector<int64_t>> batches() const override;
  void set_epoch(int64_t epoch) override { epoch_ = epoch; }
  bool is_distributed() const override { return options_.num_replicas > 1; }

  int64_t num_replicas() const { return options_.num_replicas; }
  int64_t rank() const { return options_.rank; }
  int64_t epoch() const { return epoch_; }
  const std::vector<int64_t>& samples_per_batch() const { return per_batch_; }  // per dataset
  int64_t global_batches() const { return global_batches_; }  // before splitting across ranks
  // Every rank's batches in global order (padded or truncated), before the split.
  std::vector<std::vector<int64_t>> global_batches_list() const;

 private:
  std::vector<int64_t> sizes_;
  std::vector<int64_t> offsets_;
  MultiDatasetBatchSamplerOptions options_;
  std::vector<int64_t> per_batch_;
  int64_t global_batches_ = 0;
  int64_t epoch_ = 0;
};

static_assert(DistributedSamplerLike<MultiDatasetBatchSampler>);

}  // namespace mpigrad::data
