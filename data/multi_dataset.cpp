#include "mpigrad/data/multi_dataset.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>

#include "mpigrad/core/checked_math.h"
#include "mpigrad/core/error.h"
#include "mpigrad/data/batch_buffers.h"
#include "mpigrad/data/ragged_batch.h"
#include "mpigrad/kernels/philox.h"

namespace mpigrad::data {

// ---- MultiDataset -------------------------------------------------------------------------------

namespace {
std::string field_names(const std::vector<FieldInfo>& fields) {
  std::string names;
  for (const FieldInfo& field : fields) names += (names.empty() ? "" : ", ") + field.name;
  return names;
}
}  // namespace

MultiDataset::MultiDataset(std::vector<std::shared_ptr<Dataset>> children)
    : children_(std::move(children)) {
  MPIGRAD_CHECK(!children_.empty(), "MultiDataset: no datasets given");
  offsets_.push_back(0);
  for (size_t d = 0; d < children_.size(); ++d) {
    MPIGRAD_CHECK(children_[d] != nullptr, "MultiDataset: dataset ", d, " is null");
    const auto& expected = children_[0]->fields();
    const auto& got = children_[d]->fields();
    MPIGRAD_CHECK(got.size() == expected.size(), "MultiDataset: dataset ", d, " (",
                  children_[d]->describe(), ") has ", got.size(), " fields (", field_names(got),
                  ") but dataset 0 (", children_[0]->describe(), ") has ", expected.size(), " (",
                  field_names(expected), ")");
    for (size_t f = 0; f < got.size(); ++f) {
      MPIGRAD_CHECK(got[f] == expected[f], "MultiDataset: dataset ", d, " (",
                    children_[d]->describe(), ") field '", got[f].name, "' is ", got[f].dtype, " ",
                    got[f].sample_shape, " at the ", field_level_name(got[f].level),
                    " level but dataset 0 (", children_[0]->describe(), ") field '",
                    expected[f].name, "' is ", expected[f].dtype, " ", expected[f].sample_shape,
                    " at the ", field_level_name(expected[f].level), " level");
    }
    offsets_.push_back(offsets_.back() + children_[d]->size());
  }
}

std::string MultiDataset::describe() const {
  std::string text = "MultiDataset of " + std::to_string(children_.size()) + " [";
  for (size_t d = 0; d < children_.size(); ++d) text += (d ? "; " : "") + children_[d]->describe();
  return text + "]";
}

std::vector<int64_t> MultiDataset::sizes() const {
  std::vector<int64_t> result;
  for (const auto& child : children_) result.push_back(child->size());
  return result;
}

int64_t MultiDataset::to_global(int dataset, int64_t local) const {
  MPIGRAD_CHECK(dataset >= 0 && dataset < num_datasets(), "MultiDataset::to_global: dataset ",
                dataset, " outside [0, ", num_datasets(), ")");
  MPIGRAD_CHECK(local >= 0 && local < children_[size_t(dataset)]->size(),
                "MultiDataset::to_global: index ", local, " out of range [0, ",
                children_[size_t(dataset)]->size(), ") of dataset ", dataset);
  return offsets_[size_t(dataset)] + local;
}

std::pair<int, int64_t> MultiDataset::to_local(int64_t global) const {
  MPIGRAD_CHECK(global >= 0 && global < size(), describe(), ": index ", global,
                " out of range [0, ", size(), ")");
  int d = int(std::upper_bound(offsets_.begin(), offsets_.end(), global) - offsets_.begin()) - 1;
  while (global >= offsets_[size_t(d) + 1]) ++d;  // empty children share an offset
  return {d, global - offsets_[size_t(d)]};
}

Batch MultiDataset::get_batch(std::span<const int64_t> indices) const {
  check_indices(indices, size(), describe());
  const int64_t n = int64_t(indices.size());
  std::vector<std::vector<int64_t>> locals(children_.size()), positions(children_.size());
  std::vector<int64_t> which(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    auto [d, local] = to_local(indices[size_t(i)]);
    locals[size_t(d)].push_back(local);
    positions[size_t(d)].push_back(i);
    which[size_t(i)] = d;
  }
  if (std::any_of(fields().begin(), fields().end(),
                  [](const FieldInfo& info) { return info.ragged(); })) {
    // Each child's structures in one read, then joined in the order asked for.
    std::vector<Batch> parts;
    std::vector<size_t> part_of(children_.size());
    for (size_t d = 0; d < children_.size(); ++d) {
      if (locals[d].empty()) continue;
      part_of[d] = parts.size();
      parts.push_back(children_[d]->get_batch(locals[d]));
    }
    std::vector<StructurePick> picks(static_cast<size_t>(n));
    for (size_t d = 0; d < children_.size(); ++d) {
      for (size_t k = 0; k < positions[d].size(); ++k)
        picks[size_t(positions[d][k])] = StructurePick{part_of[d], int64_t(k)};
    }
    Batch batch = gather_structures(parts, picks, fields());
    batch.indices.assign(indices.begin(), indices.end());
    batch.dataset_index = core::Tensor::from_vector(which, {n});
    return batch;
  }
  Batch batch;
  for (const FieldInfo& info : fields()) {
    core::Shape shape = info.sample_shape;
    shape.insert(0, n);
    batch.fields.emplace_back(info.name, empty_batch_tensor(shape, info.dtype));
  }
  for (size_t d = 0; d < children_.size(); ++d) {
    if (locals[d].empty()) continue;
    Batch part = children_[d]->get_batch(locals[d]);
    for (size_t f = 0; f < batch.fields.size(); ++f) {
      const int64_t row_bytes = fields()[f].sample_bytes();
      core::Tensor source = part.fields[f].second.contiguous();
      const char* from = static_cast<const char*>(source.data_ptr());
      char* to = static_cast<char*>(batch.fields[f].second.data_ptr());
      for (size_t k = 0; k < positions[d].size(); ++k) {
        std::memcpy(to + positions[d][k] * row_bytes, from + int64_t(k) * row_bytes,
                    size_t(row_bytes));
      }
    }
  }
  batch.indices.assign(indices.begin(), indices.end());
  batch.dataset_index = core::Tensor::from_vector(which, {n});
  return batch;
}

// ---- Composition --------------------------------------------------------------------------------

EpochPolicy parse_epoch_policy(const std::string& text) {
  return core::parse_enum(text, kEpochPolicyNames, "epoch_policy");
}

std::string epoch_policy_name(EpochPolicy policy) {
  return std::string(core::enum_name(policy, kEpochPolicyNames));
}

std::vector<int64_t> largest_remainder(const std::vector<double>& weights, int64_t total) {
  MPIGRAD_CHECK(!weights.empty(), "largest_remainder: no weights");
  MPIGRAD_CHECK(total >= 0, "largest_remainder: negative total ", total);
  double sum = 0;
  for (double w : weights) {
    MPIGRAD_CHECK(std::isfinite(w) && w >= 0, "weights must be finite and >= 0, got ", w);
    sum += w;
  }
  MPIGRAD_CHECK(sum > 0, "weights must not all be zero");
  std::vector<int64_t> counts(weights.size());
  std::vector<double> remainders(weights.size());
  int64_t assigned = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    double quota = double(total) * weights[i] / sum;
    counts[i] = int64_t(std::floor(quota));
    remainders[i] = quota - double(counts[i]);
    assigned += counts[i];
  }
  std::vector<size_t> order(weights.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return remainders[a] > remainders[b]; });
  for (size_t k = 0; assigned < total; k = (k + 1) % order.size(), ++assigned) ++counts[order[k]];
  return counts;
}

