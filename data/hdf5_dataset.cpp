#include "mpigrad/data/hdf5_dataset.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "mpigrad/core/checked_math.h"
#include "mpigrad/core/error.h"
#include "mpigrad/data/batch_buffers.h"

namespace mpigrad::data {

namespace hdf5 = core::hdf5;

IndexSlice rank_slice(int64_t size, int64_t num_replicas, int64_t rank, bool drop_last) {
  MPIGRAD_CHECK(num_replicas >= 1, "rank_slice: num_replicas must be >= 1, got ", num_replicas);
  MPIGRAD_CHECK(rank >= 0 && rank < num_replicas, "rank_slice: rank ", rank, " outside [0, ",
                num_replicas, ")");
  MPIGRAD_CHECK(size >= num_replicas, "rank_slice: the dataset has ", size,
                " samples, fewer than the ", num_replicas, " ranks; every rank needs at least one");
  int64_t length = drop_last ? size / num_replicas : (size + num_replicas - 1) / num_replicas;
  return IndexSlice{(rank * length) % size, length};
}

Hdf5Dataset::Hdf5Dataset(std::vector<std::string> paths, Hdf5DatasetOptions options)
    : options_(std::move(options)) {
  MPIGRAD_CHECK(!paths.empty(), "Hdf5Dataset: no files given");
  MPIGRAD_CHECK(!options_.fields.empty(), "Hdf5Dataset: no fields given (files: ", paths[0],
                ", ...)");
  MPIGRAD_CHECK(options_.max_open_files >= 1, "Hdf5Dataset: max_open_files must be >= 1, got ",
                options_.max_open_files);
  for (size_t i = 0; i < options_.fields.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      MPIGRAD_CHECK(options_.fields[i] != options_.fields[j], "Hdf5Dataset: field '",
                    options_.fields[i], "' listed twice");
    }
  }
  for (auto& path : paths) shards_.push_back(Shard{std::move(path), 0, 0});
  for (int s = 0; s < num_shards(); ++s) {
    std::vector<FieldInfo> infos;
    OpenShard opened = open_shard(s, &infos);
    if (s == 0) fields_ = std::move(infos);
    Shard& shard = shards_[size_t(s)];
    shard.begin = total_size_;
    shard.size = opened.datasets.empty() ? 0 : opened.datasets[0].dims()[0];
    total_size_ += shard.size;
    if (int(open_.size()) < options_.max_open_files) open_.emplace(s, std::move(opened));
  }
}

Hdf5Dataset::~Hdf5Dataset() = default;

