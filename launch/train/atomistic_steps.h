// The step and evaluation functions of interatomic potentials (`[loss] name = energy_force`):
// a model (nn::AtomisticModel) gives each structure's energy; forces and stress are its
// derivatives; the loss weighs energy, force and stress errors. docs/interatomic-potentials.md
// has the formulas; in short, over the B structures of the global batch (all ranks together),
// with N_i the atoms of structure i and l(r) = r^2 (mse) or Huber_delta(r):
//   energy  (1/B) sum_i l((E^_i - E_i) / N_i)      (per_atom_energy; else l(E^_i - E_i))
//   force   (1/B) sum_i (1/(3 N_i)) sum_{atoms, xyz} l(F^ - F)         F^ = -dE^/dpositions
//   stress  (1/B_s) sum_i (1/9) sum_{3x3} l(sigma^_i - sigma_i)         over the B_s structures
//           with a cell; sigma^ = (1/volume) dE^/d(strain), tensile positive (ALCHEMI's sign)
//   loss = w_E energy + w_F force + w_S stress, the weights switching at a given step.
// Every term is a mean over the structures of the global batch: each rank sums its own
// structures' terms and divides by the global count, which one all-reduce of two numbers per
// step supplies, and multiplies by the world size, since DDP averages the ranks' gradients.
// So N ranks take exactly the step one rank takes on the same global batch, whatever the split
// (uneven last batches included), and the logged loss (the mean over ranks) is the global one.
//
// Forces (and stress) are taken with core::grad and create_graph, so the loss's backward is a
// double backward through the model. The strain trick for stress: a zero displacement eps [B, 3,
// 3] requiring grad deforms positions, cells and edge shifts by I + (eps + eps^T) / 2 per
// structure, and dE/deps at eps = 0 is the virial.
//
// The batch is the ragged layout of docs/interatomic-potentials.md: positions, atomic_numbers,
// batch, atoms_ptr or num_atoms, edge_index (and edge_shifts, cell when present), and the targets
// energy [B], forces [V, 3], stress [B, 3, 3].
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mpigrad/core/enum_names.h"
#include "mpigrad/launch/comm/communicator.h"
#include "mpigrad/launch/train/hooks/derived_metrics_hook.h"
#include "mpigrad/launch/train/training_strategy.h"
#include "mpigrad/nn/atomistic.h"

namespace mpigrad::launch {

// How a residual r is scored: mse r^2; huber 0.5 r^2 below delta, delta (|r| - delta / 2) above.
enum class ErrorKind : uint8_t { Mse, Huber };
inline constexpr core::EnumName<ErrorKind> kErrorKindNames[] = {{ErrorKind::Mse, "mse"},
                                                                {ErrorKind::Huber, "huber"}};

struct EnergyForceWeights {
  double energy = 1.0;
  double force = 1.0;
  double stress = 0.0;
};

struct EnergyForceLossOptions {
  EnergyForceWeights weights;
  // From optimizer step `switch_step` on (0: never), `weights_after`; a negative entry keeps the
  // weight it replaces.
  int64_t switch_step = 0;
  EnergyForceWeights weights_after = {-1.0, -1.0, -1.0};
  bool per_atom_energy = true;
  ErrorKind kind = ErrorKind::Mse;
  double huber_delta = 0.01;

  // The weights in force while the optimizer has taken `step` steps.
  EnergyForceWeights weights_at(int64_t step) const;
  // Whether any step weighs forces (stress): then every step takes them, so the same parameters
  // get gradients at every step.
  bool uses_forces() const;
  bool uses_stress() const;
};

// The model's graph of a ragged batch: edge_shifts and cell are zeros when the batch has none.
// core::Error naming the field when one is missing (edge_index: set [graph] cutoff).
nn::AtomicGraph atomic_graph(const data::Batch& batch);

// The atoms of each structure, float32 [B] on the batch's device: num_atoms, or atoms_ptr's
// differences.
core::Tensor atoms_per_structure(const data::Batch& batch);

struct EnergyForcePrediction {
  core::Tensor energy;  // [B]
  core::Tensor forces;  // [V, 3]; undefined unless asked for
  core::Tensor stress;  // [B, 3, 3]; undefined unless asked for (zeros for a structure without
                        // a cell)
};

// The model's energies and, as asked, forces and stress; with create_graph the derivatives are
// differentiable (to train on them). Grad mode must be on.
EnergyForcePrediction predict_energy_forces(nn::AtomisticModel& model, const data::Batch& batch,
                                            bool forces, bool stress, bool create_graph);

// What the step takes from its run.
struct EnergyForceEnvironment {
  // Where the global batch's structure counts are summed; null: one rank.
  Communicator* communicator = nullptr;
  // The optimizer steps taken so far (the weights' switch); null: always 0.
  std::function<int64_t()> optimizer_step;
};

// The loss above, for TrainingStrategy. The model must be an nn::AtomisticModel.
StepFunction energy_force_step(EnergyForceLossOptions options, EnergyForceEnvironment environment);

// Per structure, for validation (the strategy sums them over the real samples of every rank):
//   loss                    the structure's share of the loss (the weights of the current step)
//   energy_mae_per_atom     |E^ - E| / N
//   energy_squared_error_per_atom  ((E^ - E) / N)^2
// and, when the options use forces (stress):
//   force_abs_error_sum, force_squared_error_sum, force_components (3 N)
//   stress_abs_error_sum, stress_components (9, or 0 without a cell)
// which energy_force_derived_metrics() turns into exact global figures.
EvalFunction energy_force_metrics(EnergyForceLossOptions options,
                                  std::function<int64_t()> optimizer_step = nullptr);

// For DerivedMetricsHook: energy_rmse_per_atom, force_mae, force_rmse, stress_mae from the sums
// above.
std::vector<DerivedMetric> energy_force_derived_metrics(const EnergyForceLossOptions& options);

}  // namespace mpigrad::launch
