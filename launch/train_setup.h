// defines: make_model, make_optimizer, make_scheduler, make_regression_loss, check_fits_in_memory
//
// What the [model] [loss] [optim] [sched] sections of a TrainConfig build. `mpigrad train` and
// the C API (launch/embed/) both build through these, so a key means the same in both.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "mpigrad/core/shape.h"
#include "mpigrad/launch/train_config.h"
#include "mpigrad/launch/training_steps.h"
#include "mpigrad/nn/module.h"
#include "mpigrad/nn/optim/lr_scheduler.h"
#include "mpigrad/nn/optim/optimizer.h"

namespace mpigrad::launch {

// The [model] for samples of `input_shape` with `outputs` outputs (classes or values for mlp and
// cnn, channels for conv), initialized from `seed`: every rank that passes the same arguments
// builds the same weights. Errors name the [model] key at fault.
std::shared_ptr<nn::Module> make_model(const ModelSection& model, const core::Shape& input_shape,
                                       int64_t outputs, uint64_t seed);

// Throws core::Error "<what>: needs N bytes (X GiB), more than half of this machine's Y GiB of
// memory" when `bytes` would not fit; checked before allocating what a config or a file sized
// (a model, a batch), so a run that cannot fit fails up front with the key or file at fault
// rather than in an allocation. `memory_bytes` < 0: this machine's physical memory.
void check_fits_in_memory(int64_t bytes, const std::string& what, int64_t memory_bytes = -1);

// The [optim] over `model`'s parameters.
std::unique_ptr<nn::Optimizer> make_optimizer(const OptimSection& optim, nn::Module& model);

// Throws core::Error, naming the key, unless [sched] fits a run of `run_steps` optimizer steps
// (0: unknown). make_scheduler checks the same; callers that must fail before they build an
// optimizer (mpigrad train's checking phase) call it first.
void check_schedule(const SchedSection& sched, int64_t run_steps);

// The [sched] for `optimizer`, or null for none. `run_steps` is the number of optimizer steps
// when the caller knows it (cosine's length unless [sched] total_steps is set), else 0.
std::unique_ptr<nn::LRScheduler> make_scheduler(const SchedSection& sched,
                                                nn::Optimizer& optimizer, int64_t run_steps);

// mse or l1; core::Error for a loss that is not a regression loss.
RegressionLoss make_regression_loss(LossKind loss);

}  // namespace mpigrad::launch