BatchComposition BatchComposition::counts(std::vector<int64_t> counts) {
  BatchComposition composition;
  composition.kind_ = Kind::Counts;
  composition.counts_ = std::move(counts);
  return composition;
}

BatchComposition BatchComposition::ratios(std::vector<double> ratios) {
  BatchComposition composition;
  composition.kind_ = Kind::Ratios;
  composition.ratios_ = std::move(ratios);
  return composition;
}

BatchComposition BatchComposition::balanced() {
  return BatchComposition();
}

BatchComposition BatchComposition::from_values(
    const std::vector<std::variant<int64_t, double>>& values) {
  bool any_float =
      std::any_of(values.begin(), values.end(), [](const auto& v) { return v.index() == 1; });
  if (any_float) {
    std::vector<double> ratios;
    for (const auto& v : values)
      ratios.push_back(v.index() == 1 ? std::get<1>(v) : double(std::get<0>(v)));
    return BatchComposition::ratios(std::move(ratios));
  }
  std::vector<int64_t> counts;
  for (const auto& v : values) counts.push_back(std::get<0>(v));
  return BatchComposition::counts(std::move(counts));
}

BatchComposition BatchComposition::parse(const std::string& text) {
  if (text == "balanced") return balanced();
  std::vector<std::variant<int64_t, double>> values;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    size_t used = 0;
    try {
      if (item.find_first_of(".eE") != std::string::npos) {
        values.emplace_back(std::stod(item, &used));
      } else {
        values.emplace_back(int64_t(std::stoll(item, &used)));
      }
    } catch (const std::exception&) {
      used = 0;
    }
    MPIGRAD_CHECK(!item.empty() && used == item.size(), "samples_per_dataset: cannot parse '", item,
                  "' in '", text,
                  "' (expected counts like 16,16, ratios like 0.7,0.3, or balanced)");
  }
  MPIGRAD_CHECK(!values.empty(), "samples_per_dataset: empty list");
  return from_values(values);
}

