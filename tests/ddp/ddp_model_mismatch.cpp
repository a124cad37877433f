// A whole job in which rank 1 builds a wider model than the others. Wrapping it in
// DistributedDataParallel must fail on every rank with the same clear message, and the job must
// exit non-zero (check_exit.sh checks both). Each rank prints its error with RankLogger, the way
// a training program reports a fatal error, and returns 1.
//   ddp_model_mismatch differ   rank 1's hidden layer is 12 wide instead of 16: must fail
//   ddp_model_mismatch same     every rank builds the same model: must succeed
//   ddp_model_mismatch stall    rank 1 reaches backward 2.5 s late with a 1 s DDP timeout: the
//                               shared-memory averaging must fail on every rank, naming the
//                               late rank on the others, instead of hanging
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/launch/distributed_data_parallel.h"
#include "mpigrad/launch/distributed_manager.h"
#include "mpigrad/launch/rank_logging.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/layers/linear.h"

using namespace mpigrad;

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "differ" && mode != "same" && mode != "stall") {
    std::fprintf(stderr, "usage: %s differ|same|stall\n", argv[0]);
    return 2;
  }
  auto manager = launch::DistributedManager::initialize(&argc, &argv);
  launch::RankLogger log(manager.rank(), manager.world_size());
  try {
    core::Generator generator(1);
    const int64_t hidden = mode == "differ" && manager.rank() == 1 ? 12 : 16;
    nn::Sequential model{std::make_shared<nn::Linear>(8, hidden, generator),
                         std::make_shared<nn::ReLU>(),
                         std::make_shared<nn::Linear>(hidden, 4, generator)};
    launch::DdpOptions options;
    options.timeout_seconds = 1.0;
    launch::DistributedDataParallel ddp(model, manager.world(), options);
    log.info("DistributedDataParallel built over " + std::to_string(manager.world_size()) +
             " ranks, gradients " + ddp.transport_description());
    if (mode == "stall") {
      if (manager.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      core::Tensor x = core::randn({4, 8}, generator);
      core::sum(ddp(x)).backward();
    }
  } catch (const core::Error& error) {
    log.error(error.what());
    return 1;
  }
  return 0;
}