// Opens a shard's file and fields and checks them: every field present, supported, with a
// leading dimension shared by all fields, and (for later shards) the same dtype and per-sample
// shape as the first shard.
Hdf5Dataset::OpenShard Hdf5Dataset::open_shard(int shard_index,
                                               std::vector<FieldInfo>* infos_out) const {
  const bool check_against_fields = !fields_.empty();
  const std::string& path = shards_[size_t(shard_index)].path;
  OpenShard shard;
  shard.file = options_.open_file ? options_.open_file(path) : hdf5::File::open(path);
  std::vector<FieldInfo> infos;
  int64_t rows = -1;
  for (const std::string& name : options_.fields) {
    hdf5::Dataset dataset = shard.file.open_dataset(name);
    FieldInfo info{name, dataset.read_dtype(), {}};
    std::vector<int64_t> dims = dataset.dims();
    MPIGRAD_CHECK(!dims.empty(), "Hdf5Dataset: ", path, " field '", name,
                  "' is a scalar; a field needs a leading sample dimension N");
    if (infos_out != nullptr) check_backed(dataset, shard.file);  // once, when first opened
    info.sample_shape = core::Shape(std::vector<int64_t>(dims.begin() + 1, dims.end()));
    if (rows < 0) {
      rows = dims[0];
    } else {
      MPIGRAD_CHECK(dims[0] == rows, "Hdf5Dataset: ", path, " field '", name, "' has ", dims[0],
                    " samples but field '", options_.fields[0], "' has ", rows,
                    "; all fields must share the leading dimension N");
    }
    if (check_against_fields) {
      const FieldInfo& expected = fields_[infos.size()];
      MPIGRAD_CHECK(info.dtype == expected.dtype, "Hdf5Dataset: shard ", path, " field '", name,
                    "' is ", info.dtype, " but shard ", shards_[0].path, " has ", expected.dtype);
      MPIGRAD_CHECK(info.sample_shape == expected.sample_shape, "Hdf5Dataset: shard ", path,
                    " field '", name, "' has per-sample shape ", info.sample_shape, " but shard ",
                    shards_[0].path, " has ", expected.sample_shape);
    }
    // The chunk cache is set when a dataset is opened, and sizing it needs the chunk size: open
    // chunked datasets a second time with the sized cache.
    int64_t chunk_bytes = dataset.chunk_bytes();
    if (chunk_bytes > 0 || options_.chunk_cache_bytes > 0) {
      hdf5::DatasetAccess access;
      const int64_t dataset_bytes =
          core::checked_mul(dataset.num_elements(), int64_t(core::element_size(info.dtype)),
                            "Hdf5Dataset: ", path, " field '", name, "': its bytes");
      if (options_.chunk_cache_bytes > 0) {
        access.chunk_cache_bytes = options_.chunk_cache_bytes;
      } else if (options_.access == AccessPattern::Sequential) {
        access.chunk_cache_bytes = std::max<int64_t>(2 * chunk_bytes, int64_t(1) << 20);
        access.chunk_cache_w0 = 1.0;  // a chunk read to its end is not needed again
      } else {
        // Random access revisits every chunk once per epoch; hold the whole dataset when it is
        // modest, so each chunk is read (and decompressed) once.
        access.chunk_cache_bytes =
            std::max(std::min<int64_t>(dataset_bytes, int64_t(128) << 20), chunk_bytes);
      }
      int64_t chunks =
          std::max<int64_t>(1, access.chunk_cache_bytes / std::max<int64_t>(chunk_bytes, 1));
      access.chunk_cache_slots =
          std::max<int64_t>(521, 100 * chunks) | 1;  // HDF5 advises ~100x chunks
      dataset = shard.file.open_dataset(name, access);
    }
    shard.mapped.push_back(options_.open_file ? std::nullopt
                                              : hdf5::MappedRows::open(dataset, info.dtype));
    shard.datasets.push_back(std::move(dataset));
    infos.push_back(std::move(info));
  }
  if (infos_out != nullptr) *infos_out = std::move(infos);
  return shard;
}

namespace {
std::string bytes_text(int64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = double(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 6) {
    value /= 1024;
    ++unit;
  }
  char text[64];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return text;
}
}  // namespace

// A dataset may declare extents its file never stored: h5py's create_dataset with a huge shape
// and chunks costs a few KB until written, and unwritten chunks read back as fill values. Such a
// file would make every count, sampler and scan size itself by a number the data doesn't back,
// so it is refused here, before anything is allocated from its extents.
void Hdf5Dataset::check_backed(const hdf5::Dataset& dataset, const hdf5::File& file) {
  using Layout = hdf5::Dataset::Storage::Layout;
  const hdf5::Dataset::Storage storage = dataset.storage();
  const int64_t samples = dataset.dims().empty() ? 0 : dataset.dims()[0];
  const std::string what = "Hdf5Dataset: " + file.path() + " field '" +
                           dataset.name().substr(dataset.name().starts_with("/") ? 1 : 0) +
                           "' declares " + std::to_string(samples) + " samples (" +
                           bytes_text(storage.declared_bytes) + ")";
  if (storage.layout == Layout::Contiguous) {
    MPIGRAD_CHECK(storage.stored_bytes >= storage.declared_bytes, what, " but stores only ",
                  bytes_text(storage.stored_bytes),
                  "; the data was never written. Write every sample, or create the dataset with "
                  "the number of samples you have");
    const int64_t file_bytes = file.size_on_disk();
    MPIGRAD_CHECK(storage.end_offset <= file_bytes, what, " stored up to byte ", storage.end_offset,
                  " but the file has only ", file_bytes,
                  " bytes: it is truncated (an interrupted copy or write?)");
  } else if (storage.layout == Layout::Chunked && storage.chunks_stored >= 0) {
    MPIGRAD_CHECK(storage.chunks_stored >= storage.chunks_needed, what, " in ",
                  storage.chunks_needed, " chunks, but only ", storage.chunks_stored,
                  " chunk(s) were ever written (", bytes_text(storage.stored_bytes),
                  " stored); the rest would read as fill values. Write every sample, or shrink "
                  "the dataset to what was written (h5py: dataset.resize(n, axis=0))");
  }
}

