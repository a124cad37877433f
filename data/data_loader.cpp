#include "mpigrad/data/data_loader.h"

#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <variant>

#include "mpigrad/core/error.h"

namespace mpigrad::data {

// One epoch in flight: the batch list and the workers reading ahead in it.
struct DataLoader::EpochRun {
  std::vector<std::vector<int64_t>> batches;
  int64_t epoch = 0;
  size_t next_to_produce = 0;
  size_t next_to_consume = 0;
  size_t window = 1;  // batches produced but not yet consumed, at most
  std::map<size_t, std::variant<StagedBatch, std::exception_ptr>> ready;
  bool stop = false;
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::thread> workers;

  ~EpochRun() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    changed.notify_all();
    for (auto& worker : workers) worker.join();
  }
};

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  MPIGRAD_CHECK(dataset_ != nullptr, "DataLoader: no dataset");
  const std::string what = "DataLoader over " + dataset_->describe();
  MPIGRAD_CHECK(!(options_.sampler && options_.batch_sampler), what,
                ": give sampler or batch_sampler, not both");
  MPIGRAD_CHECK(options_.num_workers >= 0, what, ": num_workers must be >= 0, got ",
                options_.num_workers);
  MPIGRAD_CHECK(options_.prefetch_factor >= 1, what, ": prefetch_factor must be >= 1, got ",
                options_.prefetch_factor);
  if (options_.device.is_cuda()) {
    try {
      copier_ = std::make_unique<DeviceBatchCopier>(options_.device);
    } catch (const core::Error& error) {
      core::fail(what, ": target device: ", error.what());
    }
  }
  const bool distributed = options_.num_replicas > 1;
  if (options_.batch_sampler) {
    MPIGRAD_CHECK(!distributed || options_.batch_sampler->is_distributed(), what, ": num_replicas ",
                  options_.num_replicas, " but the batch_sampler given is not distributed");
    batch_sampler_ = options_.batch_sampler;
    return;
  }
  MPIGRAD_CHECK(options_.batch_size >= 1, what, ": batch_size must be >= 1, got ",
                options_.batch_size);
  std::shared_ptr<Sampler> sampler = options_.sampler;
  if (sampler) {
    MPIGRAD_CHECK(!distributed || sampler->is_distributed(), what, ": num_replicas ",
                  options_.num_replicas, " but the sampler given is not distributed");
  } else if (distributed) {
    try {
      sampler = std::make_shared<DistributedSampler>(dataset_->size(), options_.num_replicas,
                                                     options_.rank, options_.shuffle, options_.seed,
                                                     options_.drop_last);
    } catch (const core::Error& error) {
      core::fail(what, ": ", error.what());
    }
  } else if (options_.shuffle) {
    sampler = std::make_shared<RandomSampler>(dataset_->size(), options_.seed);
  } else {
    sampler = std::make_shared<SequentialSampler>(dataset_->size());
  }
  batch_sampler_ = std::make_shared<BatchSampler>(sampler, options_.batch_size, options_.drop_last);
}

DataLoader::~DataLoader() = default;

void DataLoader::set_epoch(int64_t epoch) {
  epoch_ = epoch;
  batch_sampler_->set_epoch(epoch);
}

void DataLoader::set_batch_sampler(std::shared_ptr<BatchSamplerBase> batch_sampler) {
  MPIGRAD_CHECK(batch_sampler != nullptr, "DataLoader::set_batch_sampler: null batch sampler");
  run_.reset();  // an epoch in progress ends here; the next start() uses the new order
  batch_sampler_ = std::move(batch_sampler);
  batch_sampler_->set_epoch(epoch_);
}

void DataLoader::set_epoch_step(int64_t step) {
  MPIGRAD_CHECK(step >= 0 && step <= size(), "DataLoader::set_epoch_step: step ", step,
                " outside [0, ", size(), "]");
  epoch_step_ = step;
}

StagedBatch DataLoader::load(const std::vector<int64_t>& indices, int64_t epoch) const {
  Batch batch = dataset_->get_batch(indices);
  batch.epoch = epoch;
  if (options_.transform) batch = options_.transform(std::move(batch));
  if (copier_) return copier_->start(std::move(batch));
  return StagedBatch{std::move(batch), nullptr};
}

void DataLoader::start() {
  run_.reset();  // ends and joins a previous epoch's workers
  auto run = std::make_unique<EpochRun>();
  run->batches = batch_sampler_->batches();
  run->epoch = epoch_;
  const size_t skip = std::min(size_t(epoch_step_), run->batches.size());
  run->next_to_produce = run->next_to_consume = skip;
  epoch_step_ = 0;
  wait_seconds_ = 0;
  const int workers = options_.num_workers;
  run->window = size_t(std::max(1, workers) * options_.prefetch_factor);
  EpochRun* state = run.get();
  for (int w = 0; w < workers; ++w) {
    run->workers.emplace_back([this, state] {
      std::unique_lock<std::mutex> lock(state->mutex);
      while (true) {
        state->changed.wait(lock, [state] {
          return state->stop || state->next_to_produce >= state->batches.size() ||
                 state->next_to_produce < state->next_to_consume + state->window;
        });
        if (state->stop || state->next_to_produce >= state->batches.size()) return;
        const size_t index = state->next_to_produce++;
        lock.unlock();
        std::variant<StagedBatch, std::exception_ptr> result;
        try {
          result = load(state->batches[index], state->epoch);
        } catch (...) {
          result = std::current_exception();
        }
        lock.lock();
        state->ready.emplace(index, std::move(result));
        state->changed.notify_all();
      }
    });
  }
  run_ = std::move(run);
}

std::optional<Batch> DataLoader::next() {
  MPIGRAD_CHECK(run_ != nullptr, "DataLoader::next: call start() (or begin()) first");
  EpochRun& run = *run_;
  if (run.next_to_consume >= run.batches.size()) return std::nullopt;
  const size_t index = run.next_to_consume;
  if (run.workers.empty()) {
    ++run.next_to_consume;
    auto start = std::chrono::steady_clock::now();
    StagedBatch staged = load(run.batches[index], run.epoch);
    wait_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return ready_for_caller(std::move(staged));
  }
  std::variant<StagedBatch, std::exception_ptr> result;
  {
    auto start = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(run.mutex);
    run.changed.wait(lock, [&] { return run.ready.count(index) != 0; });
    wait_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    auto found = run.ready.find(index);
    result = std::move(found->second);
    run.ready.erase(found);
    ++run.next_to_consume;
  }
  run.changed.notify_all();
  if (result.index() == 1) std::rethrow_exception(std::get<1>(result));
  return ready_for_caller(std::move(std::get<0>(result)));
}

Batch DataLoader::ready_for_caller(StagedBatch staged) const {
  if (copier_) return copier_->finish(std::move(staged));
  return std::move(staged.batch);
}

DataLoader::Iterator::Iterator(DataLoader* loader) : loader_(loader), current_(loader->next()) {}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  // Let go of the previous batch first: its buffers return to the pool and are reused (still in
  // cache) by the next read, unless the trainer kept references to them.
  current_.reset();
  current_ = loader_->next();
  return *this;
}

DataLoader::Iterator DataLoader::begin() {
  start();
  return Iterator(this);
}

}  // namespace mpigrad::data
