// `mpigrad swa --config F --checkpoints a.h5,b.h5,... [-o swa.h5]`: stochastic weight averaging
// of saved checkpoints. It builds the config's [model], checks every checkpoint against it
// (an error names the file and the tensor), loads the element-wise mean of their weights,
// recomputes the BatchNorm statistics with one pass over [data] train (launch/train/swa.h: each
// rank its shard, then averaged over the ranks), evaluates on [data] test when there is one, and
// rank 0 writes the averaged model as a checkpoint (default out_dir/swa.h5; temporary file, then
// rename). Runs on one process or under mpirun, with the failure handling of
// launch/commands/subcommand.h.
#pragma once

namespace mpigrad::launch {

// argv[0] is "swa"; returns the process exit code.
int run_swa_command(int argc, char** argv);

}  // namespace mpigrad::launch
