// The failure handling of the `mpigrad` subcommands that run under mpirun (train, lr-find, swa,
// embed), in two phases:
// - Checking: every rank runs the check, and the ranks agree on its outcome with one
//   all-reduce. On any failure the lowest failing rank prints "[rank r/w] PROGRAM: error: ..."
//   (comm/rank_label.h) and every rank returns 1 before any rank has started work.
// - Working: an exception on any rank is printed the same way and ends the whole job
//   (MPI_Abort when there are other ranks), so no rank is left waiting in a collective.
// Also take_option, the flags these subcommands add to the config's own.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "mpigrad/launch/job/distributed_manager.h"

namespace mpigrad::launch {

// A subcommand from argv (argv[0] is its name) to exit code: "--help" or "-h" prints `usage`
// (MPI is not started); otherwise `check` runs on every rank (the checking phase), then `work`
// (the working phase). PROGRAM is how errors name it ("mpigrad train").
int run_subcommand(
    int argc, char** argv, const std::string& program, const std::string& usage,
    const std::function<void(DistributedManager&, const std::vector<std::string>&)>& check,
    const std::function<int(DistributedManager&)>& work);

// Removes "--NAME VALUE" or "--NAME=VALUE" (or the short form, when given: "-o VALUE") from
// `args` and returns VALUE; nullopt when absent. A flag without its value is a core::Error.
std::optional<std::string> take_option(std::vector<std::string>& args, const std::string& name,
                                       const std::string& short_name = "");

}  // namespace mpigrad::launch