Hdf5Dataset::OpenShard& Hdf5Dataset::acquire(int shard) const {
  ++use_clock_;
  auto found = open_.find(shard);
  if (found == open_.end()) {
    while (int(open_.size()) >= options_.max_open_files) {
      auto oldest = std::min_element(open_.begin(), open_.end(), [](const auto& a, const auto& b) {
        return a.second.last_use < b.second.last_use;
      });
      open_.erase(oldest);
    }
    found = open_.emplace(shard, open_shard(shard, nullptr)).first;
  }
  found->second.last_use = use_clock_;
  return found->second;
}

void Hdf5Dataset::read_rows(const OpenShard& shard, size_t f, int64_t row, int64_t count,
                            char* out) const {
  if (shard.mapped[f]) return shard.mapped[f]->read(row, count, out);
  shard.datasets[f].read_rows(row, count, out, fields_[f].dtype);
}

int Hdf5Dataset::shard_of(int64_t global) const {
  auto after = std::upper_bound(shards_.begin(), shards_.end(), global,
                                [](int64_t g, const Shard& shard) { return g < shard.begin; });
  // Skip empty shards that start at the same index.
  int s = int(after - shards_.begin()) - 1;
  while (s > 0 && global >= shards_[size_t(s)].begin + shards_[size_t(s)].size) ++s;
  return s;
}

int64_t Hdf5Dataset::size() const {
  return slice_ ? slice_->length : total_size_;
}

int Hdf5Dataset::open_files() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return int(open_.size());
}

std::string Hdf5Dataset::describe() const {
  std::string text = "Hdf5Dataset " + shards_[0].path;
  if (shards_.size() > 1) text += " (+" + std::to_string(shards_.size() - 1) + " more shards)";
  if (slice_) {
    text +=
        " slice [" + std::to_string(slice_->begin) + ", +" + std::to_string(slice_->length) + ")";
  }
  return text;
}

// A tensor for rows of `field`, or one core::Error naming the file, the field, what the memory
// was for and how many bytes could not be had (or that their count overflows).
core::Tensor Hdf5Dataset::allocate(const FieldInfo& field, const core::Shape& shape,
                                   const std::string& purpose, bool batch) const {
  try {
    return batch ? empty_batch_tensor(shape, field.dtype) : core::Tensor::empty(shape, field.dtype);
  } catch (const core::AllocationError& error) {
    core::fail(describe(), " field '", field.name, "': cannot allocate ", error.bytes(), " bytes (",
               bytes_text(error.bytes()), ") for ", purpose, " of shape ", shape, " (", field.dtype,
               "); out of memory");
  } catch (const core::Error& error) {
    core::fail(describe(), " field '", field.name, "': ", purpose, ": ", error.what());
  }
}

void Hdf5Dataset::set_slice(IndexSlice slice, bool in_memory) {
  MPIGRAD_CHECK(
      slice.length >= 0 && slice.begin >= 0 && (slice.length == 0 || slice.begin < total_size_),
      describe(), ": slice begin ", slice.begin, " length ", slice.length, " outside the ",
      total_size_, " samples");
  MPIGRAD_CHECK(slice.length <= total_size_, describe(), ": slice of ", slice.length,
                " samples is longer than the ", total_size_, " samples");
  slice_ = slice;
  memory_.clear();
  if (in_memory) load_slice_into_memory();
}

void Hdf5Dataset::set_rank_slice(int64_t num_replicas, int64_t rank, bool drop_last,
                                 bool in_memory) {
  IndexSlice slice;
  try {
    slice = rank_slice(total_size_, num_replicas, rank, drop_last);
  } catch (const core::Error& error) {
    core::fail(describe(), ": ", error.what());
  }
  set_slice(slice, in_memory);
}

// Rows [first, first + count) of the index space (not wrapping) of the fields `fields`, each
// into its dense buffer in `outputs`: one hyperslab read per field and shard. The caller holds
// mutex_.
void Hdf5Dataset::read_consecutive(int64_t first, int64_t count, const std::vector<size_t>& fields,
                                   const std::vector<char*>& outputs) const {
  for (int64_t done = 0; done < count;) {
    const int64_t global = first + done;
    const int s = shard_of(global);
    const Shard& shard = shards_[size_t(s)];
    const int64_t rows = std::min(count - done, shard.begin + shard.size - global);
    OpenShard& opened = acquire(s);
    for (size_t i = 0; i < fields.size(); ++i) {
      read_rows(opened, fields[i], global - shard.begin, rows,
                outputs[i] + done * fields_[fields[i]].sample_bytes());
    }
    done += rows;
  }
}

