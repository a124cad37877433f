// ZeRO-1 against plain DDP, side by side in one run:
//   MPIGRAD_NUM_THREADS=1 mpirun -np 2 --oversubscribe mpigrad-bench-zero [--json FILE]
// Both train their own copy of the 9.4M-parameter MLP (1024-2048-2048-1024-1024, batch 64 per
// rank, AdamW) with the same buckets and transport; they are timed in turn, round after round,
// each keeping its best round (a round's time is the slowest rank's), so a burst of load on this
// shared machine hits both alike. Reported: the optimizer state each rank holds (the largest
// over the ranks) and the ratios ZeRO-1 / DDP of the state (target 1 / ranks) and of the step
// time (target <= 1.05).
//
// --loss-scaling adds the two again with fp16's dynamic loss scaling (nn/optim/grad_scaler.h):
// DDP unscales the parameters' gradients, ZeRO-1 carries the found-inf flag through its buckets
// (DdpOptions::carry_found_inf) and unscales its shards. Reported as ZeRO-1 / DDP under loss
// scaling, and as the cost of the scaler on each (scaled / unscaled). The MLP computes in fp32:
// what is timed is the scaler's bookkeeping, not fp16 arithmetic.
//
// Peak memory per rank: with --only ddp or --only zero the program builds and trains that one
// contender alone, so a tool that reads each process's peak (farm-bench does) compares the two:
//   farm-bench --vs 'mpirun -np 2 mpigrad-bench-zero --only ddp' -- mpirun -np 2 ... --only zero
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/bench_util.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/ddp/distributed_data_parallel.h"
#include "mpigrad/launch/ddp/zero_redundancy.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/observe/rank_logging.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/layers/linear.h"
#include "mpigrad/nn/loss.h"
#include "mpigrad/nn/optim/adam.h"
#include "mpigrad/nn/optim/grad_scaler.h"

using namespace mpigrad;
using core::Tensor;

namespace {

struct Options {
  int64_t width = 2048;
  int64_t batch = 64;
  int rounds = 5;
  int iterations = 5;
  std::string json;
  std::string only;  // "ddp" or "zero": that contender alone (for peak memory)
  bool loss_scaling = false;
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--width") {
      options.width = std::stoll(value());
    } else if (arg == "--batch") {
      options.batch = std::stoll(value());
    } else if (arg == "--rounds") {
      options.rounds = std::stoi(value());
    } else if (arg == "--iterations") {
      options.iterations = std::stoi(value());
    } else if (arg == "--only" && i + 1 < argc &&
               (std::string(argv[i + 1]) == "ddp" || std::string(argv[i + 1]) == "zero")) {
      options.only = value();
    } else if (arg == "--loss-scaling") {
      options.loss_scaling = true;
    } else if (arg == "--json") {
      options.json = value();
    } else {
      std::printf(
          "usage: mpigrad-bench-zero [--width W] [--batch B] [--rounds R] [--iterations N] "
          "[--only ddp|zero] [--loss-scaling] [--json FILE]\n"
          "  the MLP 1024-W-W-1024-1024 (default W 2048: 9.4M params), batch B per rank (64),\n"
          "  R rounds (5) of N steps (5) of each contender\n");
      std::exit(arg == "--help" ? 0 : 2);
    }
  }
  return options;
}

std::shared_ptr<nn::Sequential> make_model(int64_t width) {
  core::Generator generator(0);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(1024, width, generator), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(width, width, generator), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(width, 1024, generator), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(1024, 1024, generator)});
}

struct Contender {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<nn::AdamW> optimizer;
  std::unique_ptr<launch::DistributedDataParallel> ddp;
  std::unique_ptr<launch::ZeroRedundancyOptimizer> zero;
  std::unique_ptr<nn::GradScaler> scaler;  // --loss-scaling
  double best = 1e30;

  void step(const Tensor& x, const Tensor& y) {
    Tensor out = ddp->forward(x);
    Tensor loss = nn::mse_loss(out, y);
    (scaler ? scaler->scale(loss) : loss).backward();
    if (zero) {
      if (scaler && zero->unscale_(*scaler)) {
        zero->skip_step();
      } else {
        zero->step();
      }
    } else {
      if (scaler) {
        scaler->step(*optimizer);
      } else {
        optimizer->step();
      }
      optimizer->zero_grad();
    }
    if (scaler) scaler->update();
  }
  int64_t state_bytes() const {
    if (zero) return zero->state_bytes();
    int64_t bytes = 0;
    for (const auto& entry : optimizer->state_dict().tensors()) bytes += entry.second.nbytes();
    return bytes;
  }
};

