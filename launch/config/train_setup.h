// What the [model] [graph] [loss] [optim] [sched] sections of a TrainConfig build. `mpigrad train`
// and the C API (launch/insitu/) both build through these, so a key means the same in both.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "mpigrad/core/shape.h"
#include "mpigrad/data/batch.h"
#include "mpigrad/data/data_loader.h"
#include "mpigrad/data/training_data.h"
#include "mpigrad/launch/config/train_config.h"
#include "mpigrad/launch/train/atomistic_steps.h"
#include "mpigrad/launch/train/training_steps.h"
#include "mpigrad/nn/atomistic.h"
#include "mpigrad/nn/encoder_with_head.h"
#include "mpigrad/nn/models.h"
#include "mpigrad/nn/module.h"
#include "mpigrad/nn/optim/lr_scheduler.h"
#include "mpigrad/nn/optim/optimizer.h"

namespace mpigrad::launch {

// What the model sees of [data] x: uint8 inputs are images, scaled to [0, 1]; every other dtype
// keeps its values (converted to float32, the model's dtype); then the optional per-channel
// [data] mean/std normalization. The same for training, testing and `mpigrad embed`.
// A model whose input is integer (an ONNX graph that declares int64 token ids) gets the stored
// integers in that dtype instead, unscaled; normalizing them is an error naming [data] mean.
struct InputTransform {
  data::BatchTransform transform;  // null: the batch is used as it is
  std::string description;         // for the log
};
InputTransform input_transform(const TrainConfig& config, const data::FieldInfo& inputs,
                               core::DType model_dtype = core::kFloat32);

// The dtype `model` takes its input in: the graph's declared one for an ONNX model, else float32.
core::DType model_input_dtype(const nn::Module& model);

// The [model] for samples of `input_shape` with `outputs` outputs (classes or values for mlp and
// cnn, channels for conv), initialized from `seed`: every rank that passes the same arguments
// builds the same weights. Errors name the [model] key at fault.
std::shared_ptr<nn::Module> make_model(const ModelSection& model, const core::Shape& input_shape,
                                       int64_t outputs, uint64_t seed);

// The DDP settings of [distributed]; `loss_scaling` (fp16's loss scaler will skip overflowed
// steps) makes ZeRO-1 carry the found-inf flag to every rank's shard.
DdpOptions ddp_options(const DistributedSection& distributed, bool loss_scaling);

// Throws core::Error "<what>: needs N bytes (X GiB), more than half of this machine's Y GiB of
// memory" when `bytes` would not fit; checked before allocating what a config or a file sized
// (a model, a batch), so a run that cannot fit fails up front with the key or file at fault
// rather than in an allocation. `memory_bytes` < 0: this machine's physical memory.
void check_fits_in_memory(int64_t bytes, const std::string& what, int64_t memory_bytes = -1);

// The encoder of [model]: the model without its output layer (mlp, cnn; another model plugs in
// with one case here). Errors name the [model] key at fault.
nn::Encoder make_encoder(const ModelSection& model, const core::Shape& input_shape,
                         core::Generator& generator);

// The model [train] stage trains, initialized from `seed`:
//   supervised  make_model(model, input_shape, classes, seed), today's Sequential
//   supcon      EncoderWithHead(encoder, mlp head to [model] projection, L2-normalized output)
//   classifier  EncoderWithHead(encoder, [model] head to `classes`, frozen with freeze_encoder);
//               the caller loads the encoder (load_encoder)
std::shared_ptr<nn::Module> make_stage_model(const ModelSection& model, const TrainSection& train,
                                             const core::Shape& input_shape, int64_t classes);

// Loads the "encoder.<name>" tensors of checkpoint `path` into `model`'s encoder; every tensor of
// the encoder must be there with its shape. core::Error naming `where` (the key), the file and
// the tensor otherwise. The head is left as initialized.
void load_encoder(nn::EncoderWithHead& model, const std::string& path, const std::string& where);

// The [optim] over `model`'s parameters that require grad (a frozen encoder's are left out).
std::unique_ptr<nn::Optimizer> make_optimizer(const OptimSection& optim, nn::Module& model);

// Throws core::Error, naming the key, unless [sched] fits a run of `run_steps` optimizer steps
// (0: unknown). make_scheduler checks the same; callers that must fail before they build an
// optimizer (mpigrad train's checking phase) call it first.
void check_schedule(const SchedSection& sched, int64_t run_steps);

// The [sched] for `optimizer`, or null for none. `run_steps` is the number of optimizer steps
// when the caller knows it (cosine's length unless [sched] total_steps is set), else 0.
std::unique_ptr<nn::LRScheduler> make_scheduler(const SchedSection& sched, nn::Optimizer& optimizer,
                                                int64_t run_steps);

// The DataLoader's reader threads for [data] read_ahead: on 1, off 0; auto 1 unless the device
// is the CPU and the node's ranks' compute threads (`threads` each, `ranks` ranks) fill the
// `cpus` CPUs this rank may run on. There a reader takes a core from a parallel region, which
// then waits for its slowest thread, and reading in the step's own thread is faster.
int loader_workers(ReadAhead read_ahead, bool cpu_device, int64_t threads, int64_t ranks,
                   int64_t cpus);

// Interatomic potentials (docs/interatomic-potentials.md) ------------------------------------

// Whether the config trains an interatomic potential: [loss] name = energy_force.
bool is_atomistic(const TrainConfig& config);

// The order of an atomistic run's training batches on rank `rank` of `ranks`: [train]
// batch_size, shuffle and seed, and [data] max_atoms, samples_per_dataset, epoch_policy and
// replacement (data/training_data.h's make_batch_sampler takes them).
data::BatchingOptions batching_options(const TrainConfig& config, int64_t rank, int64_t ranks);

// The potential of [model]: schnet (hidden: one width, n_rbf, interactions, the cutoff of
// [graph]) initialized from [train] seed, or an onnx graph whose inputs are named as a
// potential's (nn::OnnxEnergyModel). Errors name the key at fault.
std::shared_ptr<nn::AtomisticModel> make_atomistic_model(const TrainConfig& config);

// [loss]'s energy_force settings.
EnergyForceLossOptions energy_force_options(const LossSection& loss);

// The neighbor list [graph] asks for, as the loaders' transform (data/neighbor_list.h); a null
// transform with cutoff 0 (the store's list is used).
InputTransform graph_transform(const GraphSection& graph);

// mse or l1; core::Error for a loss that is not a regression loss.
RegressionLoss make_regression_loss(LossKind loss);

// The supervised step of [loss] name on fields `input` and `label`: classification_step for
// cross_entropy, regression_step for mse and l1 (launch/train/training_steps.h).
StepFunction make_supervised_step(LossKind loss, const std::string& input,
                                  const std::string& label);

}  // namespace mpigrad::launch
