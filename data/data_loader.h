// Iterates a Dataset in batches, PyTorch-style:
//     DataLoader loader(dataset, {.batch_size = 64, .shuffle = true, .num_workers = 2});
//     for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//       loader.set_epoch(epoch);                 // reshuffles (seed + epoch) on every rank alike
//       for (Batch& batch : loader) train_step(batch["x"], batch["y"]);
//     }
//
// The order of batches comes from a batch sampler: the one given, or BatchSampler over the
// sampler given, or over a SequentialSampler / RandomSampler (shuffle) / DistributedSampler
// (num_replicas > 1) built from the options. A sampler that is already distributed is kept as
// it is. Giving both sampler and batch_sampler is an error, as in PyTorch.
//
// With num_workers > 0, background threads read up to num_workers * prefetch_factor batches
// ahead while the trainer computes. Each batch's content depends only on its indices, and
// batches are handed out strictly in sampler order, so the sequence is identical whatever the
// number of threads. A worker's exception is rethrown by the iteration that reaches its batch.
//
// The optional transform runs in the worker, on each batch (for example uint8 images to
// normalized float32, see data/transforms.h); the batch carries the epoch it was read for
// (Batch::epoch), which per-epoch augmentations draw from (data/augment.h).
//
// Device: with `device` a CUDA device (e.g. DistributedManager::device()), every batch arrives
// on it, and nothing waits on the host for the copy. The thread that loads a batch (a worker, or
// the caller's with num_workers = 0) stages its fields, after the transform, in pinned host
// memory and copies them with non_blocking copies on the loader's own copy stream; next() then
// makes the caller's current stream of that device wait for those copies (an event) and records
// the fields as used on it, so ops queued there see the data and the memory is not reused under
// them (data/device_batch_copier.h). A batch used on another stream needs that stream ordered by
// the caller (an Event recorded after next()) and core::record_stream. The copies of up to
// num_workers * prefetch_factor batches overlap the training step. Fields only are moved;
// indices and dataset_index stay on the host. A device that is not visible is a core::Error when
// the loader is built.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "mpigrad/core/device.h"
#include "mpigrad/data/dataset.h"
#include "mpigrad/data/device_batch_copier.h"
#include "mpigrad/data/sampler.h"

namespace mpigrad::data {

using BatchTransform = std::function<Batch(Batch)>;

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;
  bool drop_last = false;
  uint64_t seed = 0;
  std::shared_ptr<Sampler> sampler;                 // exclusive with batch_sampler
  std::shared_ptr<BatchSamplerBase> batch_sampler;  // batch_size/shuffle/drop_last then unused
  // With num_replicas > 1 and no sampler, a DistributedSampler(num_replicas, rank, shuffle, seed,
  // drop_last) is made; a sampler given must then already be distributed.
  int64_t num_replicas = 1;
  int64_t rank = 0;
  int num_workers = 0;      // 0: batches are read by the iterating thread
  int prefetch_factor = 2;  // batches in flight per worker
  BatchTransform transform;
  core::Device device = core::kCPU;  // where the batches' fields arrive (see above)
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {});
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  int64_t size() const { return batch_sampler_->size(); }  // batches per epoch on this rank
  // Forwarded to the sampler; takes effect at the next begin().
  void set_epoch(int64_t epoch);
  // Replaces the order of batches (DDPHook installs a distributed one); ends an epoch in progress.
  void set_batch_sampler(std::shared_ptr<BatchSamplerBase> batch_sampler);
  const DataLoaderOptions& options() const { return options_; }
  int64_t epoch() const { return epoch_; }
  // The next begin() starts at batch `step` of the epoch instead of 0 (resuming a run); applies
  // once.
  void set_epoch_step(int64_t step);

  // Explicit iteration: start() begins an epoch (ending any running one), next() returns the
  // batches in order and then nullopt.
  void start();
  std::optional<Batch> next();

  class Iterator {
   public:
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    Iterator() = default;
    Batch& operator*() { return *current_; }
    Batch* operator->() { return &*current_; }
    Iterator& operator++();
    bool operator==(const Iterator& other) const { return done() == other.done(); }

   private:
    friend class DataLoader;
    explicit Iterator(DataLoader* loader);
    bool done() const { return !current_.has_value(); }
    DataLoader* loader_ = nullptr;
    std::optional<Batch> current_;
  };
  Iterator begin();  // calls start()
  Iterator end() { return Iterator(); }

  const Dataset& dataset() const { return *dataset_; }
  const BatchSamplerBase& batch_sampler() const { return *batch_sampler_; }
  // Seconds next() spent waiting for a batch since the last start(): the trainer's data stall.
  double wait_seconds() const { return wait_seconds_; }

 private:
  struct EpochRun;
  // Reads and transforms a batch of `epoch`, then starts its copy to the device, if any.
  StagedBatch load(const std::vector<int64_t>& indices, int64_t epoch) const;
  // In the caller's thread: orders its stream after the batch's copies (with a device).
  Batch ready_for_caller(StagedBatch staged) const;

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  std::unique_ptr<DeviceBatchCopier> copier_;  // with a CUDA device; outlives run_'s workers
  std::shared_ptr<BatchSamplerBase> batch_sampler_;
  int64_t epoch_ = 0;
  int64_t epoch_step_ = 0;
  double wait_seconds_ = 0;
  std::unique_ptr<EpochRun> run_;
};

}  // namespace mpigrad::data