int run(int argc, char** argv) {
  Options options = parse(argc, argv);
  auto manager = launch::DistributedManager::initialize(&argc, &argv);
  launch::Communicator& world = manager.world();
  launch::RankLogger log(manager.rank(), manager.world_size());
  core::Generator data(launch::rank_seed(100, manager.rank()));
  Tensor x = core::randn({options.batch, 1024}, data);
  Tensor y = core::randn({options.batch, 1024}, data);

  auto make = [&](bool zero, bool loss_scaling = false) {
    auto c = std::make_unique<Contender>();
    c->model = make_model(options.width);
    c->optimizer = std::make_unique<nn::AdamW>(c->model->parameters());
    if (loss_scaling) c->scaler = std::make_unique<nn::GradScaler>();
    launch::DdpOptions ddp_options;
    ddp_options.zero = zero;
    ddp_options.carry_found_inf = zero && loss_scaling;
    c->ddp = std::make_unique<launch::DistributedDataParallel>(*c->model, world, ddp_options);
    if (zero) c->zero = std::make_unique<launch::ZeroRedundancyOptimizer>(*c->ddp, *c->optimizer);
    c->step(x, y);  // the first step makes the state (and rebuilds plain DDP's buckets): untimed
    return c;
  };
  if (!options.only.empty()) {
    auto alone = make(options.only == "zero");
    for (int i = 0; i < options.rounds * options.iterations; ++i) alone->step(x, y);
    if (manager.is_main_process()) {
      std::printf("%s alone: %d steps, optimizer state %.2f MiB on rank 0\n", options.only.c_str(),
                  1 + options.rounds * options.iterations,
                  double(alone->state_bytes()) / (1 << 20));
    }
    return 0;
  }
  auto plain = make(false);
  auto sharded = make(true);
  std::vector<Contender*> contenders = {plain.get(), sharded.get()};
  std::unique_ptr<Contender> plain_scaled, sharded_scaled;
  if (options.loss_scaling) {
    plain_scaled = make(false, true);
    sharded_scaled = make(true, true);
    contenders.push_back(plain_scaled.get());
    contenders.push_back(sharded_scaled.get());
  }
  for (int round = 0; round < options.rounds; ++round) {
    for (Contender* c : contenders) {
      world.barrier();
      const auto begin = std::chrono::steady_clock::now();
      for (int i = 0; i < options.iterations; ++i) c->step(x, y);
      const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - begin;
      Tensor slowest = core::full({1}, elapsed.count() / options.iterations, core::kFloat64);
      world.all_reduce(slowest, launch::ReduceOp::Max);
      c->best = std::min(c->best, slowest.item<double>());
    }
  }
  Tensor state = core::Tensor::from_vector<double>(
      {double(plain->state_bytes()), double(sharded->state_bytes())}, {2});
  world.all_reduce(state, launch::ReduceOp::Max);
  const std::vector<double> bytes = state.to_vector<double>();

  bench::Results results;
  results.add_text("transport", sharded->ddp->transport_description());
  results.add("ranks", world.size(), "ranks");
  results.add("parameters", double(plain->model->num_parameters()), "count");
  results.add("state_ddp_mib", bytes[0] / (1 << 20), "MiB", "AdamW state per rank, plain DDP");
  results.add("state_zero_mib", bytes[1] / (1 << 20), "MiB", "the largest rank's shard");
  results.add("state_ratio", bytes[1] / bytes[0], "x",
              "ZeRO-1 / DDP (target 1/" + std::to_string(world.size()) + ")");
  results.add("step_ddp_ms", plain->best * 1e3, "ms", "forward, backward, AdamW step");
  results.add("step_zero_ms", sharded->best * 1e3, "ms", "the same with ZeRO-1");
  results.add("step_ratio", sharded->best / plain->best, "x", "ZeRO-1 / DDP (target <= 1.05)");
  if (options.loss_scaling) {
    results.add("step_ddp_scaled_ms", plain_scaled->best * 1e3, "ms", "DDP with loss scaling");
    results.add("step_zero_scaled_ms", sharded_scaled->best * 1e3, "ms",
                "ZeRO-1 with loss scaling (found-inf flag carried)");
    results.add("step_ratio_scaled", sharded_scaled->best / plain_scaled->best, "x",
                "ZeRO-1 / DDP, both with loss scaling");
    results.add("scaling_cost_ddp", plain_scaled->best / plain->best, "x",
                "DDP with / without loss scaling");
    results.add("scaling_cost_zero", sharded_scaled->best / sharded->best, "x",
                "ZeRO-1 with / without loss scaling");
  }
  if (manager.is_main_process()) results.print();
  if (manager.is_main_process() && !options.json.empty() && !results.write_json(options.json)) {
    log.error("could not write " + options.json);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "mpigrad-bench-zero: %s\n", error.what());
    return 1;
  }
}