// One read per field and shard: the slice is split only where it crosses a shard boundary or
// wraps past the end of the index space.
void Hdf5Dataset::load_slice_into_memory() {
  std::vector<core::Tensor> memory;
  for (const FieldInfo& info : fields_) {
    core::Shape shape = info.sample_shape;
    shape.insert(0, slice_->length);
    memory.push_back(allocate(
        info, shape, "its slice of " + std::to_string(slice_->length) + " samples, in memory"));
  }
  std::vector<size_t> all(fields_.size());
  std::iota(all.begin(), all.end(), size_t(0));
  std::vector<char*> outputs;
  for (const core::Tensor& tensor : memory)
    outputs.push_back(static_cast<char*>(tensor.data_ptr()));
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t head = std::min(slice_->length, total_size_ - slice_->begin);
  read_consecutive(slice_->begin, head, all, outputs);
  if (head < slice_->length) {  // the part that wraps to the start of the index space
    for (size_t f = 0; f < fields_.size(); ++f) outputs[f] += head * fields_[f].sample_bytes();
    read_consecutive(0, slice_->length - head, all, outputs);
  }
  open_.clear();  // everything this rank needs is in memory now
  memory_ = std::move(memory);
}

// Reads the samples `globals` (in that order) into outputs[f], a dense [n, sample...] buffer per
// field.
void Hdf5Dataset::read_global(const std::vector<int64_t>& globals,
                              std::vector<void*>& outputs) const {
  const int64_t n = int64_t(globals.size());
  // Fast path for slice mode and sequential sampling: consecutive indices, read straight into
  // the outputs, one hyperslab per field and shard.
  bool consecutive = true;
  for (int64_t i = 1; i < n && consecutive; ++i)
    consecutive = globals[size_t(i)] == globals[size_t(i - 1)] + 1;
  if (consecutive) {
    std::vector<size_t> all(fields_.size());
    std::iota(all.begin(), all.end(), size_t(0));
    std::vector<char*> out;
    for (void* output : outputs) out.push_back(static_cast<char*>(output));
    std::lock_guard<std::mutex> lock(mutex_);
    read_consecutive(globals[0], n, all, out);
    return;
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return globals[size_t(a)] != globals[size_t(b)] ? globals[size_t(a)] < globals[size_t(b)]
                                                    : a < b;
  });
  // Distinct indices in ascending order; the positions asking for unique[u] are
  // order[group_begin[u] .. group_begin[u + 1]).
  std::vector<int64_t> unique, group_begin;
  for (int64_t k = 0; k < n; ++k) {
    int64_t g = globals[size_t(order[size_t(k)])];
    if (unique.empty() || g != unique.back()) {
      unique.push_back(g);
      group_begin.push_back(k);
    }
  }
  group_begin.push_back(n);

  // Maximal runs of consecutive indices inside one shard.
  std::vector<Run> runs;
  for (int64_t u = 0; u < int64_t(unique.size()); ++u) {
    int64_t g = unique[size_t(u)];
    int s = shard_of(g);
    if (!runs.empty() && runs.back().shard == s && unique[size_t(u - 1)] + 1 == g) {
      ++runs.back().length;
    } else {
      runs.push_back(Run{s, g - shards_[size_t(s)].begin, 1, u});
    }
  }
  // A run whose samples each appear once, at consecutive output positions, is read straight
  // into the output; the others of a shard are read together into scratch and scattered.
  auto is_direct = [&](const Run& run) {
    int64_t position = order[size_t(group_begin[size_t(run.first)])];
    for (int64_t i = 0; i < run.length; ++i) {
      int64_t u = run.first + i;
      if (group_begin[size_t(u + 1)] - group_begin[size_t(u)] != 1) return false;
      if (order[size_t(group_begin[size_t(u)])] != position + i) return false;
    }
    return true;
  };

  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<char> scratch;
  for (size_t r = 0; r < runs.size();) {
    size_t end = r;
    while (end < runs.size() && runs[end].shard == runs[r].shard) ++end;
    OpenShard& opened = acquire(runs[r].shard);
    for (size_t f = 0; f < fields_.size(); ++f) {
      const int64_t row_bytes = fields_[f].sample_bytes();
      char* out = static_cast<char*>(outputs[f]);
      const hdf5::Dataset& dataset = opened.datasets[f];
      std::optional<hdf5::Dataspace> selection;
      int64_t scattered_rows = 0;
      for (size_t i = r; i < end; ++i) {
        const Run& run = runs[i];
        if (is_direct(run)) {
          int64_t position = order[size_t(group_begin[size_t(run.first)])];
          read_rows(opened, f, run.row, run.length, out + position * row_bytes);
          continue;
        }
        if (opened.mapped[f]) {  // every position that asks for a row gets it from the map
          for (int64_t k = 0; k < run.length; ++k) {
            const int64_t u = run.first + k;
            for (int64_t j = group_begin[size_t(u)]; j < group_begin[size_t(u + 1)]; ++j)
              opened.mapped[f]->read(run.row + k, 1, out + order[size_t(j)] * row_bytes);
          }
          continue;
        }
        if (!selection) {
          selection = dataset.space();
          selection->select_rows(run.row, run.length);
        } else {
          selection->add_rows(run.row, run.length);
        }
        scattered_rows += run.length;
      }
      if (!selection) continue;
      scratch.resize(size_t(scattered_rows * row_bytes));
      dataset.read_selection(*selection, scratch.data(), fields_[f].dtype);
      // The selection comes back in file order, which is the runs' order.
      int64_t row = 0;
      for (size_t i = r; i < end; ++i) {
        const Run& run = runs[i];
        if (is_direct(run)) continue;
        for (int64_t k = 0; k < run.length; ++k, ++row) {
          int64_t u = run.first + k;
          for (int64_t j = group_begin[size_t(u)]; j < group_begin[size_t(u + 1)]; ++j) {
            std::memcpy(out + order[size_t(j)] * row_bytes, scratch.data() + row * row_bytes,
                        size_t(row_bytes));
          }
        }
      }
    }
    r = end;
  }
}