std::vector<int64_t> BatchComposition::resolve(int64_t batch_size, int num_datasets) const {
  switch (kind_) {
    case Kind::Balanced:
      return largest_remainder(std::vector<double>(size_t(num_datasets), 1.0), batch_size);
    case Kind::Ratios: {
      MPIGRAD_CHECK(int(ratios_.size()) == num_datasets, "samples_per_dataset ", str(), ": ",
                    ratios_.size(), " ratios for ", num_datasets, " datasets");
      try {
        return largest_remainder(ratios_, batch_size);
      } catch (const core::Error& error) {
        core::fail("samples_per_dataset ", str(), ": ", error.what());
      }
    }
    case Kind::Counts: {
      MPIGRAD_CHECK(int(counts_.size()) == num_datasets, "samples_per_dataset ", str(), ": ",
                    counts_.size(), " counts for ", num_datasets, " datasets");
      int64_t sum = 0;
      for (int64_t c : counts_) {
        MPIGRAD_CHECK(c >= 0, "samples_per_dataset ", str(), ": negative count ", c);
        sum += c;
      }
      MPIGRAD_CHECK(sum == batch_size, "samples_per_dataset ", str(),
                    ": integer counts are exact and sum to ", sum, ", not the batch size ",
                    batch_size, " (write floats such as 0.5 for ratios)");
      return counts_;
    }
  }
  return {};
}

std::string BatchComposition::str() const {
  std::ostringstream out;
  if (kind_ == Kind::Balanced) return "balanced";
  out << "[";
  if (kind_ == Kind::Counts) {
    for (size_t i = 0; i < counts_.size(); ++i) out << (i ? ", " : "") << counts_[i];
  } else {
    for (size_t i = 0; i < ratios_.size(); ++i) out << (i ? ", " : "") << ratios_[i];
  }
  out << "]";
  return out.str();
}

std::string BatchComposition::text() const {
  if (kind_ == Kind::Balanced) return "balanced";
  std::string result;
  if (kind_ == Kind::Counts) {
    for (size_t i = 0; i < counts_.size(); ++i) {
      if (i > 0) result += ',';
      result += std::to_string(counts_[i]);
    }
    return result;
  }
  for (size_t i = 0; i < ratios_.size(); ++i) {
    char buffer[64];
    auto [end, error] = std::to_chars(buffer, buffer + sizeof(buffer), ratios_[i]);
    std::string value(buffer, error == std::errc() ? end : buffer);
    if (value.find_first_of(".eE") == std::string::npos) value += ".0";  // stays a ratio
    if (i > 0) result += ',';
    result += value;
  }
  return result;
}

