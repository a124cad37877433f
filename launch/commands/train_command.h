// defines: run_train_command
//
// `mpigrad train --config FILE.ini`: trains the configured classifier (launch/config/train_config.h) on
// HDF5 data with TrainingStrategy, the classification step of launch/classification.h and the
// built-in hooks, on one process or under mpirun/srun. uint8 inputs are scaled to [0, 1], other
// inputs keep their values; [data] mean/std normalize per channel.
//
// Failure handling, in two phases:
// - Checking (config, data files and fields, label dtype and range, model): every rank checks
//   (the labels: its own share of them), then the ranks agree on the outcome with one
//   all-reduce. On any failure the lowest failing rank prints
//   its error, prefixed "[rank r/w]", and every rank returns 1 before any training starts.
// - Training: an exception on any rank is printed with its rank and ends the whole job (MPI_Abort
//   when there are other ranks), so no rank is left waiting in a collective.
// Rank 0 writes out_dir/config.ini (the resolved configuration), metrics.jsonl and checkpoints.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mpigrad/core/shape.h"
#include "mpigrad/data/hdf5_dataset.h"
#include "mpigrad/data/transforms.h"
#include "mpigrad/launch/config/train_config.h"

namespace mpigrad::launch {

// argv[0] is "train"; returns the process exit code.
int run_train_command(int argc, char** argv);

// The checking phase of `mpigrad train`, for the sibling subcommands that run the same config
// (lr-find, swa): the parsed config, the opened and checked data sets, one sample's shape, the
// classes, the optimizer steps per epoch and the input transform train uses. Throws core::Error
// naming the key or file, as train's checking phase does. With --help in `args`, only `config`
// is set (config.help).
struct CheckedRun {
  TrainConfig config;
  std::shared_ptr<data::Hdf5Dataset> train_set, test_set;
  core::Shape sample_shape;
  int64_t outputs = 0;
  int64_t steps_per_epoch = 0;
  data::BatchTransform input_transform;  // null: batches are used as they are
};
CheckedRun check_run(const std::vector<std::string>& args, int64_t rank, int64_t ranks);

}  // namespace mpigrad::launch
