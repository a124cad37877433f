#include "mpigrad/data/atomic_store.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "mpigrad/core/error.h"
#include "mpigrad/core/hdf5.h"
#include "mpigrad/data/zarr_array.h"

namespace mpigrad::data {

namespace fs = std::filesystem;

namespace {

// ALCHEMI's levels of AtomicData's own fields, for stores that record none (its reader's rule:
// any other core field is an atom field, any custom field a system field).
const std::set<std::string> kEdgeFields = {"shifts", "neighbor_list_shifts", "neighbor_list",
                                           "edge_embeddings"};
const std::set<std::string> kSystemFields = {
    "energy", "stress", "virial", "dipole", "charge", "graph_embeddings", "cell", "pbc", "spin"};

FieldLevel default_level(const std::string& group, const std::string& name) {
  if (group == "custom") return FieldLevel::Sample;
  if (kEdgeFields.count(name)) return FieldLevel::Edge;
  if (kSystemFields.count(name)) return FieldLevel::Sample;
  return FieldLevel::Atom;
}

const char* level_text(FieldLevel level) {
  return level == FieldLevel::Atom ? "atom" : level == FieldLevel::Edge ? "edge" : "system";
}

}  // namespace

std::optional<StoreFormat> AtomicStore::detect(const std::string& path) {
  std::error_code error;
  MPIGRAD_CHECK(fs::exists(path, error), "data: '", path, "' does not exist");
  if (fs::is_directory(path, error)) {
    if (zarr_node_kind(path) == ZarrNode::Group) return StoreFormat::Zarr;
    return std::nullopt;
  }
  core::hdf5::File file;
  try {
    file = core::hdf5::File::open(path);
  } catch (const core::Error&) {
    return std::nullopt;  // not HDF5: the caller's own reader says what it is not
  }
  if (file.kind("meta") == core::hdf5::ObjectKind::Group &&
      file.kind("core") == core::hdf5::ObjectKind::Group) {
    return StoreFormat::Hdf5;
  }
  return std::nullopt;
}

std::shared_ptr<const AtomicStore> AtomicStore::open(const std::string& path,
                                                     AtomicStoreOptions options) {
  MPIGRAD_CHECK(options.cache_bytes >= 0, "AtomicStore ", path, ": cache_bytes must be >= 0");
  const std::optional<StoreFormat> format = detect(path);
  MPIGRAD_CHECK(format.has_value(), "data: '", path,
                "' is not an atomic store (a Zarr v3 folder with a zarr.json, or an HDF5 file "
                "with groups meta/ and core/)");
  auto cache = std::make_shared<ChunkCache>(options.cache_bytes);
  StoreContents contents =
      *format == StoreFormat::Zarr ? read_zarr_contents(path, cache) : read_hdf5_contents(path);
  return std::make_shared<const AtomicStore>(path, *format, std::move(contents), std::move(cache));
}

std::string AtomicStore::what() const {
  return std::string(format_ == StoreFormat::Zarr ? "Zarr store " : "HDF5 store ") + path_;
}

std::string AtomicStore::describe() const {
  std::string text = what() + " (" + std::to_string(active_.size()) + " structures";
  if (int64_t(active_.size()) != num_samples()) {
    text += ", " + std::to_string(num_samples() - int64_t(active_.size())) + " deleted";
  }
  return text + ")";
}

std::vector<int64_t> AtomicStore::read_pointer(const StoredArray& array) const {
  MPIGRAD_CHECK(array.shape().size() == 1, what(), ": ", array.name(), " has shape ",
                core::Shape(array.shape()), "; a pointer array is 1-d [S+1]");
  MPIGRAD_CHECK(array.dtype() == core::kInt64 || array.dtype() == core::kInt32, what(), ": ",
                array.name(), " is ", array.stored_type(), "; a pointer array holds integers");
  // Read whole, so refused before an allocation a corrupt extent would make absurd.
  MPIGRAD_CHECK(array.rows() <= (int64_t(1) << 31), what(), ": ", array.name(), " declares ",
                array.rows(), " entries, more than the 2^31 structures a store may hold");
  std::vector<int64_t> values(static_cast<size_t>(array.rows()));
  if (array.dtype() == core::kInt64) {
    array.read_rows(0, array.rows(), values.data());
  } else {
    std::vector<int32_t> narrow(values.size());
    array.read_rows(0, array.rows(), narrow.data());
    std::copy(narrow.begin(), narrow.end(), values.begin());
  }
  MPIGRAD_CHECK(!values.empty() && values[0] == 0, what(), ": ", array.name(),
                " must start at 0 (CSR offsets), got ",
                values.empty() ? std::string("no entries") : std::to_string(values[0]));
  for (size_t i = 1; i < values.size(); ++i) {
    MPIGRAD_CHECK(values[i] >= values[i - 1], what(), ": ", array.name(), " decreases at entry ", i,
                  " (", values[i - 1], " then ", values[i], "); CSR offsets never decrease");
  }
  return values;
}

AtomicStore::AtomicStore(std::string path, StoreFormat format, StoreContents contents,
                         std::shared_ptr<ChunkCache> cache)
    : path_(std::move(path)), format_(format), cache_(std::move(cache)) {
  auto array_at = [&](const std::string& name) -> std::shared_ptr<const StoredArray> {
    for (const auto& [key, array] : contents.arrays) {
      if (key == name) return array;
    }
    return nullptr;
  };
  // Fields first: whether edges_ptr is required depends on them.
  for (const auto& [key, array] : contents.arrays) {
    const size_t slash = key.find('/');
    const std::string group = key.substr(0, slash);
    if (group != "core" && group != "custom") continue;
    StoreField field{group, key.substr(slash + 1), default_level(group, key.substr(slash + 1)),
                     array};
    for (const auto& [levelled, level] : contents.levels) {
      if (levelled != key) continue;
      if (level == "atom") {
        field.level = FieldLevel::Atom;
      } else if (level == "edge") {
        field.level = FieldLevel::Edge;
      } else if (level == "system") {
        field.level = FieldLevel::Sample;
      } else {
        core::fail(what(), ": ", key, " has level '", level,
                   "'; expected atom, edge or system (custom levels are not read)");
      }
    }
    MPIGRAD_CHECK(!array->shape().empty(), what(), ": ", key, " is a scalar; a field has rows");
    // ALCHEMI concatenates its built-in "*index*"/"*face*" fields along their last axis.
    const bool last_axis = group == "core" && field.name != "neighbor_list" &&
                           (field.name.find("index") != std::string::npos ||
                            field.name.find("face") != std::string::npos);
    MPIGRAD_CHECK(!last_axis || array->shape().size() == 1, what(), ": ", key,
                  " is concatenated along its last axis (ALCHEMI's rule for core *index* and "
                  "*face* fields), which this reader does not support");
    for (const StoreField& other : fields_) {
      MPIGRAD_CHECK(other.name != field.name, what(), ": field '", field.name,
                    "' is stored twice (", other.path(), " and ", key, ")");
    }
    fields_.push_back(std::move(field));
  }

  const std::shared_ptr<const StoredArray> atoms = array_at("meta/atoms_ptr");
  MPIGRAD_CHECK(atoms != nullptr, what(), ": missing pointer array meta/atoms_ptr (int64 [S+1], ",
                "each structure's first atom)");
  atoms_ptr_ = read_pointer(*atoms);
  const int64_t samples = int64_t(atoms_ptr_.size()) - 1;
  if (contents.num_samples) {
    MPIGRAD_CHECK(*contents.num_samples == samples, what(),
                  ": the store records num_samples = ", *contents.num_samples,
                  " but meta/atoms_ptr has ", atoms_ptr_.size(), " entries (", samples,
                  " structures); an interrupted append leaves this");
  }
  if (const auto edges = array_at("meta/edges_ptr")) {
    edges_ptr_ = read_pointer(*edges);
    MPIGRAD_CHECK(int64_t(edges_ptr_.size()) == samples + 1, what(), ": meta/edges_ptr has ",
                  edges_ptr_.size(), " entries but meta/atoms_ptr has ", atoms_ptr_.size());
  } else {
    for (const StoreField& field : fields_) {
      MPIGRAD_CHECK(field.level != FieldLevel::Edge, what(),
                    ": missing pointer array meta/edges_ptr, needed by the edge field ",
                    field.path());
    }
    edges_ptr_.assign(atoms_ptr_.size(), 0);
  }
  if (const auto mask = array_at("meta/samples_mask")) {
    MPIGRAD_CHECK(mask->shape() == std::vector<int64_t>{samples} &&
                      (mask->dtype() == core::kBool || mask->dtype() == core::kUInt8),
                  what(), ": meta/samples_mask is ", mask->stored_type(), " ",
                  core::Shape(mask->shape()), "; expected bool [", samples, "]");
    mask_.resize(size_t(samples));
    mask->read_rows(0, samples, mask_.data());
    if (std::all_of(mask_.begin(), mask_.end(), [](uint8_t m) { return m != 0; })) mask_.clear();
  }
  for (int64_t s = 0; s < samples; ++s) {
    if (!deleted(s)) active_.push_back(s);
  }
  const int64_t total_atoms = atoms_ptr_.back(), total_edges = edges_ptr_.back();
  for (const char* name : {"atoms_mask", "edges_mask"}) {
    const auto mask = array_at(std::string("meta/") + name);
    if (!mask) continue;
    const int64_t expected = name[0] == 'a' ? total_atoms : total_edges;
    MPIGRAD_CHECK(mask->shape() == std::vector<int64_t>{expected}, what(), ": meta/", name,
                  " has shape ", core::Shape(mask->shape()), " but the pointers give ", expected,
                  name[0] == 'a' ? " atoms" : " edges");
  }
  for (const StoreField& field : fields_) {
    const int64_t rows = field.array->rows();
    const int64_t expected = field.level == FieldLevel::Atom   ? total_atoms
                             : field.level == FieldLevel::Edge ? total_edges
                                                               : samples;
    const char* source = field.level == FieldLevel::Atom   ? "meta/atoms_ptr ends at"
                         : field.level == FieldLevel::Edge ? "meta/edges_ptr ends at"
                                                           : "the store has";
    const char* unit = field.level == FieldLevel::Atom   ? "atoms"
                       : field.level == FieldLevel::Edge ? "edges"
                                                         : "structures";
    MPIGRAD_CHECK(rows == expected, what(), ": ", field.path(), " (", level_text(field.level),
                  " level) has ", rows, " rows but ", source, " ", expected, " ", unit);
  }
}

const StoreField* AtomicStore::find(const std::string& name) const {
  for (const StoreField& field : fields_) {
    if (field.name == name) return &field;
  }
  return nullptr;
}

int64_t AtomicStore::rows_for(const StoreField& field, std::span<const int64_t> samples) const {
  if (field.level == FieldLevel::Sample) return int64_t(samples.size());
  const std::vector<int64_t>& ptr = field.level == FieldLevel::Atom ? atoms_ptr_ : edges_ptr_;
  int64_t rows = 0;
  for (int64_t s : samples) rows += ptr[size_t(s) + 1] - ptr[size_t(s)];
  return rows;
}

void AtomicStore::read(const StoreField& field, std::span<const int64_t> samples, void* out) const {
  const std::vector<int64_t>* ptr = field.level == FieldLevel::Atom   ? &atoms_ptr_
                                    : field.level == FieldLevel::Edge ? &edges_ptr_
                                                                      : nullptr;
  const int64_t row_bytes = field.array->row_bytes();
  char* output = static_cast<char*>(out);
  // Structures stored one after another are read as one range of rows.
  for (size_t i = 0; i < samples.size();) {
    size_t j = i;
    int64_t begin = 0, end = 0;
    while (j < samples.size()) {
      const int64_t s = samples[j];
      MPIGRAD_CHECK(s >= 0 && s < num_samples(), what(), ": structure ", s, " out of range [0, ",
                    num_samples(), ")");
      MPIGRAD_CHECK(!deleted(s), what(), ": structure ", s,
                    " is soft-deleted (meta/samples_mask is false there)");
      const int64_t first = ptr ? (*ptr)[size_t(s)] : s;
      const int64_t last = ptr ? (*ptr)[size_t(s) + 1] : s + 1;
      if (j == i) {
        begin = first;
      } else if (first != end) {
        break;
      }
      end = last;
      ++j;
    }
    field.array->read_rows(begin, end - begin, output);
    output += (end - begin) * row_bytes;
    i = j;
  }
}

}  // namespace mpigrad::data
