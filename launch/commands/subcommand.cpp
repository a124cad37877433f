#include "mpigrad/launch/commands/subcommand.h"

#include <cstdio>
#include <exception>

#include "mpigrad/core/error.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/mpi_interop.h"

namespace mpigrad::launch {

bool check_on_every_rank(DistributedManager& manager, const std::string& program,
                         const std::function<void()>& check) {
  const int64_t rank = manager.rank(), ranks = manager.world_size();
  std::string error;
  try {
    check();
  } catch (const std::exception& e) {
    error = e.what();
  }
  core::Tensor first_failure =
      core::Tensor::from_vector<int64_t>({error.empty() ? ranks : rank}, {1});
  manager.world().all_reduce(first_failure, ReduceOp::Min);
  const int64_t failing = first_failure.item<int64_t>();
  if (failing < ranks && failing == rank) {
    std::fprintf(stderr, "[rank %lld/%lld] %s: error: %s\n", static_cast<long long>(rank),
                 static_cast<long long>(ranks), program.c_str(), error.c_str());
    std::fflush(stderr);
  }
  return failing == ranks;
}

int run_or_abort(DistributedManager& manager, const std::string& program,
                 const std::function<int()>& work) {
  try {
    return work();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d/%d] %s: error: %s\n", manager.rank(), manager.world_size(),
                 program.c_str(), e.what());
    std::fflush(stderr);
    if (manager.world_size() > 1) MPI_Abort(native_communicator(manager.world()), 1);
    return 1;
  }
}

int run_subcommand(
    int argc, char** argv, const std::string& program, const char* usage,
    const std::function<void(DistributedManager&, const std::vector<std::string>&)>& check,
    const std::function<int(DistributedManager&)>& work) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& arg : args) {
    if (arg == "--help" || arg == "-h") {
      std::printf("%s", usage);
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
