// A model that a running simulation trains in-situ, one step at a time, on the batches it
// produces: the C++ API for host codes, and what the C API (mpigrad/mpigrad_c.h) and the
// Fortran module wrap. The reference is NVIDIA TorchFort's online training, without LibTorch.
//
// The config is INI text, or the path of an INI file, with the keys of `mpigrad train`
// (launch/config/train_config.h) for [model] [loss] [optim] [sched] [distributed], plus [train]
// seed, clip_grad_norm, grad_accum_steps, precision, loss_scale_growth_interval and the CUDA
// graph keys; [model] input_shape and outputs and [loss] name are required, since there is no
// data file to read them from and a classifier and a regression need different labels. Text
// with a '=' or a line break is INI text; anything else is a path. The training itself is a Run
// of `mpigrad train`'s (launch/config/run.h): the same model, optimizer, schedule, hooks and
// TrainingStrategy, which this class drives one batch at a time, so a step here is bit for bit
// the step `mpigrad train` takes on the same batch.
//
// Distributed: over a DistributedManager that adopted the host's communicator (the host keeps
// MPI; see launch/mpi_interop.h), every rank of it builds the model from the same config and
// seed, DDP checks that the models agree and broadcasts rank 0's weights, and each train_step
// averages the gradients over the ranks (DistributedDataParallel) before the optimizer step. With
// the loss a mean over each rank's batch, R ranks stepping on R equal parts of a batch give the
// weights one process gets from the whole batch. Construction, train_step and the save/load calls
// are then collective: every rank calls them in the same order; predict is local.
//
// Shapes: an array is [batch, sample...], and its sample shape must be the model's, rank and
// every extent (sample_shape, fits): an input's is [model] input_shape, a regression label's or
// a prediction's is the model's output shape, a cross_entropy label is [batch] (for dense
// logits [batch, classes, d1, ...], [batch, d1, ...]). An ONNX model ([model] name = onnx,
// file) takes its shapes from the graph: input_shape from the file when not given, the outputs
// from one forward of a zero sample; its integer inputs (token ids) take int32 or int64 arrays. The
// one flattening allowed is an mlp's, which flattens every sample anyway: with a one-number
// input_shape (or outputs) it takes samples of any shape with that many values.
//
// Gradient accumulation: with [train] grad_accum_steps = k, each train_step is a micro-step
// whose gradients (of loss / k) are summed, locally (DDP's no_sync) until the k-th, which
// averages them over the ranks and steps the optimizer; steps() counts optimizer steps.
//
// CUDA graphs: with [train] cuda_graphs = true on a CUDA device, one rank, grad_accum_steps = 1
// and no dropout, the forward and backward are captured after cuda_graph_warmup steps and
// replayed while the input and label keep their addresses (launch/train/hooks/cuda_graph_hook.h);
// otherwise the model says once why not (cuda_graph_status) and trains as usual.
//
// Copies: an input or label is used where it lies when it is float32 (labels: float32, or
// int64 for cross_entropy), dense, and on the model's device; otherwise it is converted or
// moved first, and copied_bytes() counts what that cost.
//
// Interatomic potentials: with [loss] name = energy_force ([model] name = schnet, or an ONNX energy
// model; docs/interatomic-potentials.md) the model takes atomic structures, not arrays of samples:
// predict_atoms gives energies and forces, train_step_atoms takes one step of
// launch/train/atomistic_steps.h's energy_force_step on labelled structures (through the same
// TrainingStrategy as mpigrad train), and train_step/predict refuse it. The neighbor list is the
// host's or [graph]'s radius graph (launch/insitu/atoms_batch.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mpigrad/core/device.h"
#include "mpigrad/core/shape.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/config/train_config.h"
#include "mpigrad/launch/insitu/atoms_batch.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/train/training_strategy.h"
#include "mpigrad/nn/module.h"

namespace mpigrad::nn {
class OnnxModel;
}

namespace mpigrad::launch {

class Run;

// What an embedded model's failure was about, so the C API can return a code for each kind.
// Value: an array's contents (an atomic number the model does not know, an edge between two
// structures).
enum class EmbedErrorKind : uint8_t { Shape, DType, Config, File, Value };

class EmbedError : public core::Error {
 public:
  EmbedError(EmbedErrorKind kind, const std::string& message) : core::Error(message), kind_(kind) {}
  EmbedErrorKind kind() const { return kind_; }

