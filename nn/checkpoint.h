// Training checkpoints in HDF5, readable with h5py and loadable into the equivalent torch model:
//   /model/<dotted.name>        each parameter and persistent buffer, PyTorch name and layout
//   /optimizer/state/<i>/<name> optimizer state tensors; group hyperparameters and step counts
//                               are attributes of the enclosing groups (/optimizer/param_groups/0
//                               has attributes lr, weight_decay, ...)
//   /scheduler                  scheduler counters as attributes (nested keys as groups)
//   /hooks/<hook>/<key>         the state of each training hook that has one (an EMA's averaged
//                               weights, say), scalars as attributes as for the optimizer
//   /rng/<name>                 Int64 [2]: a generator's seed and offset (bit patterns)
//   /  attributes               format, format_version, epoch, step, world_size, config,
//                               checksum_crc32c (of the tensors; a load checks it when present),
//                               batch_in_epoch, micro_batches, epoch_batches, epoch_order_crc32c
//                               (the position of a mid-epoch checkpoint; files without them read
//                               as 0)
// The write is atomic (temporary file, then rename): a reader never sees half a checkpoint and a
// failed save leaves the previous one intact. Loading puts every tensor on the requested device,
// whatever device it was saved from; shapes and dtypes are verified with errors naming the key,
// and a truncated or corrupt file gets an error naming the file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "mpigrad/core/device.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/nn/module.h"
#include "mpigrad/nn/optim/lr_scheduler.h"
#include "mpigrad/nn/optim/optimizer.h"
#include "mpigrad/nn/state_dict.h"

namespace mpigrad::nn {

struct CheckpointData {
  StateDict model;
  StateDict optimizer;
  StateDict scheduler;
  std::map<std::string, StateDict> hooks;  // hook name -> its state_dict()
  std::vector<std::pair<std::string, core::Generator>> rng;
  int64_t epoch = 0, step = 0, world_size = 1;
  // epoch: epochs finished. A checkpoint taken mid-epoch (a preempted run) also holds how many
  // micro-batches of the next epoch were done, out of how many per rank, and the micro-batches
  // done overall; at an epoch's end batch_in_epoch is 0.
  int64_t batch_in_epoch = 0, micro_batches = 0, epoch_batches = 0;
  // A fingerprint of that epoch's order of batches on the rank that wrote it (0: none), so a
  // resume can tell that it would not continue with the same batches.
  int64_t epoch_order_crc32c = 0;
  std::string config;
};

void save_checkpoint(const std::string& path, const CheckpointData& data);
// Every tensor is placed on `device`.
CheckpointData load_checkpoint(const std::string& path, core::Device device = core::kCPU);

// The common case: a model (its generators are saved as RNG state "model.<name>"), and
// optionally an optimizer and a scheduler.
void save_checkpoint(const std::string& path, const Module& model, const Optimizer* optimizer,
                     const LRScheduler* scheduler, int64_t epoch, int64_t step,
                     int64_t world_size = 1, const std::string& config = "");

// Loads into live objects on their own devices: the model strictly, with dtype and shape
// checked per key; the optimizer and scheduler when given (and present in the file); the
// model's generators. Returns the whole file's contents for the caller's other fields.
CheckpointData load_checkpoint_into(const std::string& path, Module& model, Optimizer* optimizer,
                                    LRScheduler* scheduler);

// The second half of load_checkpoint_into, for callers that read the file first (on every rank,
// say, before any rank changes its model): checks the model's entries, then loads them, and
// the optimizer, scheduler and generators as load_checkpoint_into does. `path` names the file
// in errors. The model is left untouched when a check fails.
void apply_checkpoint(const CheckpointData& data, const std::string& path, Module& model,
                      Optimizer* optimizer, LRScheduler* scheduler);

}  // namespace mpigrad::nn
