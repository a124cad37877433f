// mpigrad-bench-ddp: how much of DistributedDataParallel's communication hides behind backward.
// Run under mpirun (2 ranks or more):
//   MPIGRAD_NUM_THREADS=1 mpirun -np 2 --oversubscribe mpigrad-bench-ddp [--json FILE]
//
// Every rank trains the same MLP (>= 5M parameters by default) on its own small batch. In one
// run, with every rank busy the whole time so the cores are shared alike, it times a training
// step (zero_grad, forward, backward, SGD step):
//   local      the model alone, no DDP at all;
//   no-comm    DDP whose communicator does nothing: the same buckets, hooks and copies, but no
//              bytes move - the baseline "same per-rank work with communication disabled";
//   ddp        DDP over the world communicator with its default shared-memory buckets, at
//              bucket_cap_mb 1, 5, 25 (the default) and 100, and at 25 with shared memory off
//              (each bucket an MPI_Iallreduce, the path DDP takes across nodes);
//   allreduce  one blocking MPI all-reduce of all gradients, and the same average done by
//              SharedMemoryAllReduce (what communication alone costs either way).
// The overlap ratio is ddp / no-comm (1.00 = communication fully hidden; the target on the
// 2-core dev machine is <= 1.10), and exposed = ddp - no-comm is what communication adds to a
// step. Times are the slowest rank's, best of repeats.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/bench_util.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/core/threads.h"
#include "mpigrad/launch/distributed_data_parallel.h"
#include "mpigrad/launch/distributed_manager.h"
#include "mpigrad/launch/rank_logging.h"
#include "mpigrad/launch/shared_memory_all_reduce.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/layers/linear.h"
#include "mpigrad/nn/loss.h"
#include "mpigrad/nn/optim/sgd.h"

using namespace mpigrad;
using core::Tensor;

namespace {

struct Options {
  // Per rank; 64 is what the Fashion-MNIST main job uses. At 16 the whole step is 34 ms and the
  // averaging's ~3 ms of memory traffic alone is 9% of it (run --batch 16 to see).
  int64_t batch = 64;
  int64_t width = 2048;  // hidden width: 1024 -> w -> w -> 1024 -> 1024
  int iterations = 4;
  int repeats = 3;
  std::vector<double> bucket_caps{1, 5, 25, 100};
  std::string json;
};

void usage(const char* program) {
  std::printf(
      "usage: %s [--batch N] [--width W] [--iterations N] [--repeats N] [--buckets 1,5,25,100]\n"
      "          [--json FILE]\n"
      "  --batch       samples per rank and step (default 64)\n"
      "  --width       hidden width of the MLP 1024-W-W-1024-1024 (default 2048: 9.4M params)\n"
      "  --iterations  steps per timing (default 4), best of --repeats timings (default 3)\n"
      "  --buckets     bucket_cap_mb values of the sweep (default 1,5,25,100)\n"
      "  --json FILE   also write the figures as one JSON object (rank 0)\n",
      program);
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      MPIGRAD_CHECK(i + 1 < argc, arg, " needs a value");
      return argv[++i];
    };
    if (arg == "--batch") {
      options.batch = std::stoll(value());
    } else if (arg == "--width") {
      options.width = std::stoll(value());
    } else if (arg == "--iterations") {
      options.iterations = std::stoi(value());
    } else if (arg == "--repeats") {
      options.repeats = std::stoi(value());
    } else if (arg == "--buckets") {
      options.bucket_caps.clear();
      std::stringstream list(value());
      for (std::string item; std::getline(list, item, ',');) {
        options.bucket_caps.push_back(std::stod(item));
      }
    } else if (arg == "--json") {
      options.json = value();
    } else if (arg == "--help" || arg == "-h") {
      usage(argv[0]);
      std::exit(0);
    } else {
      core::fail("unknown argument '", arg, "' (see --help)");
    }
  }
  MPIGRAD_CHECK(options.batch >= 1 && options.width >= 1 && options.iterations >= 1 &&
                    options.repeats >= 1 && !options.bucket_caps.empty(),
                "--batch, --width, --iterations, --repeats must be >= 1 and "
                "--buckets non-empty");
  return options;
}

