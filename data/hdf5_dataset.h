// A dataset stored as HDF5: one HDF5 dataset per field ("/x", "/y", ...), all sharing the
// leading dimension N, possibly split across several files (shards) whose samples join in order
// into one index space. Anyone can write one with h5py:
//     with h5py.File("train.h5", "w") as f: f["x"] = images; f["y"] = labels
//
// Reading a batch sorts its indices, merges neighbours into runs, reads each shard's runs with
// one hyperslab selection per field, and scatters the rows back into the requested order (a run
// that is already in order goes straight into the batch tensor, no copy). A contiguous field
// stored as it is read (h5py's default layout) skips HDF5 for its rows: they are copied from a
// read-only map of the file (core/hdf5/mapped_rows.h), with no system call per row. At most
// max_open_files shards are open at once (least recently used closed first), and each chunked
// dataset's chunk cache is sized for the access pattern.
//
// Slice mode restricts a rank to its own contiguous range of the index space (rank_slice), read
// on demand or loaded into memory up front with one read per field and shard.
//
// Fields are read in their stored dtype; integer types without a DType of their own (int8,
// int16, uint16, uint32, uint64) are read as int32 or int64 (hdf5::Datatype::read_as).
//
// Every problem with the files (missing file or field, fields with different N, shards that
// disagree on dtype or per-sample shape, unsupported dtypes, corrupt or truncated files, a
// dataset that declares more samples than its file stores, indices out of range, fewer samples
// than ranks) is a core::Error naming the file and the field, raised when the files are opened.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "mpigrad/core/hdf5.h"
#include "mpigrad/data/dataset.h"

namespace mpigrad::data {

// How batches will walk the file; decides the chunk cache.
enum class AccessPattern {
  Random,     // shuffled indices: cache as much of each dataset as is sensible (up to 128 MiB)
  Sequential  // in order, or slice mode: two chunks, fully read chunks evicted first
};

struct Hdf5DatasetOptions {
  std::vector<std::string> fields = {"x", "y"};
  int max_open_files = 16;
  AccessPattern access = AccessPattern::Random;
  // Chunk cache per dataset, in bytes; 0 sizes it from `access` and the chunk size.
  int64_t chunk_cache_bytes = 0;
  // Opens a shard by its path; empty: core::hdf5::File::open. (The fuzz targets open in-memory
  // images: core::hdf5::File::open_image.)
  std::function<core::hdf5::File(const std::string& path)> open_file = {};
};

// Samples begin, begin + 1, ..., begin + length - 1 of the index space, wrapping past the end.
struct IndexSlice {
  int64_t begin = 0;
  int64_t length = 0;
};

// Rank `rank`'s contiguous share of `size` samples among `num_replicas` ranks, with PyTorch's
// DistributedSampler counts: ceil(N / R) samples each, the last rank wrapping to the start to
// pad (drop_last = false), or N / R each and the tail dropped (drop_last = true). Throws when
// there are fewer samples than ranks.
IndexSlice rank_slice(int64_t size, int64_t num_replicas, int64_t rank, bool drop_last);

class Hdf5Dataset : public Dataset {
 public:
  // `paths`: the shards, in the order their samples join. Opens each once to read and check the
  // fields' dtypes and shapes.
  explicit Hdf5Dataset(std::vector<std::string> paths, Hdf5DatasetOptions options = {});
  ~Hdf5Dataset() override;

  int64_t size() const override;  // the slice's length in slice mode
  const std::vector<FieldInfo>& fields() const override { return fields_; }
  Batch get_batch(std::span<const int64_t> indices) const override;
  std::string describe() const override;

  // ---- Slice mode (call before reading, not concurrently with it) ----------------------------
  // From now on index i means sample slice.begin + i (mod total_size()). With in_memory the
  // slice is read now, one read per field and shard, and the files are closed.
  void set_slice(IndexSlice slice, bool in_memory = false);
  // set_slice(rank_slice(total_size(), num_replicas, rank, drop_last), in_memory).
  void set_rank_slice(int64_t num_replicas, int64_t rank, bool drop_last = false,
                      bool in_memory = false);
  std::optional<IndexSlice> slice() const { return slice_; }
  bool in_memory() const { return !memory_.empty(); }

  // Rows [begin, begin + count) of one field over the whole index space (slices ignored), in
  // the field's dtype: for scanning a field (labels, say) in bounded pieces without the others.
  core::Tensor read_field(const std::string& name, int64_t begin, int64_t count) const;

  // ---- The files -----------------------------------------------------------------------------
  int64_t total_size() const { return total_size_; }
  int num_shards() const { return int(shards_.size()); }
  const std::string& shard_path(int shard) const { return shards_.at(size_t(shard)).path; }
  int64_t shard_size(int shard) const { return shards_.at(size_t(shard)).size; }
  int open_files() const;  // shards open right now (at most max_open_files)
  const Hdf5DatasetOptions& options() const { return options_; }

 private:
  struct Shard {
    std::string path;
    int64_t begin = 0;  // first global index
    int64_t size = 0;
  };
  struct OpenShard {
    core::hdf5::File file;
    std::vector<core::hdf5::Dataset> datasets;  // one per field
    // Per field: its rows as bytes from a map of the file, where they can be (MappedRows);
    // files opened through options.open_file are never mapped.
    std::vector<std::optional<core::hdf5::MappedRows>> mapped;
    uint64_t last_use = 0;
  };
  // A maximal run of consecutive global indices inside one shard.
  struct Run {
    int shard;
    int64_t row;  // first row inside the shard
    int64_t length;
    int64_t first;  // index into the sorted request of the run's first sample
  };

  OpenShard open_shard(int shard, std::vector<FieldInfo>* infos_out) const;
  static void check_backed(const core::hdf5::Dataset& dataset, const core::hdf5::File& file);
  OpenShard& acquire(int shard) const;  // caller holds mutex_
  // Rows [row, row + count) of field f of an open shard into `out`: from its map, or HDF5.
  void read_rows(const OpenShard& shard, size_t f, int64_t row, int64_t count, char* out) const;
  int shard_of(int64_t global) const;
  void read_global(const std::vector<int64_t>& globals, std::vector<void*>& outputs) const;
  void read_consecutive(int64_t first, int64_t count, const std::vector<size_t>& fields,
                        const std::vector<char*>& outputs) const;
  void load_slice_into_memory();
  core::Tensor allocate(const FieldInfo& field, const core::Shape& shape,
                        const std::string& purpose, bool batch = false) const;

  Hdf5DatasetOptions options_;
  std::vector<Shard> shards_;
  std::vector<FieldInfo> fields_;
  int64_t total_size_ = 0;
  std::optional<IndexSlice> slice_;
  std::vector<core::Tensor> memory_;  // slice mode in memory: one tensor per field

  mutable std::mutex mutex_;
  mutable std::map<int, OpenShard> open_;
  mutable uint64_t use_clock_ = 0;
};

}  // namespace mpigrad::data
