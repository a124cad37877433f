#include "mpigrad/data/atomic_dataset.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "mpigrad/core/error.h"
#include "mpigrad/data/batch_buffers.h"
#include "mpigrad/data/multi_dataset.h"
#include "mpigrad/data/ragged_batch.h"

namespace mpigrad::data {

namespace {

// Store fields the batch consumes into the contract's own fields.
bool consumed(const std::string& name) {
  return name == "neighbor_list" || name == "shifts" || name == "neighbor_list_shifts";
}

bool is_integer(core::DType dtype) {
  return dtype == core::kInt32 || dtype == core::kInt64 || dtype == core::kUInt8;
}

}  // namespace

AtomicDataset::AtomicDataset(const std::string& path, AtomicDatasetOptions options)
    : AtomicDataset(AtomicStore::open(path, {.cache_bytes = options.cache_bytes}), options) {}

AtomicDataset::AtomicDataset(std::shared_ptr<const AtomicStore> store, AtomicDatasetOptions options)
    : store_(std::move(store)) {
  MPIGRAD_CHECK(store_ != nullptr, "AtomicDataset: no store");
  for (const std::string& name : options.fields) {
    MPIGRAD_CHECK(store_->find(name) != nullptr, store_->describe(), ": no field '", name,
                  "' to read");
  }
  auto wanted = [&](const std::string& name) -> const StoreField* {
    const StoreField* field = store_->find(name);
    if (field == nullptr) return nullptr;
    const bool listed =
        options.fields.empty() ||
        std::find(options.fields.begin(), options.fields.end(), name) != options.fields.end();
    return listed ? field : nullptr;
  };
  auto require_level = [&](const StoreField& field, FieldLevel level) {
    MPIGRAD_CHECK(field.level == level, store_->describe(), ": ", field.path(), " is at the ",
                  field_level_name(field.level), " level, expected ", field_level_name(level));
  };
  const StoreField* positions = store_->find("positions");
  const StoreField* numbers = store_->find("atomic_numbers");
  MPIGRAD_CHECK(positions != nullptr, store_->describe(), ": missing core/positions");
  MPIGRAD_CHECK(numbers != nullptr, store_->describe(), ": missing core/atomic_numbers");
  require_level(*positions, FieldLevel::Atom);
  require_level(*numbers, FieldLevel::Atom);
  check_shape(*positions, {3}, "Cartesian positions");
  check_shape(*numbers, {}, "atomic numbers");
  MPIGRAD_CHECK(is_integer(numbers->array->dtype()), store_->describe(),
                ": core/atomic_numbers is ", numbers->array->stored_type(), ", not integers");
  auto add = [&](std::string name, core::DType dtype, core::Shape shape, FieldLevel level,
                 const StoreField* stored) {
    sources_.push_back({FieldInfo{std::move(name), dtype, shape, level}, stored});
  };
  add("positions", core::kFloat32, {3}, FieldLevel::Atom, positions);
  add("atomic_numbers", core::kInt64, {}, FieldLevel::Atom, numbers);
  add("batch", core::kInt64, {}, FieldLevel::AtomSample, nullptr);
  add("atoms_ptr", core::kInt64, {}, FieldLevel::AtomPointer, nullptr);
  add("num_atoms", core::kInt64, {}, FieldLevel::Sample, nullptr);
  if (const StoreField* energy = wanted("energy")) {
    require_level(*energy, FieldLevel::Sample);
    MPIGRAD_CHECK(energy->array->row_shape().numel() == 1, store_->describe(),
                  ": core/energy has rows of shape ", energy->array->row_shape(),
                  "; one energy per structure ([S] or [S, 1]) is expected");
    add("energy", core::kFloat32, {}, FieldLevel::Sample, energy);
  }
  if (const StoreField* forces = wanted("forces")) {
    require_level(*forces, FieldLevel::Atom);
    check_shape(*forces, {3}, "forces");
    add("forces", core::kFloat32, {3}, FieldLevel::Atom, forces);
  }
  cell_ = wanted("cell");
  if (cell_ != nullptr) {
    require_level(*cell_, FieldLevel::Sample);
    check_shape(*cell_, {3, 3}, "a cell (lattice vectors as rows)");
  }
  add("cell", core::kFloat32, {3, 3}, FieldLevel::Sample, cell_);
  const StoreField* pbc = wanted("pbc");
  if (pbc != nullptr) {
    require_level(*pbc, FieldLevel::Sample);
    check_shape(*pbc, {3}, "periodic boundaries per axis");
  }
  add("pbc", core::kBool, {3}, FieldLevel::Sample, pbc);
  if (const StoreField* stress = wanted("stress")) {
    require_level(*stress, FieldLevel::Sample);
    check_shape(*stress, {3, 3}, "a stress tensor");
    add("stress", core::kFloat32, {3, 3}, FieldLevel::Sample, stress);
  }
  neighbor_list_ = wanted("neighbor_list");
  bool edges = false;
  if (neighbor_list_ != nullptr) {
    require_level(*neighbor_list_, FieldLevel::Edge);
    check_shape(*neighbor_list_, {2}, "edges as (source, target) atom rows");
    MPIGRAD_CHECK(is_integer(neighbor_list_->array->dtype()), store_->describe(),
                  ": core/neighbor_list is ", neighbor_list_->array->stored_type(),
                  ", not integers");
    shifts_ = wanted("shifts");
    unit_shifts_ = shifts_ ? nullptr : wanted("neighbor_list_shifts");
    if (shifts_ != nullptr) {
      require_level(*shifts_, FieldLevel::Edge);
      check_shape(*shifts_, {3}, "Cartesian image shifts");
    }
    if (unit_shifts_ != nullptr) {
      require_level(*unit_shifts_, FieldLevel::Edge);
      check_shape(*unit_shifts_, {3}, "integer image shifts");
      // The cell turns them into Cartesian shifts, read even when not listed.
      shift_cell_ = store_->find("cell");
      MPIGRAD_CHECK(shift_cell_ != nullptr, store_->describe(),
                    ": core/neighbor_list_shifts (integer image shifts) needs core/cell");
      require_level(*shift_cell_, FieldLevel::Sample);
      check_shape(*shift_cell_, {3, 3}, "a cell (lattice vectors as rows)");
    }
    add("edge_index", core::kInt64, {2}, FieldLevel::EdgeAtoms, nullptr);
    add("edge_shifts", core::kFloat32, {3}, FieldLevel::Edge, nullptr);
    edges = true;
  }
  std::vector<Source> others;
  for (const StoreField& field : store_->fields()) {
    const std::string& name = field.name;
    const bool known = name == "positions" || name == "atomic_numbers" || name == "energy" ||
                       name == "forces" || name == "cell" || name == "pbc" || name == "stress" ||
                       consumed(name);
    if (known || wanted(name) == nullptr) continue;
    MPIGRAD_CHECK(name != "batch" && name != "atoms_ptr" && name != "edges_ptr" &&
                      name != "num_atoms" && name != "edge_index" && name != "edge_shifts",
                  store_->describe(), ": field ", field.path(),
                  " has the name of a field every batch makes; leave it out with the fields "
                  "option");
    edges = edges || field.level == FieldLevel::Edge;
    others.push_back(
        {FieldInfo{name, field.array->dtype(), field.array->row_shape(), field.level}, &field});
  }
  if (edges) add("edges_ptr", core::kInt64, {}, FieldLevel::EdgePointer, nullptr);
  sources_.insert(sources_.end(), others.begin(), others.end());
  for (const Source& source : sources_) fields_.push_back(source.info);
}

void AtomicDataset::check_shape(const StoreField& field, std::initializer_list<int64_t> row,
                                const char* meaning) const {
  const core::Shape expected(std::vector<int64_t>(row.begin(), row.end()));
  MPIGRAD_CHECK(field.array->row_shape() == expected, store_->describe(), ": ", field.path(),
                " has rows of shape ", field.array->row_shape(), "; ", meaning, " need ", expected);
}

std::string AtomicDataset::describe() const {
  return "AtomicDataset " + store_->describe();
}

int64_t AtomicDataset::num_atoms(int64_t index) const {
  MPIGRAD_CHECK(index >= 0 && index < size(), describe(), ": index ", index, " out of range [0, ",
                size(), ")");
  return store_->num_atoms(store_->active()[size_t(index)]);
}

std::vector<int64_t> AtomicDataset::atom_counts() const {
  std::vector<int64_t> counts;
  counts.reserve(store_->active().size());
  for (int64_t s : store_->active()) counts.push_back(store_->num_atoms(s));
  return counts;
}

// The rows of `field` for `samples`, as `dtype` (converted when stored otherwise).
core::Tensor AtomicDataset::read_field(const StoreField& field, const std::vector<int64_t>& samples,
                                       core::DType dtype) const {
  core::Shape shape = field.array->row_shape();
  shape.insert(0, store_->rows_for(field, samples));
  core::Tensor raw = empty_batch_tensor(shape, field.array->dtype());
  store_->read(field, samples, raw.data_ptr());
  return raw.dtype() == dtype ? raw : raw.to(dtype);
}

Batch AtomicDataset::get_batch(std::span<const int64_t> indices) const {
  check_indices(indices, size(), describe());
  const int64_t n = int64_t(indices.size());
  std::vector<int64_t> samples, atom_counts, edge_counts;
  for (int64_t index : indices) {
    const int64_t s = store_->active()[size_t(index)];
    samples.push_back(s);
    atom_counts.push_back(store_->num_atoms(s));
    edge_counts.push_back(store_->num_edges(s));
  }
  const core::Tensor atoms_ptr = offsets_from_counts(atom_counts);
  Batch batch;
  for (const Source& source : sources_) {
    const FieldInfo& info = source.info;
    core::Tensor tensor;
    if (source.stored != nullptr && info.level != FieldLevel::EdgeAtoms) {
      tensor = read_field(*source.stored, samples, info.dtype);
      core::Shape shape = info.sample_shape;
      shape.insert(0, tensor.shape()[0]);
      tensor = tensor.reshape(shape);  // [S, 1] energies become [B]
    } else if (info.level == FieldLevel::AtomSample) {
      tensor = sample_of_rows(atom_counts);
    } else if (info.level == FieldLevel::AtomPointer) {
      tensor = atoms_ptr;
    } else if (info.level == FieldLevel::EdgePointer) {
      tensor = offsets_from_counts(edge_counts);
    } else if (info.name == "num_atoms") {
      tensor = core::Tensor::from_vector(atom_counts, {n});
    } else if (info.level == FieldLevel::EdgeAtoms) {
      const core::Tensor pairs = read_field(*neighbor_list_, samples, core::kInt64);
      const int64_t edges = pairs.shape()[0];
      tensor = empty_batch_tensor({2, edges}, core::kInt64);
      const int64_t* from = pairs.data<int64_t>();
      int64_t* to = tensor.data<int64_t>();
      const int64_t* first_atom = atoms_ptr.data<int64_t>();
      int64_t e = 0;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t stored_first = store_->atoms_ptr()[size_t(samples[size_t(i)])];
        for (int64_t k = 0; k < edge_counts[size_t(i)]; ++k, ++e) {
          for (int side = 0; side < 2; ++side) {
            const int64_t local = from[e * 2 + side] - stored_first;
            MPIGRAD_CHECK(local >= 0 && local < atom_counts[size_t(i)], store_->describe(),
                          ": core/neighbor_list edge ", k, " of structure ", samples[size_t(i)],
                          " names atom row ", from[e * 2 + side],
                          ", outside the structure's rows [", stored_first, ", ",
                          stored_first + atom_counts[size_t(i)], ")");
            to[side * edges + e] = first_atom[i] + local;
          }
        }
      }
    } else if (info.name == "edge_shifts") {
      const int64_t edges = std::accumulate(edge_counts.begin(), edge_counts.end(), int64_t(0));
      if (shifts_ != nullptr) {
        tensor = read_field(*shifts_, samples, core::kFloat32);
      } else if (unit_shifts_ != nullptr) {
        const core::Tensor units = read_field(*unit_shifts_, samples, core::kFloat32);
        const core::Tensor cell = read_field(*shift_cell_, samples, core::kFloat32);
        tensor = empty_batch_tensor({edges, 3}, core::kFloat32);
        const float* image = units.data<float>();
        const float* lattice = cell.data<float>();
        float* out = tensor.data<float>();
        int64_t e = 0;
        for (int64_t i = 0; i < n; ++i) {
          const float* vectors = lattice + i * 9;  // rows are the lattice vectors
          for (int64_t k = 0; k < edge_counts[size_t(i)]; ++k, ++e) {
            for (int axis = 0; axis < 3; ++axis) {
              out[e * 3 + axis] = image[e * 3] * vectors[axis] +
                                  image[e * 3 + 1] * vectors[3 + axis] +
                                  image[e * 3 + 2] * vectors[6 + axis];
            }
          }
        }
      } else {
        tensor = core::zeros({edges, 3}, core::kFloat32);
      }
    } else if (info.name == "cell") {
      tensor = core::zeros({n, 3, 3}, core::kFloat32);
    } else if (info.name == "pbc") {
      tensor = core::zeros({n, 3}, core::kBool);
    } else {
      core::fail(describe(), ": no way to make field '", info.name, "'");  // not reached
    }
    batch.fields.emplace_back(info.name, std::move(tensor));
  }
  batch.indices.assign(indices.begin(), indices.end());
  return batch;
}

std::vector<int64_t> dataset_atom_counts(const Dataset& dataset) {
  if (const auto* atomic = dynamic_cast<const AtomicDataset*>(&dataset)) {
    return atomic->atom_counts();
  }
  if (const auto* multi = dynamic_cast<const MultiDataset*>(&dataset)) {
    std::vector<int64_t> counts;
    for (int d = 0; d < multi->num_datasets(); ++d) {
      std::vector<int64_t> child = dataset_atom_counts(multi->child(d));
      if (child.empty() && multi->child(d).size() > 0) return {};
      counts.insert(counts.end(), child.begin(), child.end());
    }
    return counts;
  }
  return {};
}

}  // namespace mpigrad::data
