// `mpigrad train --config FILE.ini`: trains the configured classifier
// (launch/config/train_config.h) on HDF5 data with TrainingStrategy, the step functions of
// launch/train/training_steps.h and the built-in hooks, on one process or under mpirun/srun.
// uint8 inputs are scaled to [0, 1], other inputs keep their values; [data] mean/std normalize
// per channel.
//
// Failure handling, in the two phases of launch/commands/subcommand.h:
// - Checking (config, data files and fields, label dtype and range, model; see
//   launch/commands/checked_run.h): every rank checks (the labels: its own share of them), then
//   the ranks agree on the outcome with one all-reduce. On any failure the lowest failing rank
//   prints its error, prefixed "[rank r/w]", and every rank returns 1 before any training starts.
// - Training: an exception on any rank is printed with its rank and ends the whole job (MPI_Abort
//   when there are other ranks), so no rank is left waiting in a collective.
// Rank 0 writes out_dir/config.ini (the resolved configuration), metrics.jsonl and checkpoints.
#pragma once

namespace mpigrad::launch {

// argv[0] is "train"; returns the process exit code.
int run_train_command(int argc, char** argv);

}  // namespace mpigrad::launch
