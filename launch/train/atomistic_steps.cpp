#include "mpigrad/launch/train/atomistic_steps.h"

#include <cmath>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/ops/reduce.h"

namespace mpigrad::launch {

using core::Tensor;

EnergyForceWeights EnergyForceLossOptions::weights_at(int64_t step) const {
  if (switch_step <= 0 || step < switch_step) return weights;
  return {weights_after.energy >= 0 ? weights_after.energy : weights.energy,
          weights_after.force >= 0 ? weights_after.force : weights.force,
          weights_after.stress >= 0 ? weights_after.stress : weights.stress};
}

bool EnergyForceLossOptions::uses_forces() const {
  return weights.force > 0 || (switch_step > 0 && weights_after.force > 0);
}

bool EnergyForceLossOptions::uses_stress() const {
  return weights.stress > 0 || (switch_step > 0 && weights_after.stress > 0);
}

namespace {

// Grad mode on inside evaluation (which runs under no-grad): forces are a gradient.
class EnableGrad {
 public:
  EnableGrad() : previous_(core::grad_enabled()) { core::set_grad_enabled(true); }
  ~EnableGrad() { core::set_grad_enabled(previous_); }
  EnableGrad(const EnableGrad&) = delete;
  EnableGrad& operator=(const EnableGrad&) = delete;

