// STAND-IN for issue 35's data part (see data/training_data.h): one HDF5 file in ALCHEMI's layout,
// read whole into memory. Known fields only: atom level positions, atomic_numbers, forces; system
// level energy, cell, pbc, stress; the edge level neighbor_list [E, 2] (store-global atom rows).
#include <algorithm>
#include <filesystem>

#include "mpigrad/core/error.h"
#include "mpigrad/core/hdf5.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/data/training_data.h"

namespace mpigrad::data {

namespace {

class InMemoryAtomicStore final : public Dataset {
 public:
  InMemoryAtomicStore(const std::string& path, const std::string& key) : path_(path) {
    MPIGRAD_CHECK(std::filesystem::is_regular_file(path), key, ": '", path,
                  "' is not a file (this build reads atomic data from one HDF5 file)");
    const core::hdf5::File file = core::hdf5::File::open(path);
    MPIGRAD_CHECK(file.exists("meta/atoms_ptr"), key, ": '", path, "' has no meta/atoms_ptr");
    atoms_ptr_ = file.read_tensor("meta/atoms_ptr").to(core::kInt64).to_vector<int64_t>();
    MPIGRAD_CHECK(atoms_ptr_.size() >= 2, key, ": '", path, "': meta/atoms_ptr holds no structure");
    const int64_t atoms = atoms_ptr_.back();
    for (const char* name : {"positions", "atomic_numbers", "forces"}) {
      if (!file.exists(std::string("core/") + name)) continue;
      core::Tensor tensor = file.read_tensor(std::string("core/") + name);
      MPIGRAD_CHECK(tensor.size(0) == atoms, key, ": '", path, "' core/", name, " has ",
                    tensor.size(0), " rows; meta/atoms_ptr counts ", atoms, " atoms");
      atom_fields_.emplace_back(name, tensor);
    }
    for (const char* name : {"energy", "cell", "pbc", "stress"}) {
      if (!file.exists(std::string("core/") + name)) continue;
      core::Tensor tensor = file.read_tensor(std::string("core/") + name);
      MPIGRAD_CHECK(tensor.size(0) == size(), key, ": '", path, "' core/", name, " has ",
                    tensor.size(0), " rows for ", size(), " structures");
      if (std::string(name) == "energy") tensor = tensor.reshape({size()});
      if (std::string(name) == "pbc") tensor = tensor.to(core::kBool);
      system_fields_.emplace_back(name, tensor);
    }
    if (file.exists("core/neighbor_list")) {
      MPIGRAD_CHECK(file.exists("meta/edges_ptr"), key, ": '", path,
                    "' has core/neighbor_list but no meta/edges_ptr");
      edges_ptr_ = file.read_tensor("meta/edges_ptr").to(core::kInt64).to_vector<int64_t>();
      neighbors_ =
          file.read_tensor("core/neighbor_list").to(core::kInt64).contiguous().to_vector<int64_t>();
    }
    for (const auto& [name, tensor] : atom_fields_) {
      core::Shape row = tensor.shape();
      row.erase(0);
      fields_.push_back({name, tensor.dtype(), row});
    }
    for (const auto& [name, tensor] : system_fields_) {
      core::Shape row = tensor.shape();
      row.erase(0);
      fields_.push_back({name, tensor.dtype(), row});
    }
  }

  int64_t size() const override { return int64_t(atoms_ptr_.size()) - 1; }
  const std::vector<FieldInfo>& fields() const override { return fields_; }
  std::string describe() const override { return path_ + " (atomic structures)"; }

  Batch get_batch(std::span<const int64_t> indices) const override {
    check_indices(indices, size(), describe());
    const int64_t structures = int64_t(indices.size());
    Batch batch;
    batch.indices.assign(indices.begin(), indices.end());
    std::vector<int64_t> rows, owner, pointer = {0}, counts;
    std::vector<int64_t> sources, targets, edge_pointer = {0};
    for (int64_t b = 0; b < structures; ++b) {
      const int64_t i = indices[size_t(b)];
      const int64_t first = atoms_ptr_[size_t(i)], last = atoms_ptr_[size_t(i + 1)];
      for (int64_t a = first; a < last; ++a) {
        rows.push_back(a);
        owner.push_back(b);
      }
      if (!edges_ptr_.empty()) {
        for (int64_t e = edges_ptr_[size_t(i)]; e < edges_ptr_[size_t(i + 1)]; ++e) {
          sources.push_back(neighbors_[size_t(2 * e)] - first + pointer.back());
          targets.push_back(neighbors_[size_t(2 * e + 1)] - first + pointer.back());
        }
        edge_pointer.push_back(int64_t(sources.size()));
      }
      counts.push_back(last - first);
      pointer.push_back(pointer.back() + last - first);
    }
    const core::Tensor atom_index =
        core::Tensor::from_vector<int64_t>(rows, {int64_t(rows.size())});
    const core::Tensor structure_index =
        core::Tensor::from_vector<int64_t>(batch.indices, {structures});
    for (const auto& [name, tensor] : atom_fields_) {
      batch.set(name, core::index_select(tensor, 0, atom_index));
    }
    batch.set("batch", core::Tensor::from_vector<int64_t>(owner, {int64_t(owner.size())}));
    batch.set("atoms_ptr", core::Tensor::from_vector<int64_t>(pointer, {structures + 1}));
    batch.set("num_atoms", core::Tensor::from_vector<int64_t>(counts, {structures}));
    for (const auto& [name, tensor] : system_fields_) {
      batch.set(name, core::index_select(tensor, 0, structure_index));
    }
    if (!batch.has("cell")) batch.set("cell", core::zeros({structures, 3, 3}));
    if (!batch.has("pbc")) batch.set("pbc", core::zeros({structures, 3}, core::kBool));
    if (!edges_ptr_.empty()) {
      std::vector<int64_t> index(sources);
      index.insert(index.end(), targets.begin(), targets.end());
      const int64_t edges = int64_t(sources.size());
      batch.set("edge_index", core::Tensor::from_vector<int64_t>(index, {2, edges}));
      batch.set("edge_shifts", core::zeros({edges, 3}));
      batch.set("edges_ptr", core::Tensor::from_vector<int64_t>(edge_pointer, {structures + 1}));
    }
    return batch;
  }

 private:
  std::string path_;
  std::vector<int64_t> atoms_ptr_, edges_ptr_, neighbors_;
  std::vector<std::pair<std::string, core::Tensor>> atom_fields_, system_fields_;
  std::vector<FieldInfo> fields_;
};

}  // namespace

std::shared_ptr<Dataset> open_training_data(const TrainingDataRequest& request) {
  MPIGRAD_CHECK(request.paths.size() == 1, request.key,
                ": this build reads one HDF5 store of atomic structures; got ",
                request.paths.size(),
                " paths (several stores come with the data part of issue 35)");
  return std::make_shared<InMemoryAtomicStore>(request.paths.front(), request.key);
}

}  // namespace mpigrad::data
