#include "mpigrad/launch/commands/subcommand.h"

#include <cstdio>
#include <exception>

#include "mpigrad/core/error.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/comm/rank_label.h"

namespace mpigrad::launch {

namespace {

// True when `check` returned on every rank; otherwise the lowest failing rank has printed its
// error.
bool check_on_every_rank(DistributedManager& manager, const std::string& program,
                         const std::function<void()>& check) {
  const int rank = manager.rank(), ranks = manager.world_size();
  // Failure is whether the check threw, not whether its message says something.
  bool failed = false;
  std::string error;
  try {
    check();
  } catch (const std::exception& e) {
    failed = true;
    error = e.what();
  } catch (...) {
    failed = true;
  }
  if (failed && error.empty()) error = "the check failed without a message";
  core::Tensor first_failure = core::Tensor::from_vector<int64_t>({failed ? rank : ranks}, {1});
  manager.world().all_reduce(first_failure, ReduceOp::Min);
  const int64_t failing = first_failure.item<int64_t>();
  if (failing < ranks && failing == rank) print_rank_error(rank, ranks, program, error);
  return failing == ranks;
}

// Runs `work` and returns its exit code; an exception is printed with the rank and, with other
// ranks, aborts the job.
int run_or_abort(DistributedManager& manager, const std::string& program,
                 const std::function<int()>& work) {
  try {
    return work();
  } catch (const std::exception& e) {
    print_rank_error(manager.rank(), manager.world_size(), program, e.what());
    if (manager.world_size() > 1) manager.abort_job(1);
    return 1;
  }
}

}  // namespace

int run_subcommand(
    int argc, char** argv, const std::string& program, const std::string& usage,
    const std::function<void(DistributedManager&, const std::vector<std::string>&)>& check,
    const std::function<int(DistributedManager&)>& work) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& arg : args) {
    if (arg == "--help" || arg == "-h") {
      std::printf("%s", usage.c_str());
      return 0;
    }
  }
  DistributedManager manager = DistributedManager::initialize();
  if (!check_on_every_rank(manager, program, [&] { check(manager, args); })) return 1;
  return run_or_abort(manager, program, [&] { return work(manager); });
}

std::optional<std::string> take_option(std::vector<std::string>& args, const std::string& name,
                                       const std::string& short_name) {
  std::optional<std::string> value;
  const std::string flag = "--" + name;
  for (size_t i = 0; i < args.size();) {
    const std::string& arg = args[i];
    if (arg.starts_with(flag + "=")) {
      value = arg.substr(flag.size() + 1);
      args.erase(args.begin() + long(i));
    } else if (arg == flag || (!short_name.empty() && arg == short_name)) {
      MPIGRAD_CHECK(i + 1 < args.size(), arg, ": needs a value");
      value = args[i + 1];
      args.erase(args.begin() + long(i), args.begin() + long(i) + 2);
    } else {
      ++i;
    }
  }
  return value;
}

}  // namespace mpigrad::launch
