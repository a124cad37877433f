// The `mpigrad` program: one executable, one subcommand per job.
//   mpigrad train --config run.ini      train under mpirun/srun or as one process
//   mpigrad embed --config F --checkpoint C -o emb.h5   embeddings of a two-stage model
//   mpigrad data convert-idx|inspect|synth ...
//   mpigrad devices                     the GPUs this process can use, or why there is none
//   mpigrad lr-find --config run.ini    the learning-rate range test
//   mpigrad swa --config run.ini --checkpoints a.h5,b.h5   average checkpoints' weights
// Every subcommand has --help.
#include <cstdio>
#include <cstring>
#include <string>

#include "devices_command.h"
#include "mpigrad/data/data_tool.h"
#include "mpigrad/launch/commands/embed_command.h"
#include "mpigrad/launch/commands/lr_find_command.h"
#include "mpigrad/launch/commands/swa_command.h"
#include "mpigrad/launch/commands/train_command.h"
#include "mpigrad/version.h"

namespace {

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: mpigrad <command> [options]\n\n"
               "commands:\n"
               "  train   train a classifier on HDF5 data (mpigrad train --help)\n"
               "  embed   embeddings of a dataset under a two-stage model's encoder\n"
               "          (mpigrad embed --help)\n"
               "  data    convert, inspect or synthesize HDF5 datasets (mpigrad data --help)\n"
               "  devices list the GPUs this process can use, or say why there are none\n"
               "  lr-find run the learning-rate range test (mpigrad lr-find --help)\n"
               "  swa     average checkpoints' weights, recompute BatchNorm (mpigrad swa --help)\n\n"
               "options:\n"
               "  --help, -h    show this help\n"
               "  --version     print the version\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    usage(stdout);
    return 0;
  }
  if (command == "--version") {
    std::printf("mpigrad %s\n", MPIGRAD_VERSION);
    return 0;
  }
  if (command == "train") return mpigrad::launch::run_train_command(argc - 1, argv + 1);
  if (command == "embed") return mpigrad::launch::run_embed_command(argc - 1, argv + 1);
  if (command == "data") return mpigrad::data::run_data_command(argc - 1, argv + 1);
  if (command == "devices") return mpigrad::launch::run_devices_command(argc - 1, argv + 1);
  if (command == "lr-find") return mpigrad::launch::run_lr_find_command(argc - 1, argv + 1);
  if (command == "swa") return mpigrad::launch::run_swa_command(argc - 1, argv + 1);
  std::fprintf(stderr, "mpigrad: unknown command '%s'\n\n", command.c_str());
  usage(stderr);
  return 2;
}
