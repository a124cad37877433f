#include "mpigrad/launch/insitu/atoms_batch.h"

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/launch/insitu/embedded_model.h"

namespace mpigrad::launch {

namespace {

using core::Tensor;

template <typename... Parts>
[[noreturn]] void fail(EmbedErrorKind kind, const Parts&... parts) {
  throw EmbedError(kind, core::detail::concat(parts...));
}

void require_dtype(const Tensor& array, const char* name, bool floating) {
  if (core::is_floating(array.dtype()) == floating && array.dtype() != core::kBool) return;
  fail(EmbedErrorKind::DType, name, ": dtype ", array.dtype(), "; expected ",
       floating ? "float64 or float32" : "int32 or int64");
}

// `array` has exactly `shape` (C order), or EmbedError (Shape) saying what it should hold.
void require_shape(const Tensor& array, const core::Shape& shape, const char* name,
                   const char* meaning) {
  if (array.shape() == shape) return;
  fail(EmbedErrorKind::Shape, name, ": shape ", array.shape(), "; expected ", shape, " (", meaning,
       ")");
}

std::vector<double> doubles(const Tensor& array) {
  return array.to(core::kCPU, core::kFloat64).contiguous().to_vector<double>();
}

std::vector<int64_t> integers(const Tensor& array) {
  return array.to(core::kCPU, core::kInt64).contiguous().to_vector<int64_t>();
}

void require_finite(const std::vector<double>& values, int64_t width, const char* name) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      fail(EmbedErrorKind::Value, name, "[", int64_t(i) / width, "] holds ", values[i],
           "; every value must be finite");
    }
  }
}

// atoms_ptr of the structures: 0, n0, n0 + n1, ...
std::vector<int64_t> atom_offsets(const HostAtoms& atoms, int64_t total) {
  if (!atoms.num_atoms.defined()) return {0, total};
  require_dtype(atoms.num_atoms, "num_atoms", false);
  if (atoms.num_atoms.dim() != 1) {
    fail(EmbedErrorKind::Shape, "num_atoms: shape ", atoms.num_atoms.shape(),
         "; expected [structures] (one count per structure)");
  }
  const std::vector<int64_t> counts = integers(atoms.num_atoms);
  std::vector<int64_t> offsets = {0};
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] < 1) {
      fail(EmbedErrorKind::Value, "num_atoms[", i, "] is ", counts[i],
           "; every structure holds at least one atom");
    }
    offsets.push_back(offsets.back() + counts[i]);
  }
  if (offsets.back() != total) {
    fail(EmbedErrorKind::Shape, "num_atoms: the counts sum to ", offsets.back(),
         " atoms, but positions holds ", total);
  }
  return offsets;
}

// [B, 3, 3] or, for one structure, [3, 3].
Tensor per_structure(const Tensor& array, int64_t structures, const core::Shape& one,
                     const char* name, const char* meaning) {
  core::Shape batched = one;
  batched.insert(0, structures);
  if (structures == 1 && array.shape() == one) return array.reshape(batched);
  require_shape(array, batched, name, meaning);
  return array;
}

void check_atomic_numbers(const std::vector<int64_t>& numbers, const AtomsBatchOptions& options) {
  const int64_t most = options.max_atomic_number;
  for (size_t i = 0; i < numbers.size(); ++i) {
    if (numbers[i] >= 1 && (most <= 0 || numbers[i] <= most)) continue;
    if (most > 0) {
      fail(EmbedErrorKind::Value, "atomic_numbers[", i, "] is ", numbers[i], ", but ",
           options.model_name, " knows atomic numbers 1 to ", most);
    }
    fail(EmbedErrorKind::Value, "atomic_numbers[", i, "] is ", numbers[i],
         "; atomic numbers are positive");
  }
}

