// The checking phase that `mpigrad train`, `mpigrad lr-find` and `mpigrad swa` share: the config
// parsed, the data files opened and checked (fields, label dtype and range, per-rank share of
// the samples, a batch's memory), the model built (and, for [train] stage = classifier, its
// encoder loaded from init_from), so a bad run fails on every rank before any rank trains.
// Every rank calls check_run (the labels: each its own share of them); the subcommands agree on
// the outcome through run_subcommand (launch/commands/subcommand.h).
// It lives in commands/, not config/: what it refuses ("mpigrad train trains classifiers") is
// the policy of these subcommands, not of the keys; the C API builds from the same keys
// differently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mpigrad/core/shape.h"
#include "mpigrad/data/dataset.h"
#include "mpigrad/launch/config/run.h"
#include "mpigrad/launch/config/train_config.h"
#include "mpigrad/launch/config/train_setup.h"
#include "mpigrad/nn/module.h"

namespace mpigrad::launch {

// What the checking phase opened and built, and the working phase uses.
struct CheckedRun {
  TrainConfig config;
  // test_set is null without [data] test. HDF5 files of fields x and y (data::Hdf5Dataset), or
  // for interatomic potentials ([loss] name = energy_force) atomic stores
  // (data/training_data.h).
  std::shared_ptr<data::Dataset> train_set, test_set;
  core::Shape sample_shape;     // one sample of [data] x (none for atomic structures)
  int64_t outputs = 0;          // the model's outputs: the classes
  int64_t steps_per_epoch = 0;  // optimizer steps, equal on every rank
  int64_t total_steps = 0;      // of the whole run, [train] max_steps applied
  // What the model sees of [data] x, for training and testing; for atomic structures, the
  // neighbor list of [graph].
  InputTransform inputs;
  // On the host; [train] stage's model, its encoder loaded for stage = classifier.
  std::shared_ptr<nn::Module> model;

  // What a Run (launch/config/run.h) is built from.
  RunInputs run_inputs() const;
};

// Throws core::Error naming the key or file at fault. With --help in `args`, only `config` is
// set (config.help). On rank 0, a [train] trace path is checked to be writable.
CheckedRun check_run(const std::vector<std::string>& args, int64_t rank, int64_t ranks);

}  // namespace mpigrad::launch
