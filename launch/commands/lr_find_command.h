// `mpigrad lr-find --config F [--start 1e-7] [--end 10] [--steps 100] [--output lr_find.csv]`:
// the learning-rate range test of launch/train/lr_finder.h on the config's [model], [data] train
// and [optim] (its lr is replaced by the sweep; [sched] is not used), with the training program's
// DDP, gradient accumulation and clipping. Rank 0 writes the curve as CSV (step, lr, loss,
// smoothed_loss; temporary file, then rename) and prints the suggested lr and the rule that
// chose it. Nothing under out_dir is written and no checkpoint is read or changed. Under mpirun
// every rank runs the same lr and records the loss averaged over the ranks.
#pragma once

namespace mpigrad::launch {

// argv[0] is "lr-find"; returns the process exit code.
int run_lr_find_command(int argc, char** argv);

}  // namespace mpigrad::launch