// Communication disabled: every collective completes at once and leaves its output as if this
// were the only rank, so DDP does all of its own work and moves no bytes.
class NoCommunication final : public launch::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  launch::Backend backend() const override { return launch::Backend::Mpi; }
  launch::WorkPtr all_reduce_async(const Tensor& in, const Tensor& out, launch::ReduceOp) override {
    copy(in, out);
    return done();
  }
  void all_reduce(const Tensor& in, const Tensor& out, launch::ReduceOp) override { copy(in, out); }
  launch::WorkPtr broadcast_async(const Tensor&, int) override { return done(); }
  void broadcast(const Tensor&, int) override {}
  launch::WorkPtr all_gather_async(const Tensor& in, const Tensor& out) override {
    copy(in, out);
    return done();
  }
  void all_gather(const Tensor& in, const Tensor& out) override { copy(in, out); }
  launch::WorkPtr all_gather_v_async(const Tensor& in, const Tensor& out,
                                     std::span<const int64_t>) override {
    copy(in, out);
    return done();
  }
  void all_gather_v(const Tensor& in, const Tensor& out, std::span<const int64_t>) override {
    copy(in, out);
  }
  launch::WorkPtr reduce_scatter_async(const Tensor& in, const Tensor& out,
                                       launch::ReduceOp) override {
    copy(in, out);
    return done();
  }
  void reduce_scatter(const Tensor& in, const Tensor& out, launch::ReduceOp) override {
    copy(in, out);
  }
  launch::WorkPtr barrier_async() override { return done(); }
  void barrier() override {}
  std::unique_ptr<launch::Communicator> split(int, int, std::string) override {
    return std::make_unique<NoCommunication>();
  }
  std::unique_ptr<launch::Communicator> split_node_local(std::string) override {
    return std::make_unique<NoCommunication>();
  }

 private:
  struct Done final : launch::Work {
    bool test() override { return true; }
    void wait() override {}
  };
  static launch::WorkPtr done() { return std::make_shared<Done>(); }
  static void copy(const Tensor& in, const Tensor& out) {
    Tensor target = out;  // a handle: writing through it fills the caller's tensor
    if (!in.is_same(target)) target.copy_(in);
  }
  std::string name_ = "no-communication";
};

std::shared_ptr<nn::Sequential> make_model(int64_t width) {
  core::Generator generator(0);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(1024, width, generator), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(width, width, generator), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(width, 1024, generator), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(1024, 1024, generator)});
}

