// Samplers decide which sample indices an epoch visits and in what order; batch samplers group
// them into batches. The semantics are PyTorch's (torch.utils.data), so a job moved from PyTorch
// shards its data the same way:
// - DistributedSampler pads the index list to num_samples * num_replicas by repeating it from its
//   start (drop_last = false) or truncates it to that length (drop_last = true, num_samples =
//   ceil((N - R) / R)), and rank r takes indices[r::R].
// - The order of an epoch is a pure function of seed + epoch, identical on every rank; call
//   set_epoch at the start of each epoch (the DataLoader forwards its own set_epoch).
//
// The shuffle is a Fisher-Yates permutation driven by core's counter-based Philox stream keyed
// by seed + epoch, so it is deterministic and the same on every platform and compiler. It is not
// bit-identical to torch.randperm (a different generator); the sharding and padding arithmetic
// around it is exactly PyTorch's.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <vector>

namespace mpigrad::data {

// A permutation of [0, n) determined by `seed` alone.
std::vector<int64_t> random_permutation(int64_t n, uint64_t seed);

// Anything that shards by rank: a loader given one keeps it instead of wrapping it again.
template <typename T>
concept DistributedSamplerLike = requires(T& sampler, const T& const_sampler, int64_t epoch) {
  { const_sampler.num_replicas() } -> std::convertible_to<int64_t>;
  { const_sampler.rank() } -> std::convertible_to<int64_t>;
  sampler.set_epoch(epoch);
};

// Yields sample indices.
class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual int64_t size() const = 0;                  // indices per epoch (len())
  virtual std::vector<int64_t> indices() const = 0;  // this epoch's indices, in order
  virtual void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  // True for samplers that already give this rank only its own share.
  virtual bool is_distributed() const { return false; }

 protected:
  int64_t epoch_ = 0;
};

class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t size);
  int64_t size() const override { return size_; }
  std::vector<int64_t> indices() const override;

 private:
  int64_t size_;
};

// A fresh permutation per epoch (from seed + epoch); with replacement, num_samples uniform draws.
class RandomSampler : public Sampler {
 public:
  explicit RandomSampler(int64_t dataset_size, uint64_t seed = 0, bool replacement = false,
                         int64_t num_samples = -1);  // -1: dataset_size
  int64_t size() const override { return num_samples_; }
  std::vector<int64_t> indices() const override;

 private:
  int64_t dataset_size_;
  uint64_t seed_;
  bool replacement_;
  int64_t num_samples_;
};

class DistributedSampler : public Sampler {
 public:
  // Throws when the dataset has fewer samples than ranks (a rank would get nothing, or only
  // padding) or when rank is outside [0, num_replicas).
  DistributedSampler(int64_t dataset_size, int64_t num_replicas, int64_t rank, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false);
  int64_t size() const override { return num_samples_; }
  std::vector<int64_t> indices() const override;
  bool is_distributed() const override { return true; }

  int64_t num_replicas() const { return num_replicas_; }
  int64_t rank() const { return rank_; }
  int64_t total_size() const { return num_samples_ * num_replicas_; }

 private:
  int64_t dataset_size_, num_replicas_, rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t num_samples_;
};

static_assert(DistributedSamplerLike<DistributedSampler>);

// Yields batches of sample indices.
class BatchSamplerBase {
 public:
  virtual ~BatchSamplerBase() = default;
  virtual int64_t size() const = 0;  // batches per epoch
  virtual std::vector<std::vector<int64_t>> batches() const = 0;
  virtual void set_epoch(int64_t epoch) = 0;
  virtual bool is_distributed() const { return false; }
};

// Groups a sampler's indices into batches of batch_size; the last one is smaller, or dropped
// with drop_last.
class BatchSampler : public BatchSamplerBase {
 public:
  BatchSampler(std::shared_ptr<Sampler> sampler, int64_t batch_size, bool drop_last);
  int64_t size() const override;
  std::vector<std::vector<int64_t>> batches() const override;
  void set_epoch(int64_t epoch) override { sampler_->set_epoch(epoch); }
  bool is_distributed() const override { return sampler_->is_distributed(); }
  const std::shared_ptr<Sampler>& sampler() const { return sampler_; }

 private:
  std::shared_ptr<Sampler> sampler_;
  int64_t batch_size_;
  bool drop_last_;
};

// Whole batches shared among ranks the way DistributedSampler shares samples (the samplers of
// ragged batches use these): each rank gets batches_per_rank(...) of them; even_out_batches
// makes the global list that many times `ranks` long, repeating batches from the start or, with
// drop_last, cutting the tail; rank r takes batches r, r + ranks, ...
int64_t batches_per_rank(int64_t global_batches, int64_t ranks, bool drop_last);
void even_out_batches(std::vector<std::vector<int64_t>>& batches, int64_t per_rank, int64_t ranks,
                      bool drop_last);
std::vector<std::vector<int64_t>> rank_batches(std::vector<std::vector<int64_t>> all, int64_t rank,
                                               int64_t ranks);

}  // namespace mpigrad::data
