// The `mpigrad` program: one executable, one subcommand per job, listed once in kCommands below
// (the usage text and the dispatch are both read from it). Every subcommand has --help.
#include <cstdio>
#include <string>
#include <string_view>

#include "devices_command.h"
#include "mpigrad/core/threads.h"
#include "mpigrad/data/data_tool.h"
#include "mpigrad/launch/commands/embed_command.h"
#include "mpigrad/launch/commands/lr_find_command.h"
#include "mpigrad/launch/commands/onnx_command.h"
#include "mpigrad/launch/commands/swa_command.h"
#include "mpigrad/launch/commands/train_command.h"
#include "mpigrad/version.h"

namespace {

struct Command {
  std::string_view name;
  int (*run)(int argc, char** argv);  // argv[0] is the command's name
  std::string_view help;              // one line for the usage text
};

constexpr Command kCommands[] = {
    {"train", mpigrad::launch::run_train_command, "train a model on HDF5 data"},
    {"embed", mpigrad::launch::run_embed_command,
     "embeddings of a dataset under a two-stage model's encoder"},
    {"data", mpigrad::data::run_data_command,
     "convert (IDX, ALCHEMI Zarr), inspect or synthesize datasets"},
    {"devices", mpigrad::launch::run_devices_command,
     "list the GPUs this process can use, or say why there are none"},
    {"lr-find", mpigrad::launch::run_lr_find_command, "run the learning-rate range test"},
    {"swa", mpigrad::launch::run_swa_command, "average checkpoints' weights, recompute BatchNorm"},
    {"onnx", mpigrad::launch::run_onnx_command,
     "inspect an ONNX model, or export trained weights into one"},
};

void usage(std::FILE* out) {
  constexpr int kNameWidth = 8, kLineWidth = 80;
  std::fprintf(out, "usage: mpigrad <command> [options]\n\ncommands:\n");
  for (const Command& command : kCommands) {
    const int name = int(command.name.size()), help = int(command.help.size());
    // The pointer to the command's own help, "(mpigrad NAME --help)", goes on the next line
    // when it would not fit on this one.
    const int pointer = name + int(sizeof("(mpigrad  --help)")) - 1;
    const bool fits = 2 + kNameWidth + help + 1 + pointer <= kLineWidth;
    std::fprintf(out, "  %-*.*s%.*s%s%*s(mpigrad %.*s --help)\n", kNameWidth, name,
                 command.name.data(), help, command.help.data(), fits ? " " : "\n",
                 fits ? 0 : 2 + kNameWidth, "", name, command.name.data());
  }
  std::fprintf(out,
               "\noptions:\n"
               "  --help, -h    show this help\n"
               "  --version     print the version\n");
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything else: OpenMP's workers must not busy-wait for milliseconds after every
  // parallel region, and only a program started with the setting gets it (core/threads.h).
  mpigrad::core::apply_openmp_wait_defaults(argv);
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const std::string_view name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    usage(stdout);
    return 0;
  }
  if (name == "--version") {
    std::printf("mpigrad %s\n", MPIGRAD_VERSION);
    return 0;
  }
  for (const Command& command : kCommands) {
    if (command.name == name) return command.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "mpigrad: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