int run(int argc, char** argv) {
  Options options = parse(argc, argv);
  auto manager = launch::DistributedManager::initialize(&argc, &argv);
  launch::Communicator& world = manager.world();
  launch::RankLogger log(manager.rank(), manager.world_size());

  auto model = make_model(options.width);
  const int64_t parameters = model->num_parameters();
  core::Generator data(launch::rank_seed(100, manager.rank()));
  Tensor x = core::randn({options.batch, 1024}, data);
  Tensor y = core::randn({options.batch, 1024}, data);
  nn::SGD optimizer(model->parameters(), {.lr = 1e-4});

  // One training step; `ddp` null means the bare model.
  auto step = [&](launch::DistributedDataParallel* ddp) {
    model->zero_grad(/*set_to_none=*/false);
    Tensor out = ddp ? ddp->forward(x) : model->forward(x);
    nn::mse_loss(out, y).backward();
    optimizer.step();
  };
  // The slowest rank's best time per step.
  auto time_steps = [&](launch::DistributedDataParallel* ddp) {
    world.barrier();
    double seconds = bench::seconds_per_call([&] { step(ddp); }, options.iterations,
                                             options.repeats);
    Tensor slowest = core::full({1}, seconds, core::kFloat64);
    world.all_reduce(slowest, launch::ReduceOp::Max);
    return slowest.item<double>();
  };
  auto with_ddp = [&](launch::Communicator& communicator, double bucket_cap_mb,
                      bool shared_memory = true) {
    launch::DdpOptions ddp_options;
    ddp_options.bucket_cap_mb = bucket_cap_mb;
    ddp_options.shared_memory = shared_memory;
    launch::DistributedDataParallel ddp(*model, communicator, ddp_options);
    return std::pair{time_steps(&ddp), ddp.bucket_count()};
  };

  NoCommunication no_communication;
  const double local = time_steps(nullptr);
  const double no_comm_first = with_ddp(no_communication, 25).first;
  std::vector<std::pair<double, int>> sweep;
  for (double cap : options.bucket_caps) sweep.push_back(with_ddp(world, cap));
  // The default buckets through the communicator's nonblocking all-reduce instead.
  const double via_communicator = with_ddp(world, 25, false).first;
  // The baseline again after the sweep, keeping the better: drift must not favour DDP.
  const double no_comm = std::min(no_comm_first, with_ddp(no_communication, 25).first);

  // Communication alone: one blocking all-reduce (average) of every gradient.
  Tensor flat = core::zeros({parameters});
  world.barrier();
  double allreduce = bench::seconds_per_call(
      [&] { world.all_reduce(flat, launch::ReduceOp::Avg); }, options.iterations, options.repeats);
  Tensor slowest = core::full({1}, allreduce, core::kFloat64);
  world.all_reduce(slowest, launch::ReduceOp::Max);
  allreduce = slowest.item<double>();
  // The same average in shared memory, as DDP's buckets do it (0 when the ranks cannot share).
  double shared_average = 0;
  const launch::SharedBufferSpec all_grads{core::kFloat32, parameters};
  if (auto shared = launch::SharedMemoryAllReduce::create(world, {&all_grads, 1}, 60)) {
    world.barrier();
    shared_average = bench::seconds_per_call(
        [&] {
          shared->start(0);
          shared->wait(0);
        },
        options.iterations, options.repeats);
    slowest.fill_(shared_average);
    world.all_reduce(slowest, launch::ReduceOp::Max);
    shared_average = slowest.item<double>();
  }

  if (!manager.is_main_process()) return 0;
  bench::Results results;
  results.add_text("model", "MLP 1024-" + std::to_string(options.width) + "-" +
                                std::to_string(options.width) + "-1024-1024, float32");
  results.add_text("ranks", std::to_string(manager.world_size()));
  results.add_text("threads_per_rank", std::to_string(core::num_threads()));
  results.add("parameters", double(parameters), "count");
  results.add("gradient_mib", double(parameters) * 4.0 / (1 << 20), "MiB");
  results.add("batch_per_rank", double(options.batch), "samples");
  results.add("step_local_ms", local * 1e3, "ms", "no DDP at all");
  results.add("step_nocomm_ms", no_comm * 1e3, "ms", "DDP, communication disabled, 25 MiB");
  results.add("allreduce_all_grads_ms", allreduce * 1e3, "ms", "one blocking MPI all-reduce");
  results.add("shared_average_all_grads_ms", shared_average * 1e3, "ms",
              "the same average in shared memory");
  double best_ratio = 1e30;
  for (size_t i = 0; i < options.bucket_caps.size(); ++i) {
    auto [seconds, buckets] = sweep[i];
    std::ostringstream cap;
    cap << options.bucket_caps[i];
    std::string key = "bucket_" + cap.str() + "mib";
    double ratio = seconds / no_comm;
    results.add("step_ddp_" + key + "_ms", seconds * 1e3, "ms",
                std::to_string(buckets) + " buckets");
    results.add("overlap_ratio_" + key, ratio, "x", "ddp / no-comm (target <= 1.10)");
    results.add("exposed_" + key + "_ms", (seconds - no_comm) * 1e3, "ms", "ddp - no-comm");
    if (options.bucket_caps[i] == 25) results.add("overlap_ratio", ratio, "x", "default 25 MiB");
    best_ratio = std::min(best_ratio, ratio);
  }
  results.add("overlap_ratio_best", best_ratio, "x", "over the sweep");
  results.add("step_ddp_bucket_25mib_mpi_ms", via_communicator * 1e3, "ms",
              "shared_memory off: MPI_Iallreduce per bucket");
  results.add("overlap_ratio_bucket_25mib_mpi", via_communicator / no_comm, "x",
              "shared_memory off");
  results.add("ddp_overhead_vs_local", no_comm / local, "x", "no-comm / local");
  results.print();
  if (!options.json.empty() && !results.write_json(options.json)) {
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
    std::fprintf(stderr, "mpigrad-bench-ddp: %s\n", error.what());
    return 1;
  }
}
