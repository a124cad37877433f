#include "mpigrad/data/training_data.h"

#include "mpigrad/core/error.h"
#include "mpigrad/data/atom_budget_sampler.h"

namespace mpigrad::data {

bool is_atomic_store(const std::string& path) {
  return AtomicStore::detect(path).has_value();
}

std::shared_ptr<Dataset> open_training_data(const std::vector<std::string>& paths,
                                            const TrainingDataOptions& options) {
  MPIGRAD_CHECK(!paths.empty(), "data: no files given");
  std::vector<std::string> stores, files;
  for (const std::string& path : paths) (is_atomic_store(path) ? stores : files).push_back(path);
  MPIGRAD_CHECK(stores.empty() || files.empty(), "data: '", stores.empty() ? "" : stores[0],
                "' is an atomic store but '", files.empty() ? "" : files[0],
                "' is not (a plain HDF5 file); list one kind of data");
  if (!files.empty()) return std::make_shared<Hdf5Dataset>(files, options.hdf5);
  if (stores.size() == 1) return std::make_shared<AtomicDataset>(stores[0], options.atomic);
  std::vector<std::shared_ptr<Dataset>> children;
  for (const std::string& store : stores) {
    children.push_back(std::make_shared<AtomicDataset>(store, options.atomic));
  }
  return std::make_shared<MultiDataset>(std::move(children));
}

std::shared_ptr<BatchSamplerBase> make_batch_sampler(const Dataset& dataset,
                                                     const BatchingOptions& options) {
  const auto* multi = dynamic_cast<const MultiDataset*>(&dataset);
  if (options.max_atoms > 0) {
    MPIGRAD_CHECK(!options.samples_per_dataset, "data: max_atoms (an atom budget per batch) and ",
                  "samples_per_dataset (a fixed mix of stores per batch) exclude each other");
    std::vector<int64_t> counts = dataset_atom_counts(dataset);
    MPIGRAD_CHECK(!counts.empty(), "data: max_atoms needs atomic stores, but ", dataset.describe(),
                  " holds no structures");
    AtomBudgetOptions budget;
    budget.max_atoms = options.max_atoms;
    budget.shuffle = options.shuffle;
    budget.seed = options.seed;
    budget.num_replicas = options.num_replicas;
    budget.rank = options.rank;
    budget.drop_last = options.drop_last;
    return std::make_shared<AtomBudgetBatchSampler>(std::move(counts), budget);
  }
  if (multi != nullptr) {
    MultiDatasetBatchSamplerOptions mix;
    mix.batch_size = options.batch_size;
    mix.samples_per_dataset = options.samples_per_dataset;
    mix.epoch_policy = options.epoch_policy;
    mix.replacement = options.replacement;
    mix.shuffle = options.shuffle;
    mix.seed = options.seed;
    mix.drop_last = options.drop_last;
    mix.num_replicas = options.num_replicas;
    mix.rank = options.rank;
    return std::make_shared<MultiDatasetBatchSampler>(*multi, mix);
  }
  MPIGRAD_CHECK(!options.samples_per_dataset,
                "data: samples_per_dataset mixes several stores, "
                "but ",
                dataset.describe(), " is one dataset");
  std::shared_ptr<Sampler> sampler;
  if (options.num_replicas > 1) {
    sampler =
        std::make_shared<DistributedSampler>(dataset.size(), options.num_replicas, options.rank,
                                             options.shuffle, options.seed, options.drop_last);
  } else if (options.shuffle) {
    sampler = std::make_shared<RandomSampler>(dataset.size(), options.seed);
  } else {
    sampler = std::make_shared<SequentialSampler>(dataset.size());
  }
  return std::make_shared<BatchSampler>(sampler, options.batch_size, options.drop_last);
}

}  // namespace mpigrad::data