core::Tensor Hdf5Dataset::read_field(const std::string& name, int64_t begin, int64_t count) const {
  MPIGRAD_CHECK(begin >= 0 && count >= 0 && begin + count <= total_size_, describe(),
                ": read_field rows [", begin, ", ", begin + count, ") outside the ", total_size_,
                " samples");
  size_t f = 0;
  while (f < fields_.size() && fields_[f].name != name) ++f;
  MPIGRAD_CHECK(f < fields_.size(), describe(), ": no field '", name, "'");
  core::Shape shape = fields_[f].sample_shape;
  shape.insert(0, count);
  core::Tensor out = allocate(fields_[f], shape, std::to_string(count) + " samples");
  std::lock_guard<std::mutex> lock(mutex_);
  read_consecutive(begin, count, {f}, {static_cast<char*>(out.data_ptr())});
  return out;
}

Batch Hdf5Dataset::get_batch(std::span<const int64_t> indices) const {
  check_indices(indices, size(), describe());
  const int64_t n = int64_t(indices.size());
  Batch batch;
  std::vector<void*> outputs;
  for (const FieldInfo& info : fields_) {
    core::Shape shape = info.sample_shape;
    shape.insert(0, n);
    core::Tensor tensor = allocate(info, shape, "a batch of " + std::to_string(n) + " samples",
                                   /*batch=*/true);
    outputs.push_back(tensor.data_ptr());
    batch.fields.emplace_back(info.name, std::move(tensor));
  }
  batch.indices.assign(indices.begin(), indices.end());
  if (n == 0) return batch;

  if (!memory_.empty()) {
    // Copy runs of consecutive indices from the in-memory slice.
    for (size_t f = 0; f < fields_.size(); ++f) {
      const int64_t row_bytes = fields_[f].sample_bytes();
      const char* source = static_cast<const char*>(memory_[f].data_ptr());
      char* out = static_cast<char*>(outputs[f]);
      for (int64_t i = 0; i < n;) {
        int64_t j = i + 1;
        while (j < n && indices[size_t(j)] == indices[size_t(j - 1)] + 1) ++j;
        std::memcpy(out + i * row_bytes, source + indices[size_t(i)] * row_bytes,
                    size_t((j - i) * row_bytes));
        i = j;
      }
    }
    return batch;
  }

  std::vector<int64_t> globals(indices.begin(), indices.end());
  if (slice_) {
    for (auto& g : globals) {
      g += slice_->begin;
      if (g >= total_size_) g -= total_size_;  // a slice is never longer than the dataset
    }
  }
  read_global(globals, outputs);
  return batch;
}

}  // namespace mpigrad::data