 private:
  EmbedErrorKind kind_;
};

// What an array is to the model: a sample shape of its own each (sample_shape).
enum class ArrayRole : uint8_t { Input, Label, Output };

class EmbeddedModel {
 public:
  // Called on every rank after each optimizer step with the number of steps taken and the lr
  // that step used.
  using StepCallback = std::function<void(int64_t step, double lr)>;

  // One process, no MPI. `seed` replaces [train] seed when given. Throws EmbedError (Config)
  // naming the config key (or file) at fault.
  EmbeddedModel(const std::string& config, core::Device device,
                std::optional<uint64_t> seed = std::nullopt);
  // Data-parallel over `manager`'s world; collective. `device` nullopt: the manager's.
  EmbeddedModel(const std::string& config, DistributedManager manager,
                std::optional<core::Device> device, std::optional<uint64_t> seed = std::nullopt);
  ~EmbeddedModel();
  EmbeddedModel(const EmbeddedModel&) = delete;
  EmbeddedModel& operator=(const EmbeddedModel&) = delete;

  // One optimizer step on this rank's batch; returns the loss as a tensor on the model's
  // device, unread, so a GPU step need not wait for it (last_loss() reads it). An input or
  // label that does not fit is an EmbedError (Shape or DType) naming it.
  core::Tensor train_step(const core::Tensor& input, const core::Tensor& label);
  // This rank's loss of the last train_step (0 before the first); waits for it.
  double last_loss() const;
  // The last train_step's loss over every rank's batch (each rank's loss weighted by its
  // batch); collective: one all-reduce of two numbers, only when asked. last_loss() without
  // ranks.
  double mean_loss();
  // Replaces the callback (an empty one: none).
  void set_step_callback(StepCallback callback) { step_callback_ = std::move(callback); }
  // The model's output for `input` in evaluation mode, [batch, output_shape...] on the device.
  core::Tensor predict(const core::Tensor& input);

  // Models of several inputs or outputs ([model] name = onnx; TorchFort's train_multiarg):
  // one array per graph input, in the graph's order, and one label array per graph output.
  // The loss is the sum over the outputs of [loss] name against their labels. An array count,
  // dtype or shape that does not fit is an EmbedError naming "inputs[i]" or "labels[i]"; a
  // built-in model is an EmbedError (Config).
  core::Tensor train_step_multi(const std::vector<core::Tensor>& inputs,
                                const std::vector<core::Tensor>& labels);
  std::vector<core::Tensor> predict_multi(const std::vector<core::Tensor>& inputs);
  size_t input_count() const { return input_shapes_.size(); }

  // Interatomic potentials ([loss] name = energy_force). A model of another loss is an
  // EmbedError (Config); arrays that do not fit are EmbedErrors naming the array (atoms_batch.h),
  // with " (rank r of n)" when the model is distributed.
  bool atomistic() const { return atomistic_; }
  struct AtomsPrediction {
    core::Tensor energy;  // [B] float32
    core::Tensor forces;  // [V, 3] float32 (-dE/dpositions); undefined unless asked for
  };
  // Energies (and forces) of the structures in evaluation mode. Local.
  AtomsPrediction predict_atoms(const HostAtoms& atoms, bool forces);
  // One training step on this rank's labelled structures: energy [B], forces [V, 3] (undefined
  // when the loss weighs no forces). Collective: the ranks first agree that every rank's arrays
  // fit (one all-reduce), so a bad array on one rank fails every rank with its message instead of
  // leaving the others waiting. Returns this rank's part of the global loss (its structures'
  // errors over the global batch's structure count, times the ranks: mean_loss() averages them
  // to the loss of the global batch).
  core::Tensor train_step_atoms(const HostAtoms& atoms, const core::Tensor& energy,
                                const core::Tensor& forces);
  size_t output_count() const { return output_shapes_.size(); }

