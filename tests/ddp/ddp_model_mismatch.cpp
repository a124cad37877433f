// Whole DDP jobs whose ending check_exit.sh checks (exit status, and a message from every rank).
// Each rank prints its error with RankLogger, the way a training program reports a fatal error,
// and returns 1.
//   ddp_model_mismatch differ      rank 1's hidden layer is 12 wide instead of 16: must fail
//   ddp_model_mismatch same        every rank builds the same model: must succeed
//   ddp_model_mismatch stall       rank 1 reaches backward 2.5 s late with a 1 s DDP timeout: the
//                                  shared-memory averaging must fail on every rank, naming the
//                                  late rank on the others, instead of hanging
//   ddp_model_mismatch stall-mid-backward SECONDS
//                                  rank 1 stops for SECONDS in backward, after its first bucket
//                                  started and before the others can (one bucket a parameter,
//                                  1 s DDP timeout); run on simulated nodes, every rank must end
//                                  in an error of the hierarchical averaging (a short stop), or
//                                  the job in the inter-node watchdog's report (a long one);
//                                  SECONDS < 0: rank 1 dies there instead (_exit, no MPI_Finalize)
//   ddp_model_mismatch auto-choice [TRANSPORT]
//                                  transport = auto (or TRANSPORT): every rank's transport line
//                                  must be rank 0's (the choice, and the figures it was made
//                                  by), and rank 0 logs it and how long DDP took to set up; run
//                                  on real or simulated nodes
//   ddp_model_mismatch serialized  MPI initialized with MPI_THREAD_SERIALIZED by the program and
//                                  handed over: on simulated nodes DDP must fall back from the
//                                  hierarchical transport with the reason, and refuse it when
//                                  asked for by name
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/launch/ddp/distributed_data_parallel.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/mpi_interop.h"
#include "mpigrad/launch/observe/rank_logging.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/layers/linear.h"

using namespace mpigrad;

namespace {

std::shared_ptr<nn::Sequential> make_model(int64_t hidden) {
  core::Generator generator(1);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(8, hidden, generator), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(hidden, 4, generator)});
}

// MPI_THREAD_SERIALIZED from the host code: the communication thread is not allowed.
int serialized(int argc, char** argv) {
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) return 2;
  int status = 0;
  {
    auto manager = launch::adopt_communicator(MPI_COMM_WORLD);
    launch::RankLogger log(manager.rank(), manager.world_size());
    auto model = make_model(16);
    launch::DistributedDataParallel ddp(*model, manager.world());
    std::printf("%sgradients %s\n", log.prefix().c_str(), ddp.transport_description().c_str());
    launch::DdpOptions options;
    options.transport = launch::TransportKind::Hierarchical;
    try {
      launch::DistributedDataParallel required(*model, manager.world(), options);
      status = 1;  // must not get here
    } catch (const core::Error& error) {
      std::printf("%srefused: %s\n", log.prefix().c_str(), error.what());
    }
    std::fflush(stdout);
  }
  MPI_Finalize();
  return status;
}

// transport = auto decides the same on every rank: each compares its transport line with rank 0's,
// and the job fails, naming the rank, when any differs.
// With a transport name, builds with that transport instead, to compare the time DDP takes to
// set up (printed, never checked).
int auto_choice(launch::DistributedManager& manager, launch::RankLogger& log,
                const std::string& transport) {
  auto model = make_model(256);
  launch::DdpOptions options;
  if (!transport.empty()) options.transport = launch::parse_transport_kind(transport);
  manager.world().barrier();
  const auto start = std::chrono::steady_clock::now();
  launch::DistributedDataParallel ddp(*model, manager.world(), options);
  const std::chrono::duration<double> setup = std::chrono::steady_clock::now() - start;
  const std::string& line = ddp.transport_description();
  launch::Communicator& world = manager.world();
  core::Tensor length = core::Tensor::from_vector<int64_t>({int64_t(line.size())}, {1});
  world.broadcast(length, 0);
  core::Tensor text = core::zeros({length.item<int64_t>()}, core::kUInt8);
  if (manager.rank() == 0) {
    text = core::Tensor::from_vector<uint8_t>(std::vector<uint8_t>(line.begin(), line.end()),
                                              {int64_t(line.size())});
  }
  world.broadcast(text, 0);
  const std::vector<uint8_t> bytes = text.to_vector<uint8_t>();
  const bool same = std::string(bytes.begin(), bytes.end()) == line;
  core::Tensor differing = core::full({1}, same ? -1 : manager.rank(), core::kInt32);
  world.all_reduce(differing, launch::ReduceOp::Max);
  if (!same) log.error("transport line '" + line + "' differs from rank 0's");
  if (differing.item<int32_t>() >= 0) return 1;
  log.info("gradients " + line + " (the same on all " + std::to_string(manager.world_size()) +
           " ranks)");
  log.info("DDP set up in " + std::to_string(int(setup.count() * 1e3)) + " ms on rank 0");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "serialized") return serialized(argc, argv);
  if (mode != "differ" && mode != "same" && mode != "stall" && mode != "stall-mid-backward" &&
      mode != "auto-choice") {
    std::fprintf(stderr,
                 "usage: %s differ|same|stall|stall-mid-backward SECONDS|auto-choice "
                 "[TRANSPORT]|serialized\n",
                 argv[0]);
    return 2;
  }
  const double stop_seconds = mode == "stall-mid-backward" && argc > 2 ? std::atof(argv[2]) : 0;
  auto manager = launch::DistributedManager::initialize(&argc, &argv);
  launch::RankLogger log(manager.rank(), manager.world_size());
  try {
    if (mode == "auto-choice") return auto_choice(manager, log, argc > 2 ? argv[2] : "");
    core::Generator generator(1);
    auto model = make_model(mode == "differ" && manager.rank() == 1 ? 12 : 16);
    launch::DdpOptions options;
    options.timeout_seconds = 1.0;
    if (mode == "stall-mid-backward") {
      options.first_bucket_cap_mb = 1e-5;  // one bucket a parameter
      options.bucket_cap_mb = 1e-5;
    }
    launch::DistributedDataParallel ddp(*model, manager.world(), options);
    log.info("DistributedDataParallel built over " + std::to_string(manager.world_size()) +
             " ranks, gradients " + ddp.transport_description());
    if (mode == "stall" || mode == "stall-mid-backward") {
      if (mode == "stall" && manager.rank() == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      }
      if (manager.rank() == 1 && stop_seconds > 0) {
        // The last layer's bias is the first gradient and has a bucket of its own: this hook
        // runs after DDP's has started that bucket, and before any other gradient exists.
        model->named_parameters().back().second.register_grad_ready_hook([&](core::Tensor&) {
          std::this_thread::sleep_for(std::chrono::duration<double>(stop_seconds));
        });
      } else if (manager.rank() == 1 && stop_seconds < 0) {
        model->named_parameters().back().second.register_grad_ready_hook(
            [](core::Tensor&) { std::_Exit(9); });
      }
      core::Tensor x = core::randn({4, 8}, generator);
      core::sum(ddp(x)).backward();
    }
  } catch (const core::Error& error) {
    log.error(error.what());
    return 1;
  }
  return 0;
}
