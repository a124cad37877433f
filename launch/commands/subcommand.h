// defines: check_on_every_rank, run_or_abort, run_subcommand, take_option
//
// The failure handling `mpigrad train` uses (launch/commands/train_command.h), for its sibling
// subcommands (lr-find, swa): a checking phase that every rank runs and whose outcome all ranks
// agree on with one all-reduce (the lowest failing rank prints its error, every rank returns
// 1, nothing has run), then a working phase where an exception on any rank is printed with its
// rank and ends the whole job (MPI_Abort), so no rank waits in a collective forever.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "mpigrad/launch/job/distributed_manager.h"

namespace mpigrad::launch {

// True when `check` returned on every rank; otherwise the lowest failing rank has printed
// "[rank r/w] PROGRAM: error: ..." to stderr.
bool check_on_every_rank(DistributedManager& manager, const std::string& program,
                         const std::function<void()>& check);

// Runs `work` and returns its exit code; an exception is printed with the rank and, with other
// ranks, aborts the job.
int run_or_abort(DistributedManager& manager, const std::string& program,
                 const std::function<int()>& work);

// A sibling subcommand from argv to exit code: "--help" or "-h" prints `usage` (MPI is not
// started); otherwise `check` runs on every rank through check_on_every_rank, then `work`
// through run_or_abort.
int run_subcommand(
    int argc, char** argv, const std::string& program, const char* usage,
    const std::function<void(DistributedManager&, const std::vector<std::string>&)>& check,
    const std::function<int(DistributedManager&)>& work);

// Removes "--NAME VALUE" or "--NAME=VALUE" (or the short form, when given: "-o VALUE") from
// `args` and returns VALUE; nullopt when absent. A flag without its value is a core::Error.
std::optional<std::string> take_option(std::vector<std::string>& args, const std::string& name,
                                       const std::string& short_name = "");

}  // namespace mpigrad::launch