// The host's neighbor list, checked (each edge within one structure) and renumbered from 0.
void add_host_edges(data::Batch& batch, const HostAtoms& atoms,
                    const std::vector<int64_t>& structure_of, core::Device device) {
  require_dtype(atoms.edge_index, "edge_index", false);
  if (atoms.edge_index.dim() != 2 || atoms.edge_index.size(0) != 2) {
    fail(EmbedErrorKind::Shape, "edge_index: shape ", atoms.edge_index.shape(),
         "; expected [2, edges], row 0 the sources and row 1 the targets: edge_index[2][edges] in "
         "C, edge_index(edges, 2) in Fortran");
  }
  const int64_t edges = atoms.edge_index.size(1);
  std::vector<int64_t> index = integers(atoms.edge_index);
  const int64_t total = int64_t(structure_of.size());
  for (int64_t k = 0; k < edges; ++k) {
    for (int64_t row = 0; row < 2; ++row) {
      int64_t& atom = index[size_t(row * edges + k)];
      if (atom < atoms.index_base || atom >= total + atoms.index_base) {
        fail(EmbedErrorKind::Value, "edge_index: edge ", k + atoms.index_base, "'s ",
             row == 0 ? "source" : "target", " is atom ", atom, ", outside ", atoms.index_base,
             " .. ", total - 1 + atoms.index_base);
      }
      atom -= atoms.index_base;
    }
    const int64_t source = index[size_t(k)], target = index[size_t(edges + k)];
    if (structure_of[size_t(source)] != structure_of[size_t(target)]) {
      fail(EmbedErrorKind::Value, "edge_index: edge ", k + atoms.index_base, " joins atom ",
           source + atoms.index_base, " of structure ", structure_of[size_t(source)], " to atom ",
           target + atoms.index_base, " of structure ", structure_of[size_t(target)],
           "; edges stay within a structure");
    }
  }
  Tensor shifts;
  if (atoms.edge_shifts.defined()) {
    require_dtype(atoms.edge_shifts, "edge_shifts", true);
    require_shape(atoms.edge_shifts, {edges, 3}, "edge_shifts",
                  "one Cartesian image offset per edge of edge_index");
    require_finite(doubles(atoms.edge_shifts), 3, "edge_shifts");
    shifts = atoms.edge_shifts.to(device, core::kFloat32).contiguous();
  } else {
    shifts = core::zeros({edges, 3}, core::TensorOptions().dtype(core::kFloat32).device(device));
  }
  batch.set("edge_index", Tensor::from_vector<int64_t>(index, {2, edges}).to(device));
  batch.set("edge_shifts", shifts);
}

}  // namespace

int64_t structure_count(const HostAtoms& atoms) {
  return atoms.num_atoms.defined() ? atoms.num_atoms.numel() : 1;
}