  // The weights alone, as a checkpoint torch can load (/model/<name>); written by rank 0. A file
  // that cannot be written or read is an EmbedError (File), raised on every rank.
  void save_model(const std::string& path);
  void load_model(const std::string& path);
  // Weights, optimizer, scheduler, RNG and step, for restarting; written by rank 0, atomically.
  void save_checkpoint(const std::string& path);
  void load_checkpoint(const std::string& path);

  int64_t steps() const;  // optimizer steps taken
  const TrainConfig& config() const { return config_; }
  nn::Module& module() { return *module_; }
  core::Device device() const { return device_; }
  // One sample's shape of the first input and the first output.
  const core::Shape& input_shape() const { return input_shapes_.front(); }
  const core::Shape& output_shape() const { return output_shapes_.front(); }
  // One sample's shape of an array of `role` for the model's input or output `index`: a
  // cross_entropy label's is the output's without its class dimension ([] for [classes]).
  core::Shape sample_shape(ArrayRole role, size_t index = 0) const;
  // Whether one sample of `shape` (C order) fits `role`: sample_shape(role), or, for an mlp's
  // one-number input_shape or outputs, any shape of that many values.
  bool fits(const core::Shape& shape, ArrayRole role, size_t index = 0) const;
  bool distributed() const { return manager_ != nullptr; }
  int rank() const;
  int world_size() const;
  // Bytes the inputs and labels had to be converted or moved since construction.
  int64_t copied_bytes() const { return copied_bytes_; }
  // [train] cuda_graphs: "off", "off: <why>", "warming up" or "replaying (<n> replays)".
  std::string cuda_graph_status() const;

 private:
  void build(const std::string& config, std::optional<uint64_t> seed);
  StepFunction step_function() const;
  void start_run();
  // Why [train] cuda_graphs cannot be honoured for this model, or "".
  std::string graphs_unavailable() const;
  void build_onnx(const std::string& origin);
  void build_atomistic(const std::string& origin);
  // EmbedError (Config) naming `call` unless the model is (or, `expected` false, is not) a
  // potential.
  void require_atomistic(const char* call, bool expected) const;
  AtomsBatchOptions atoms_options() const;
  // Throws on every rank if `local` (this rank's failure) or another rank's is set; the message
  // names the rank that failed. Collective when distributed.
  void agree(const std::optional<EmbedError>& local);
  nn::OnnxModel& graph(const char* call);
  core::Tensor prepare_input(const core::Tensor& input, const char* what, size_t index);
  std::vector<core::Tensor> prepare_inputs(const std::vector<core::Tensor>& inputs,
                                           const char* call);
  core::Tensor prepare_label(const core::Tensor& label, int64_t batch, const char* what,
                             size_t index);
  // One micro-step on `batch` (its arrays prepared); `arrays_in_place`: every array is where the
  // caller put it (what a CUDA graph replay needs).
  core::Tensor run_batch(data::Batch& batch, bool arrays_in_place);
  // Throws EmbedError (Shape) naming `what` unless `array`'s samples fit `role`.
  void check_samples(const core::Tensor& array, ArrayRole role, const char* what,
                     size_t index) const;
  // Runs `io` on the ranks `writer_only` allows, then fails on every rank if it failed on one.
  void collectively(const char* what, bool writer_only, const std::function<void()>& io);
  void file_io(const char* what, bool writer_only, const std::function<void()>& io);
  void save(const char* what, const std::string& path, bool training_state);
  void load(const char* what, const std::string& path, bool training_state);

  // Member order is destruction order, reversed: the run (its model, DDP and gradient
  // communicator) goes before the manager.
  std::unique_ptr<DistributedManager> manager_;
  TrainConfig config_;
  core::Device device_;
  std::vector<core::Shape> input_shapes_, output_shapes_;
  std::vector<core::DType> input_dtypes_;  // float32, or an ONNX graph's integer input
  std::shared_ptr<nn::Module> module_;
  std::unique_ptr<Run> run_;
  core::Tensor last_loss_;
  int64_t last_batch_ = 0;
  StepCallback step_callback_;
  int64_t copied_bytes_ = 0;
  std::string graphs_off_;  // why [train] cuda_graphs does not apply, when asked for
  bool atomistic_ = false;
};

}  // namespace mpigrad::launch