// ---- MultiDatasetBatchSampler -------------------------------------------------------------------

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// The stream of child d in an epoch: distinct per child, a pure function of seed + epoch.
uint64_t child_seed(uint64_t seed_plus_epoch, size_t dataset) {
  return splitmix64(seed_plus_epoch ^ splitmix64(uint64_t(dataset) + 1));
}
std::string counts_text(const std::vector<int64_t>& counts) {
  std::string text = "[";
  for (size_t i = 0; i < counts.size(); ++i) text += (i ? ", " : "") + std::to_string(counts[i]);
  return text + "]";
}
}  // namespace

MultiDatasetBatchSampler::MultiDatasetBatchSampler(std::vector<int64_t> dataset_sizes,
                                                   MultiDatasetBatchSamplerOptions options)
    : sizes_(std::move(dataset_sizes)), options_(std::move(options)) {
  const int64_t batch_size = options_.batch_size;
  const int datasets = int(sizes_.size());
  MPIGRAD_CHECK(datasets >= 1, "MultiDatasetBatchSampler: no datasets");
  MPIGRAD_CHECK(batch_size >= 1, "MultiDatasetBatchSampler: batch_size must be >= 1, got ",
                batch_size);
  MPIGRAD_CHECK(!(options_.weights && options_.samples_per_dataset),
                "MultiDatasetBatchSampler: give weights or samples_per_dataset, not both");
  MPIGRAD_CHECK(
      options_.num_replicas >= 1 && options_.rank >= 0 && options_.rank < options_.num_replicas,
      "MultiDatasetBatchSampler: rank ", options_.rank, " outside [0, ", options_.num_replicas,
      ")");
  MPIGRAD_CHECK(options_.num_batches >= 0, "MultiDatasetBatchSampler: num_batches must be >= 0 ",
                "(0: from epoch_policy), got ", options_.num_batches);
  offsets_.push_back(0);
  for (int64_t n : sizes_) {
    MPIGRAD_CHECK(n >= 0, "MultiDatasetBatchSampler: negative dataset size ", n);
    offsets_.push_back(offsets_.back() + n);
  }

  // Weights and ratios may not favour an empty child, even when its share rounds to nothing.
  auto check_weights = [&](const std::vector<double>& weights, const char* what) {
    for (int d = 0; d < datasets && size_t(d) < weights.size(); ++d) {
      MPIGRAD_CHECK(weights[size_t(d)] <= 0 || sizes_[size_t(d)] > 0,
                    "MultiDatasetBatchSampler: dataset ", d, " has ", what, " ", weights[size_t(d)],
                    " but no samples");
    }
  };
  if (options_.samples_per_dataset) {
    check_weights(options_.samples_per_dataset->ratio_values(), "ratio");
    per_batch_ = options_.samples_per_dataset->resolve(batch_size, datasets);
  } else {
    std::vector<double> weights;
    if (options_.weights) {
      weights = *options_.weights;
      MPIGRAD_CHECK(int(weights.size()) == datasets, "MultiDatasetBatchSampler: ", weights.size(),
                    " weights for ", datasets, " datasets");
      check_weights(weights, "weight");
    } else {
      for (int64_t n : sizes_) weights.push_back(double(n));
    }
    try {
      per_batch_ = largest_remainder(weights, batch_size);
    } catch (const core::Error& error) {
      core::fail("MultiDatasetBatchSampler: ", error.what());
    }
  }

  const bool replacement = options_.replacement;
  const std::string policy = epoch_policy_name(options_.epoch_policy);
  int64_t min_batches = -1, max_batches = -1, complete = -1;
  for (int d = 0; d < datasets; ++d) {
    const int64_t k = per_batch_[size_t(d)], n = sizes_[size_t(d)];
    if (k == 0) continue;
    MPIGRAD_CHECK(n > 0, "MultiDatasetBatchSampler: dataset ", d, " contributes ", k,
                  " samples per batch but has no samples");
    const int64_t batches = replacement ? core::ceil_div(n, k) : n / k;
    min_batches = min_batches < 0 ? batches : std::min(min_batches, batches);
    max_batches = std::max(max_batches, batches);
    complete = complete < 0 ? n / k : std::min(complete, n / k);
  }
  if (options_.num_batches > 0) {
    global_batches_ = options_.num_batches;
  } else {
    switch (options_.epoch_policy) {
      case EpochPolicy::DatasetSize:
        global_batches_ = replacement ? core::ceil_div(offsets_.back(), batch_size) : min_batches;
        break;
      case EpochPolicy::MinSize:
        global_batches_ = min_batches;
        break;
      case EpochPolicy::MaxSize:
        MPIGRAD_CHECK(replacement || max_batches == min_batches,
                      "MultiDatasetBatchSampler: epoch_policy max_size runs until the largest "
                      "dataset is used up (",
                      max_batches, " batches) but the smallest has only ", min_batches,
                      "; oversampling it is impossible without replacement (use replacement = "
                      "true, or epoch_policy min_size)");
        global_batches_ = max_batches;
        break;
    }
  }
  if (!replacement) {
    MPIGRAD_CHECK(global_batches_ <= complete, "MultiDatasetBatchSampler: ", global_batches_,
                  " batches per epoch, but without replacement the datasets hold only ", complete,
                  " complete batches of ", counts_text(per_batch_),
                  " samples (use replacement = true, or fewer batches)");
  }
  MPIGRAD_CHECK(global_batches_ >= 1, "MultiDatasetBatchSampler: epoch_policy ", policy,
                " gives no complete batch of ", batch_size, " (dataset sizes too small)");
  MPIGRAD_CHECK(!options_.drop_last || global_batches_ >= options_.num_replicas,
                "MultiDatasetBatchSampler: ", global_batches_,
                " batches per epoch, fewer than the ", options_.num_replicas,
                " ranks, and drop_last leaves none (use drop_last = false or a smaller batch)");
}