data::Batch atoms_batch(const HostAtoms& atoms, const AtomsBatchOptions& options) {
  const core::Device device = options.device;
  require_dtype(atoms.positions, "positions", true);
  if (atoms.positions.dim() != 2 || atoms.positions.size(1) != 3) {
    fail(EmbedErrorKind::Shape, "positions: shape ", atoms.positions.shape(),
         "; expected [atoms, 3] (x, y, z of each atom together: positions(3, atoms) in Fortran)");
  }
  const int64_t total = atoms.positions.size(0);
  require_finite(doubles(atoms.positions), 3, "positions");
  require_dtype(atoms.atomic_numbers, "atomic_numbers", false);
  require_shape(atoms.atomic_numbers, {total}, "atomic_numbers", "one per atom of positions");
  const std::vector<int64_t> numbers = integers(atoms.atomic_numbers);
  check_atomic_numbers(numbers, options);
  const std::vector<int64_t> offsets = atom_offsets(atoms, total);
  const int64_t structures = int64_t(offsets.size()) - 1;
  std::vector<int64_t> structure_of(static_cast<size_t>(total));
  std::vector<int64_t> counts;
  for (int64_t b = 0; b < structures; ++b) {
    counts.push_back(offsets[size_t(b + 1)] - offsets[size_t(b)]);
    std::fill(structure_of.begin() + offsets[size_t(b)],
              structure_of.begin() + offsets[size_t(b + 1)], b);
  }
  const core::TensorOptions on_device = core::TensorOptions().device(device);
  data::Batch batch;
  batch.indices.resize(size_t(structures));
  std::iota(batch.indices.begin(), batch.indices.end(), int64_t(0));
  batch.set("positions", atoms.positions.to(device, core::kFloat32).contiguous());
  batch.set("atomic_numbers", Tensor::from_vector<int64_t>(numbers, {total}).to(device));
  batch.set("batch", Tensor::from_vector<int64_t>(structure_of, {total}).to(device));
  batch.set("atoms_ptr", Tensor::from_vector<int64_t>(offsets, {structures + 1}).to(device));
  batch.set("num_atoms", Tensor::from_vector<int64_t>(counts, {structures}).to(device));
  if (atoms.cell.defined()) {
    require_dtype(atoms.cell, "cell", true);
    const Tensor cell = per_structure(atoms.cell, structures, {3, 3}, "cell",
                                      "the three lattice vectors of each structure, as rows");
    require_finite(doubles(cell), 9, "cell");
    batch.set("cell", cell.to(device, core::kFloat32).contiguous());
  } else {
    batch.set("cell", core::zeros({structures, 3, 3}, on_device.dtype(core::kFloat32)));
  }
  if (atoms.pbc.defined()) {
    require_dtype(atoms.pbc, "pbc", false);
    const Tensor pbc =
        per_structure(atoms.pbc, structures, {3}, "pbc", "whether each axis is periodic");
    batch.set("pbc", pbc.to(device, core::kBool).contiguous());
  } else {
    batch.set("pbc", core::zeros({structures, 3}, on_device.dtype(core::kBool)));
  }
  if (atoms.pbc.defined() && !atoms.cell.defined()) {
    for (int64_t periodic : integers(atoms.pbc)) {
      if (periodic != 0) {
        fail(EmbedErrorKind::Value, "pbc: an axis is periodic, but no cell was given");
      }
    }
  }
  if (atoms.edge_index.defined()) {
    add_host_edges(batch, atoms, structure_of, device);
  } else if (atoms.edge_shifts.defined()) {
    fail(EmbedErrorKind::Shape, "edge_shifts: given without edge_index");
  } else {
    if (options.graph.cutoff <= 0) {
      fail(EmbedErrorKind::Config,
           "edge_index: none given, and [graph] cutoff is 0; set [graph] cutoff for mpigrad to "
           "build the neighbor list, or pass the host's");
    }
    try {
      batch = data::radius_graph_transform(options.graph)(std::move(batch));
    } catch (const EmbedError&) {
      throw;
    } catch (const core::Error& error) {
      throw EmbedError(EmbedErrorKind::Value, error.what());
    }
  }
  return batch;
}

void add_atoms_labels(data::Batch& batch, const Tensor& energy, const Tensor& forces,
                      bool forces_needed, core::Device device) {
  const int64_t structures = batch.size(), total = batch["positions"].size(0);
  require_dtype(energy, "energy", true);
  if (energy.numel() != structures || energy.dim() > 2 ||
      (energy.dim() == 2 && energy.size(1) != 1)) {
    fail(EmbedErrorKind::Shape, "energy: shape ", energy.shape(), "; expected [", structures,
         "] (one energy per structure)");
  }
  require_finite(doubles(energy), 1, "energy");
  batch.set("energy", energy.to(device, core::kFloat32).contiguous().reshape({structures}));
  if (!forces.defined()) {
    if (forces_needed) {
      fail(EmbedErrorKind::Shape,
           "forces: none given, but [loss] force_weight weighs forces; pass the reference forces "
           "[atoms, 3]");
    }
    return;
  }
  require_dtype(forces, "forces", true);
  require_shape(forces, {total, 3}, "forces", "one force per atom of positions");
  require_finite(doubles(forces), 3, "forces");
  batch.set("forces", forces.to(device, core::kFloat32).contiguous());
}

}  // namespace mpigrad::launch
