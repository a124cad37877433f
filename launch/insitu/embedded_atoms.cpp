// EmbeddedModel's calls for interatomic potentials (embedded_model.h): energies and forces of a
// host's structures, and training steps on labelled ones, over launch/train/atomistic_steps.h
// (predict_energy_forces, and the Run's energy_force_step) on the batch atoms_batch.h builds.
#include <algorithm>
#include <optional>
#include <string>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/enum_names.h"
#include "mpigrad/core/error.h"
#include "mpigrad/launch/config/run.h"
#include "mpigrad/launch/config/train_setup.h"
#include "mpigrad/launch/insitu/embedded_model.h"
#include "mpigrad/launch/train/atomistic_steps.h"
#include "mpigrad/nn/atomistic.h"
#include "mpigrad/nn/schnet.h"

namespace mpigrad::launch {

namespace {

// Grad mode on (forces are a gradient) and the model in evaluation mode, both restored after.
class EvaluationWithGrad {
 public:
  explicit EvaluationWithGrad(nn::Module& model)
      : model_(model), grad_(core::grad_enabled()), training_(model.is_training()) {
    core::set_grad_enabled(true);
    model_.eval();
  }
  ~EvaluationWithGrad() {
    model_.train(training_);
    core::set_grad_enabled(grad_);
  }
  EvaluationWithGrad(const EvaluationWithGrad&) = delete;
  EvaluationWithGrad& operator=(const EvaluationWithGrad&) = delete;

 private:
  nn::Module& model_;
  bool grad_, training_;
};

}  // namespace

void EmbeddedModel::require_atomistic(const char* call, bool expected) const {
  if (atomistic_ == expected) return;
  if (expected) {
    throw EmbedError(
        EmbedErrorKind::Config,
        core::detail::concat(
            call,
            ": atomic structures need an interatomic potential ([loss] name = energy_force, "
            "[model] name = schnet or an ONNX energy model); this model is ",
            core::enum_name(config_.model.name, kModelKindNames),
            " with [loss] name = ", core::enum_name(config_.loss.name, kLossKindNames)));
  }
  throw EmbedError(EmbedErrorKind::Config,
                   core::detail::concat(call,
                                        ": this model is an interatomic potential ([loss] name = "
                                        "energy_force): pass atomic structures (the atoms calls)"));
}

AtomsBatchOptions EmbeddedModel::atoms_options() const {
  AtomsBatchOptions options;
  options.graph = {.cutoff = config_.graph.cutoff,
                   .max_neighbors = config_.graph.max_neighbors,
                   .self_loops = config_.graph.self_loops};
  if (const auto* schnet = dynamic_cast<const nn::SchNet*>(module_.get())) {
    options.max_atomic_number = schnet->options().max_atomic_number;
    options.model_name = "schnet (its embedding)";
  }
  options.device = device_;
  return options;
}

void EmbeddedModel::agree(const std::optional<EmbedError>& local) {
  if (manager_ == nullptr) {
    if (local) throw *local;
    return;
  }
  Communicator& world = manager_->world();
  const int size = world.size();
  core::Tensor first = core::Tensor::from_vector<int64_t>({local ? rank() : size}, {1});
  world.all_reduce(first, ReduceOp::Min);
  const int failing = int(first.item<int64_t>());
  if (failing == size) return;
  // The lowest failing rank's kind and message, on every rank.
  const std::string message = local ? local->what() : "";
  core::Tensor header = core::Tensor::from_vector<int64_t>(
      {local ? int64_t(local->kind()) : 0, int64_t(message.size())}, {2});
  world.broadcast(header, failing);
  const std::vector<int64_t> sizes = header.to_vector<int64_t>();
  core::Tensor bytes = core::zeros({std::max<int64_t>(sizes[1], 1)}, core::kUInt8);
  if (rank() == failing) std::copy(message.begin(), message.end(), bytes.data<uint8_t>());
  world.broadcast(bytes, failing);
  const std::vector<uint8_t> text = bytes.to_vector<uint8_t>();
  throw EmbedError(EmbedErrorKind(sizes[0]),
                   core::detail::concat(std::string(text.begin(), text.begin() + sizes[1]),
                                        " (rank ", failing, " of ", size, ")"));
}

EmbeddedModel::AtomsPrediction EmbeddedModel::predict_atoms(const HostAtoms& atoms, bool forces) {
  require_atomistic("predict_atoms", true);
  data::Batch batch;
  try {
    batch = atoms_batch(atoms, atoms_options());
  } catch (const EmbedError& error) {
    if (manager_ == nullptr) throw;
    throw EmbedError(error.kind(), core::detail::concat(error.what(), " (rank ", rank(), " of ",
                                                        world_size(), ")"));
  }
  EvaluationWithGrad mode(*module_);
  const EnergyForcePrediction predicted = predict_energy_forces(
      dynamic_cast<nn::AtomisticModel&>(*module_), batch, forces, /*stress=*/false,
      /*create_graph=*/false);
  return {predicted.energy.detach(), forces ? predicted.forces.detach() : core::Tensor()};
}

core::Tensor EmbeddedModel::train_step_atoms(const HostAtoms& atoms, const core::Tensor& energy,
                                             const core::Tensor& forces) {
  require_atomistic("train_step_atoms", true);
  data::Batch batch;
  std::optional<EmbedError> local;
  try {
    batch = atoms_batch(atoms, atoms_options());
    add_atoms_labels(batch, energy, forces, energy_force_options(config_.loss).uses_forces(),
                     device_);
  } catch (const EmbedError& error) {
    local = error;
  } catch (const core::Error& error) {
    local = EmbedError(EmbedErrorKind::Value, error.what());
  }
  agree(local);
  return run_batch(batch, /*arrays_in_place=*/false);
}

}  // namespace mpigrad::launch