 private:
  bool previous_;
};

const Tensor& field(const data::Batch& batch, const std::string& name, const char* why) {
  MPIGRAD_CHECK(batch.has(name), "energy_force: the batch has no field '", name, "' (", why, ")");
  return batch[name];
}

nn::AtomisticModel& potential(nn::Module& model) {
  auto* atomistic = dynamic_cast<nn::AtomisticModel*>(&model);
  MPIGRAD_CHECK(atomistic != nullptr,
                "[loss] name = energy_force trains interatomic potentials, "
                "but the model is a ",
                model.type_name(),
                "; use [model] name = schnet, or an ONNX graph whose inputs are named positions, "
                "atomic_numbers, edge_index, edge_shifts, batch, cell");
  return *atomistic;
}

// The target `name` with `shape`, in the predictions' dtype (`like`'s).
Tensor target(const data::Batch& batch, const std::string& name, const core::Shape& shape,
              const char* why, const Tensor& like) {
  const Tensor& stored = field(batch, name, why);
  MPIGRAD_CHECK(stored.numel() == shape.numel(), "energy_force: field '", name, "' has shape ",
                stored.shape(), "; expected ", shape);
  Tensor values = stored.reshape(shape);
  return values.dtype() == like.dtype() ? values : values.to(like.dtype());
}

Tensor score(const Tensor& residual, const EnergyForceLossOptions& options) {
  if (options.kind == ErrorKind::Mse) return residual * residual;
  const double delta = options.huber_delta;
  const Tensor magnitude = core::abs(residual);
  return core::where(core::lt(magnitude, core::scalar_like(delta, magnitude)),
                     residual * residual * 0.5, (magnitude - 0.5 * delta) * delta);
}

// Per-atom values [V] summed into their structures: [B].
Tensor per_structure(const Tensor& per_atom, const data::Batch& batch) {
  const Tensor& index = batch["batch"];
  const Tensor zeros = core::zeros(
      {batch.size()}, core::TensorOptions().dtype(per_atom.dtype()).device(per_atom.device()));
  return core::index_add(zeros, 0, index.dtype() == core::kInt64 ? index : index.to(core::kInt64),
                         per_atom);
}

// |det(cell_i)| for every structure, on the host (the cells are data, not differentiated), and
// whether it is a cell at all.
std::vector<double> volumes(const Tensor& cell) {
  const std::vector<double> values = cell.to(core::kCPU).contiguous().to_vector<double>();
  std::vector<double> out(values.size() / 9);
  for (size_t b = 0; b < out.size(); ++b) {
    const double* m = &values[9 * b];
    const double det = m[0] * (m[4] * m[8] - m[5] * m[7]) - m[1] * (m[3] * m[8] - m[5] * m[6]) +
                       m[2] * (m[3] * m[7] - m[4] * m[6]);
    out[b] = std::abs(det);
  }
  return out;
}

// Row vectors [n, 3] times per-row matrices [n, 3, 3]: out[n, j] = sum_k x[n, k] m[n, k, j].
Tensor times(const Tensor& rows, const Tensor& matrices) {
  return core::sum(rows.unsqueeze(2) * matrices, {1});
}

// The per-structure terms of the loss (before weights): each [B].
struct StructureErrors {
  Tensor energy, force, stress;  // force and stress undefined when not taken
  Tensor has_cell;               // [B] 1 or 0, with stress
  double cells = 0;              // how many structures have one
};

StructureErrors structure_errors(const EnergyForcePrediction& predicted, const data::Batch& batch,
                                 const EnergyForceLossOptions& options) {
  const int64_t structures = batch.size();
  const Tensor atoms = atoms_per_structure(batch).to(predicted.energy.dtype());
  StructureErrors errors;
  Tensor residual = predicted.energy -
                    target(batch, "energy", {structures}, "the energy targets", predicted.energy);
  if (options.per_atom_energy) residual = residual / atoms;
  errors.energy = score(residual, options);
  if (predicted.forces.defined()) {
    const Tensor reference = target(batch, "forces", predicted.forces.shape(),
                                    "[loss] force_weight is set", predicted.forces);
    const Tensor scored = core::sum(score(predicted.forces - reference, options), {1});
    errors.force = per_structure(scored, batch) / (atoms * 3.0);
  }
  if (predicted.stress.defined()) {
    const Tensor reference = target(batch, "stress", {structures, 3, 3},
                                    "[loss] stress_weight is set", predicted.stress);
    const std::vector<double> volume = volumes(field(batch, "cell", "stress needs a cell"));
    std::vector<float> has_cell;
    for (double v : volume) has_cell.push_back(v > 0 ? 1.0f : 0.0f);
    for (float c : has_cell) errors.cells += double(c);
    errors.has_cell = Tensor::from_vector<float>(has_cell, {structures})
                          .to(predicted.energy.device(), predicted.energy.dtype());
    errors.stress = core::sum(score(predicted.stress - reference, options), {1, 2}) * (1.0 / 9.0) *
                    errors.has_cell;
  }
  return errors;
}

}  // namespace

nn::AtomicGraph atomic_graph(const data::Batch& batch) {
  nn::AtomicGraph graph;
  graph.num_structures = batch.size();
  graph.positions = field(batch, "positions", "the atoms' positions");
  const Tensor& numbers = field(batch, "atomic_numbers", "each atom's element");
  graph.atomic_numbers = numbers.dtype() == core::kInt64 ? numbers : numbers.to(core::kInt64);
  graph.edge_index =
      field(batch, "edge_index", "the neighbor list: set [graph] cutoff, or store a neighbor_list");
  const Tensor& index = field(batch, "batch", "each atom's structure");
  graph.batch = index.dtype() == core::kInt64 ? index : index.to(core::kInt64);
  const core::Device device = graph.positions.device();
  const int64_t edges = graph.edge_index.dim() == 2 ? graph.edge_index.size(1) : 0;
  graph.edge_shifts =
      batch.has("edge_shifts")
          ? batch["edge_shifts"]
          : core::zeros({edges, 3}, core::TensorOptions().dtype(core::kFloat32).device(device));
  graph.cell = batch.has("cell")
                   ? batch["cell"]
                   : core::zeros({graph.num_structures, 3, 3},
                                 core::TensorOptions().dtype(core::kFloat32).device(device));
  return graph;
}

Tensor atoms_per_structure(const data::Batch& batch) {
  const int64_t structures = batch.size();
  Tensor counts;
  if (batch.has("num_atoms")) {
    counts = batch["num_atoms"].reshape({structures});
  } else {
    const Tensor& ptr = field(batch, "atoms_ptr", "the atoms of each structure");
    MPIGRAD_CHECK(ptr.numel() == structures + 1, "energy_force: field 'atoms_ptr' has ",
                  ptr.numel(), " entries for ", structures, " structures; expected ",
                  structures + 1);
    counts = ptr.reshape({structures + 1}).slice(0, 1, structures + 1) -
             ptr.reshape({structures + 1}).slice(0, 0, structures);
  }
  return counts.to(core::kFloat32);
}

EnergyForcePrediction predict_energy_forces(nn::AtomisticModel& model, const data::Batch& batch,
                                            bool forces, bool stress, bool create_graph) {
  nn::AtomicGraph graph = atomic_graph(batch);
  const Tensor cell = graph.cell;  // the volumes are the unstrained cells'
  EnergyForcePrediction out;
  if (!forces && !stress) {
    out.energy = model.energy(graph);
    return out;
  }
  MPIGRAD_CHECK(core::grad_enabled(),
                "predict_energy_forces: forces are a gradient; grad mode "
                "must be on");
  const Tensor positions = graph.positions.detach().set_requires_grad(true);
  graph.positions = positions;
  std::vector<Tensor> inputs = {positions};
  if (stress) {
    // The strain: every length of structure i scaled by I + sym(eps_i), at eps = 0.
    const int64_t structures = graph.num_structures;
    const core::TensorOptions options =
        core::TensorOptions().dtype(positions.dtype()).device(positions.device());
    Tensor displacement = core::zeros({structures, 3, 3}, options);
    displacement.set_requires_grad(true);
    const Tensor identity = Tensor::from_vector<double>({1, 0, 0, 0, 1, 0, 0, 0, 1}, {1, 3, 3})
                                .to(positions.device(), positions.dtype());
    const Tensor deformation =
        identity + (displacement + displacement.transpose(1, 2)) * 0.5;  // [B, 3, 3]
    graph.positions = times(positions, core::index_select(deformation, 0, graph.batch));
    graph.cell = core::sum(graph.cell.unsqueeze(3) * deformation.unsqueeze(1), {2});
    const Tensor edge_structure = core::index_select(graph.batch, 0, graph.edge_index.select(0, 1));
    graph.edge_shifts =
        times(graph.edge_shifts, core::index_select(deformation, 0, edge_structure));
    inputs.push_back(displacement);
  }
  out.energy = model.energy(graph);
  std::vector<Tensor> gradients =
      core::grad({core::sum(out.energy)}, inputs, {},
                 {.retain_graph = create_graph, .create_graph = create_graph});
  out.forces = -gradients[0];
  if (stress) {
    std::vector<double> inverse;
    for (double v : volumes(cell)) inverse.push_back(v > 0 ? 1.0 / v : 0.0);
    const Tensor scale = Tensor::from_vector<double>(inverse, {graph.num_structures, 1, 1})
                             .to(positions.device(), positions.dtype());
    out.stress = gradients[1] * scale;
  }
  if (!create_graph) {
    out.energy = out.energy.detach();
    out.forces = out.forces.detach();
    if (out.stress.defined()) out.stress = out.stress.detach();
  }
  return out;
}

StepFunction energy_force_step(EnergyForceLossOptions options, EnergyForceEnvironment environment) {
  MPIGRAD_CHECK(options.kind != ErrorKind::Huber || options.huber_delta > 0,
                "[loss] huber_delta must be positive, got ", options.huber_delta);
  return [options, environment](nn::Module& model, const data::Batch& batch) {
    const int64_t step = environment.optimizer_step ? environment.optimizer_step() : 0;
    const EnergyForceWeights weights = options.weights_at(step);
    const EnergyForcePrediction predicted =
        predict_energy_forces(potential(model), batch, options.uses_forces(), options.uses_stress(),
                              /*create_graph=*/true);
    const StructureErrors errors = structure_errors(predicted, batch, options);
    // The global batch's structures (and those with a cell): one all-reduce.
    Tensor counts = Tensor::from_vector<double>({double(batch.size()), errors.cells}, {2});
    double ranks = 1;
    if (environment.communicator != nullptr && environment.communicator->size() > 1) {
      environment.communicator->all_reduce(counts, ReduceOp::Sum);
      ranks = double(environment.communicator->size());
    }
    const std::vector<double> global = counts.to_vector<double>();
    const double structures = global[0], cells = global[1];
    Tensor loss = core::sum(errors.energy) * (weights.energy * ranks / structures);
    if (errors.force.defined()) {
      loss = loss + core::sum(errors.force) * (weights.force * ranks / structures);
    }
    if (errors.stress.defined()) {
      loss = loss + core::sum(errors.stress) * (weights.stress * ranks / std::max(cells, 1.0));
    }
    return loss;
  };
}

EvalFunction energy_force_metrics(EnergyForceLossOptions options,
                                  std::function<int64_t()> optimizer_step) {
  return [options, optimizer_step](nn::Module& model, const data::Batch& batch) {
    EnableGrad grad_mode;
    const EnergyForceWeights weights = options.weights_at(optimizer_step ? optimizer_step() : 0);
    const EnergyForcePrediction predicted =
        predict_energy_forces(potential(model), batch, options.uses_forces(), options.uses_stress(),
                              /*create_graph=*/false);
    core::NoGradGuard no_grad;
    const StructureErrors errors = structure_errors(predicted, batch, options);
    const Tensor atoms = atoms_per_structure(batch).to(predicted.energy.dtype());
    std::map<std::string, Tensor> metrics;
    Tensor loss = errors.energy * weights.energy;
    const Tensor energy_error =
        (predicted.energy -
         target(batch, "energy", {batch.size()}, "the energy targets", predicted.energy)) /
        atoms;
    metrics["energy_mae_per_atom"] = core::abs(energy_error);
    metrics["energy_squared_error_per_atom"] = energy_error * energy_error;
    if (errors.force.defined()) {
      loss = loss + errors.force * weights.force;
      const Tensor error = predicted.forces - target(batch, "forces", predicted.forces.shape(),
                                                     "force metrics", predicted.forces);
      metrics["force_abs_error_sum"] = per_structure(core::sum(core::abs(error), {1}), batch);
      metrics["force_squared_error_sum"] = per_structure(core::sum(error * error, {1}), batch);
      metrics["force_components"] = atoms * 3.0;
    }
    if (errors.stress.defined()) {
      loss = loss + errors.stress * weights.stress;
      const Tensor error = predicted.stress - target(batch, "stress", {batch.size(), 3, 3},
                                                     "stress metrics", predicted.stress);
      metrics["stress_abs_error_sum"] = core::sum(core::abs(error), {1, 2}) * errors.has_cell;
      metrics["stress_components"] = errors.has_cell * 9.0;
    }
    metrics["loss"] = loss;
    return metrics;
  };
}

std::vector<DerivedMetric> energy_force_derived_metrics(const EnergyForceLossOptions& options) {
  std::vector<DerivedMetric> derived = {
      {"energy_rmse_per_atom", "energy_squared_error_per_atom", "", true}};
  if (options.uses_forces()) {
    derived.push_back({"force_mae", "force_abs_error_sum", "force_components", false});
    derived.push_back({"force_rmse", "force_squared_error_sum", "force_components", true});
  }
  if (options.uses_stress()) {
    derived.push_back({"stress_mae", "stress_abs_error_sum", "stress_components", false});
  }
  return derived;
}

}  // namespace mpigrad::launch
