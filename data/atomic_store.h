// An atomic store: ALCHEMI's layout of ragged atomic data, in a Zarr v3 folder (as
// nvalchemi-toolkit's AtomicDataZarrWriter writes it) or the same names in one HDF5 file.
//
//   meta/atoms_ptr    int [S+1]  CSR offsets of each structure's atoms (required)
//   meta/edges_ptr    int [S+1]  of its edges (required when the store has edge fields)
//   meta/samples_mask bool [S]   false: the structure is soft-deleted (optional)
//   meta/atoms_mask   bool [V], meta/edges_mask bool [E]            (optional; lengths checked)
//   core/<field>, custom/<field>  atom fields [V, ...], edge fields [E, ...], system [S, ...]
//   root attributes   num_samples (S, the committed count) and fields: {"core": {name: level},
//                     "custom": {...}} with level "atom", "edge" or "system" (Zarr: the root
//                     zarr.json; HDF5: num_samples on "/", and a "level" string on each dataset)
// A field without a recorded level takes ALCHEMI's default for its name (positions: atom,
// neighbor_list: edge, energy: system, ...; other core fields atom, custom fields system).
//
// Opening reads the metadata and the pointer arrays (8 bytes per structure), never the fields:
// read() fetches the rows of the structures asked for, chunk by chunk through a small cache of
// decoded chunks (data/chunk_cache.h), so each rank reads only its own structures.
//
// A bad store is one core::Error naming the store and the array, raised when it is opened: a
// missing pointer array; pointers that do not start at 0, decrease, or disagree with num_samples;
// a field whose rows disagree with its level's count (atoms_ptr's last entry, edges_ptr's, S); an
// unknown level; an unsupported codec, data type or layout (data/zarr_array.h). Reading a
// soft-deleted structure, or a chunk that is truncated or corrupt, is an error when it happens.
// ALCHEMI's custom levels (a root "levels" attribute) are not read: such a store is refused.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "mpigrad/data/batch.h"
#include "mpigrad/data/chunk_cache.h"
#include "mpigrad/data/stored_array.h"

namespace mpigrad::data {

enum class StoreFormat { Zarr, Hdf5 };

// One field of a store: "core"/"positions" at the atom level, say.
struct StoreField {
  std::string group;  // "core" or "custom"
  std::string name;
  FieldLevel level = FieldLevel::Atom;  // Atom, Edge, or Sample (ALCHEMI's "system")
  std::shared_ptr<const StoredArray> array;
  std::string path() const { return group + "/" + name; }
};

struct AtomicStoreOptions {
  int64_t cache_bytes = int64_t(64) << 20;  // decoded chunks kept (Zarr); 0: none
};

// What a store holds before it is checked: every array under meta/, core/ and custom/ by path
// ("meta/atoms_ptr"), and the root's records. Filled by a format's reader.
struct StoreContents {
  std::vector<std::pair<std::string, std::shared_ptr<const StoredArray>>> arrays;
  std::optional<int64_t> num_samples;
  std::vector<std::pair<std::string, std::string>> levels;  // ("core/positions", "atom")
};

class AtomicStore {
 public:
  // Opens a store: a folder with a zarr.json, or an HDF5 file with meta/ and core/ groups.
  static std::shared_ptr<const AtomicStore> open(const std::string& path,
                                                 AtomicStoreOptions options = {});
  // What `path` holds: a Zarr v3 store, an HDF5 file with meta/ and core/ groups, or neither
  // (nullopt: a plain HDF5 dataset file, say). Throws only for a path that does not exist.
  static std::optional<StoreFormat> detect(const std::string& path);
  // Checks `contents` as the store at `path` (the formats' readers end here).
  AtomicStore(std::string path, StoreFormat format, StoreContents contents,
              std::shared_ptr<ChunkCache> cache);

  const std::string& path() const { return path_; }
  StoreFormat format() const { return format_; }
  std::string describe() const;  // "Zarr store a.zarr (120 structures, 3 deleted)"

  int64_t num_samples() const { return int64_t(atoms_ptr_.size()) - 1; }  // deleted included
  // The structures not soft-deleted, in stored order: what a dataset's index i means.
  const std::vector<int64_t>& active() const { return active_; }
  bool deleted(int64_t sample) const { return !mask_.empty() && mask_[size_t(sample)] == 0; }
  const std::vector<int64_t>& atoms_ptr() const { return atoms_ptr_; }
  const std::vector<int64_t>& edges_ptr() const { return edges_ptr_; }
  int64_t num_atoms(int64_t sample) const {
    return atoms_ptr_[size_t(sample) + 1] - atoms_ptr_[size_t(sample)];
  }
  int64_t num_edges(int64_t sample) const {
    return edges_ptr_[size_t(sample) + 1] - edges_ptr_[size_t(sample)];
  }

  const std::vector<StoreField>& fields() const { return fields_; }
  const StoreField* find(const std::string& name) const;  // by field name; null when absent

  // The rows of `field` for the stored structures `samples` (in that order), concatenated into
  // `out`: an atom field's atoms, an edge field's edges, a system field's one row each. Throws
  // for a soft-deleted structure or one out of range, naming the store and meta/samples_mask.
  void read(const StoreField& field, std::span<const int64_t> samples, void* out) const;
  // Rows `field` holds for `samples`: their atoms, edges or count.
  int64_t rows_for(const StoreField& field, std::span<const int64_t> samples) const;

  const ChunkCache* cache() const { return cache_.get(); }

 private:
  std::string what() const;  // "Zarr store a.zarr"
  std::vector<int64_t> read_pointer(const StoredArray& array) const;

  std::string path_;
  StoreFormat format_;
  std::shared_ptr<ChunkCache> cache_;
  std::vector<int64_t> atoms_ptr_, edges_ptr_;
  std::vector<uint8_t> mask_;  // empty: none deleted
  std::vector<int64_t> active_;
  std::vector<StoreField> fields_;
};

// The two formats' readers (data/zarr_store.cpp, data/hdf5_store.cpp).
StoreContents read_zarr_contents(const std::string& path, const std::shared_ptr<ChunkCache>& cache);
StoreContents read_hdf5_contents(const std::string& path);

}  // namespace mpigrad::data