int64_t MultiDatasetBatchSampler::size() const {
  return batches_per_rank(global_batches_, options_.num_replicas, options_.drop_last);
}

std::vector<std::vector<int64_t>> MultiDatasetBatchSampler::global_batches_list() const {
  const uint64_t seed = options_.seed + uint64_t(epoch_);
  std::vector<std::vector<int64_t>> batches(static_cast<size_t>(global_batches_));
  for (auto& batch : batches) batch.reserve(size_t(options_.batch_size));
  for (size_t d = 0; d < sizes_.size(); ++d) {
    const int64_t k = per_batch_[d];
    if (k == 0) continue;
    const int64_t needed = global_batches_ * k;
    std::vector<int64_t> locals;
    if (options_.replacement && options_.shuffle) {
      RandomSampler draws(sizes_[d], child_seed(seed, d), true, needed);
      locals = draws.indices();
    } else if (options_.replacement) {  // in order, wrapping around
      locals.resize(size_t(needed));
      for (int64_t i = 0; i < needed; ++i) locals[size_t(i)] = i % sizes_[d];
    } else if (options_.shuffle) {
      locals = random_permutation(sizes_[d], child_seed(seed, d));
    } else {
      locals.resize(size_t(sizes_[d]));
      std::iota(locals.begin(), locals.end(), 0);
    }
    for (int64_t b = 0; b < global_batches_; ++b) {
      for (int64_t i = 0; i < k; ++i)
        batches[size_t(b)].push_back(offsets_[d] + locals[size_t(b * k + i)]);
    }
  }
  if (options_.shuffle) {
    // The samples of a batch in a random order of their own (the datasets interleaved).
    const uint64_t within = splitmix64(seed ^ 0x6A09E667F3BCC909ull);
    for (size_t b = 0; b < batches.size(); ++b) {
      std::vector<int64_t> order =
          random_permutation(int64_t(batches[b].size()), splitmix64(within + b));
      std::vector<int64_t> shuffled(batches[b].size());
      for (size_t i = 0; i < order.size(); ++i) shuffled[i] = batches[b][size_t(order[i])];
      batches[b] = std::move(shuffled);
    }
  }
  even_out_batches(batches, size(), options_.num_replicas, options_.drop_last);
  return batches;
}

std::vector<std::vector<int64_t>> MultiDatasetBatchSampler::batches() const {
  return rank_batches(global_batches_list(), options_.rank, options_.num_replicas);
}

}  // namespace mpigrad::data
