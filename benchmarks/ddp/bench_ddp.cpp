// mpigrad-bench-ddp: how much of DistributedDataParallel's communication hides behind backward.
// Run under mpirun (2 ranks or more):
//   MPIGRAD_NUM_THREADS=1 mpirun -np 2 --oversubscribe mpigrad-bench-ddp [--json FILE]
// and across (simulated) nodes, where DDP takes its hierarchical transport:
//   MPIGRAD_SIMULATE_NODES=2 mpirun -np 2 ... -x MPIGRAD_SIMULATE_NODES mpigrad-bench-ddp
//
// Every rank trains the same MLP (>= 5M parameters by default) on its own small batch. In one
// run, with every rank busy the whole time so the cores are shared alike, it times a training
// step (zero_grad, forward, backward, SGD step):
//   local      the model alone, no DDP at all;
//   no-comm    DDP whose communicator does nothing: the same buckets, hooks and copies, but no
//              bytes move - the baseline "same per-rank work with communication disabled";
//   ddp        DDP over the world communicator with its default transport (auto), at
//              bucket_cap_mb 1, 5, 25 (the default) and 100, and the same sweep with
//              compression = bf16 (under auto: across nodes the hierarchical transport with a
//              bf16 inter-node step, on one node the communicator's all-reduce in bf16); at 25
//              with shared memory off (each bucket an MPI_Iallreduce: the communicator
//              transport); and across nodes at 25 with transport = hierarchical, and with
//              compression = bf16 and transport = communicator, beside what auto chose;
//   forward    the forward pass and loss alone, no backward: a step can only hide
//              communication behind what follows it, so (no-comm - forward) / all-reduce is the
//              ceiling of "hidden" for this model and batch ("hidden_ceiling");
//   allreduce  one blocking MPI all-reduce of all gradients, and the same average done by
//              SharedMemoryAllReduce (what communication alone costs either way); across nodes
//              also as the hierarchical transport does it ("own", fp32 and with the bf16 wire),
//              with its communication thread's CPU time per average: where backward keeps every
//              core busy, that CPU is added to the step whatever the overlap, so hidden cannot
//              pass 1 - cpu / average ("hidden_cpu_ceiling", beside the ceiling below).
// The overlap ratio is ddp / no-comm (1.00 = communication fully hidden; the target on the
// 2-core dev machine is <= 1.10), and exposed = ddp - no-comm is what communication adds to a
// step. Across nodes the bound is no-comm + one blocking all-reduce (not overlapping at all):
// "vs_serial" = ddp / that bound must stay <= 1, and "hidden" = (bound - ddp) / all-reduce is the
// fraction of the all-reduce's time that backward covers (bf16 against a bf16 all-reduce).
//   network    with --network-gbps: DDP over a simulated network, a communicator whose every
//              all-reduce completes alpha + bytes / beta after the link is free, sleeping (no
//              CPU), so what is measured is the overlap machinery alone. hidden = 1 - (time
//              the step slept waiting for the network) / (the network's busy time), at each
//              bucket cap; the last bucket can only start when backward ends, so hidden can
//              never pass 1 - (alpha + last bucket / beta) / network time ("hidden_ceiling").
// Over a real network: scripts/cluster-sim.sh --nodes 2 --ranks-per-node 1 --rate 2gbit --
// -x MPIGRAD_NUM_THREADS=1 mpigrad-bench-ddp (docs/clusters.md, "A cluster on one machine").
// Every configuration has its own copy of the model, all built first and then timed in turn
// within each round, so load bursts on a shared machine hit them alike; a configuration's time
// is its best round, a round's time the slowest rank's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/bench_util.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/core/threads.h"
#include "mpigrad/launch/ddp/distributed_data_parallel.h"
#include "mpigrad/launch/ddp/transports/hierarchical_all_reduce.h"
#include "mpigrad/launch/ddp/transports/shared_memory_all_reduce.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/observe/rank_logging.h"
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
  int iterations = 3;
  int repeats = 6;
  std::vector<double> bucket_caps{1, 5, 25, 100};
  std::string json;
  double network_alpha_us = 2.0;     // per collective: a hop of HDR InfiniBand
  std::vector<double> network_gbps;  // empty: no simulated network
};

void usage(const char* program) {
  std::printf(
      "usage: %s [--batch N] [--width W] [--iterations N] [--repeats N] [--buckets 1,5,25,100]\n"
      "          [--network-gbps 10,25 [--network-alpha-us 2]] [--json FILE]\n"
      "  --batch       samples per rank and step (default 64)\n"
      "  --width       hidden width of the MLP 1024-W-W-1024-1024 (default 2048: 9.4M params)\n"
      "  --iterations  steps per round (default 3), best of --repeats rounds (default 6); the\n"
      "                configurations take turns within each round\n"
      "  --buckets     bucket_cap_mb values of the sweep (default 1,5,25,100)\n"
      "  --network-gbps  also run DDP over a simulated network of these bandwidths (GB/s)\n"
      "  --network-alpha-us  its latency per collective (default 2 us)\n"
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
    } else if (arg == "--network-alpha-us") {
      options.network_alpha_us = std::stod(value());
    } else if (arg == "--network-gbps") {
      std::stringstream list(value());
      for (std::string item; std::getline(list, item, ',');) {
        options.network_gbps.push_back(std::stod(item));
      }
    } else if (arg == "--help" || arg == "-h") {
      usage(argv[0]);
      std::exit(0);
    } else {
      core::fail("unknown argument '", arg, "' (see --help)");
    }
  }
  MPIGRAD_CHECK(options.batch >= 1 && options.width >= 1 && options.iterations >= 1 &&
                    options.repeats >= 1 && !options.bucket_caps.empty() &&
                    options.network_alpha_us >= 0 &&
                    std::all_of(options.network_gbps.begin(), options.network_gbps.end(),
                                [](double gbps) { return gbps > 0; }),
                "--batch, --width, --iterations, --repeats must be >= 1, --buckets non-empty, "
                "--network-gbps positive and --network-alpha-us >= 0");
  return options;
}

// Communication disabled: every collective completes at once and leaves its output as if this
// were the only rank, so DDP does all of its own work and moves no bytes.
class NoCommunication : public launch::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  launch::Backend backend() const override { return launch::Backend::Mpi; }
  std::unique_ptr<launch::Communicator> split(int, int, std::string) override {
    return std::make_unique<NoCommunication>();
  }
  std::unique_ptr<launch::Communicator> split_node_local(std::string) override {
    return std::make_unique<NoCommunication>();
  }

 protected:
  // Every collective of a single rank leaves its input in its output (barrier and broadcast
  // have nothing to move).
  void run_collective(const launch::Collective& collective) override {
    if (collective.input != nullptr && collective.output != nullptr) {
      copy(*collective.input, *collective.output);
    }
  }
  launch::WorkPtr start_collective(const launch::Collective& collective) override {
    run_collective(collective);
    return done();
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

// A network that moves no bytes but takes the time a real one would: every all-reduce is done
// alpha + bytes / beta after the link is free (collectives queue on one link, in the order they
// are issued), and waiting for one sleeps. Everything else completes at once, as without
// communication. It keeps two sums: the link's busy time, and the time the caller spent asleep
// waiting for it, which is the network time the overlap failed to hide.
class SimulatedNetwork final : public NoCommunication {
 public:
  using Clock = std::chrono::steady_clock;
  SimulatedNetwork(double alpha_seconds, double bytes_per_second)
      : alpha_(alpha_seconds), beta_(bytes_per_second) {}
  double seconds_for(int64_t bytes) const { return alpha_ + double(bytes) / beta_; }

  void reset() { busy_seconds = blocked_seconds = 0; }

  double busy_seconds = 0;
  double blocked_seconds = 0;

 protected:
  launch::WorkPtr start_collective(const launch::Collective& collective) override {
    if (collective.kind != launch::CollectiveKind::AllReduce) {
      return NoCommunication::start_collective(collective);
    }
    run_collective(collective);
    const auto duration = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(seconds_for(collective.bytes)));
    link_free_ = std::max(Clock::now(), link_free_) + duration;
    busy_seconds += seconds_for(collective.bytes);
    return std::make_shared<Delayed>(link_free_, blocked_seconds);
  }

 private:
  struct Delayed final : launch::Work {
    Delayed(Clock::time_point when, double& blocked) : done(when), blocked_seconds(blocked) {}
    bool test() override { return Clock::now() >= done; }
    void wait() override {
      const auto now = Clock::now();
      if (now >= done) return;
      blocked_seconds += std::chrono::duration<double>(done - now).count();
      std::this_thread::sleep_until(done);
    }
    Clock::time_point done;
    double& blocked_seconds;
  };
  double alpha_, beta_;
  Clock::time_point link_free_{};
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

  const int64_t parameters = make_model(options.width)->num_parameters();
  core::Generator data(launch::rank_seed(100, manager.rank()));
  Tensor x = core::randn({options.batch, 1024}, data);
  Tensor y = core::randn({options.batch, 1024}, data);

  // Every configuration trains its own copy of the model (the same initial weights), so all of
  // them exist at once and are timed in turn, round after round: each keeps its best round, and
  // a burst of load on this shared machine hits them alike instead of whichever ran then.
  struct Contender {
    std::shared_ptr<nn::Sequential> model;
    std::unique_ptr<nn::SGD> optimizer;
    std::unique_ptr<launch::DistributedDataParallel> ddp;
    std::function<void()> body;  // what one timed call does (a step, or an all-reduce)
    SimulatedNetwork* network = nullptr;
    double best = 1e30;
    double setup_seconds = 0;  // building the DDP: under auto across nodes, the link probe too
    // The own averages: their communication thread's CPU time, summed over every timed call.
    double thread_cpu_seconds = 0;
    int calls = 0;
  };
  std::vector<std::unique_ptr<Contender>> contenders;
  std::vector<std::unique_ptr<SimulatedNetwork>> networks;
  NoCommunication no_communication;
  auto add_model =
      [&](launch::Communicator* communicator, double bucket_cap_mb, bool shared_memory = true,
          launch::GradCompression compression = launch::GradCompression::None,
          launch::TransportKind transport = launch::TransportKind::Auto) -> Contender& {
    auto contender = std::make_unique<Contender>();
    Contender& c = *contender;
    c.model = make_model(options.width);
    c.optimizer = std::make_unique<nn::SGD>(c.model->parameters(), nn::SGDOptions{.lr = 1e-4});
    if (communicator) {
      launch::DdpOptions ddp_options;
      ddp_options.bucket_cap_mb = bucket_cap_mb;
      ddp_options.shared_memory = shared_memory;
      ddp_options.compression = compression;
      ddp_options.transport = transport;
      const auto begin = std::chrono::steady_clock::now();
      c.ddp =
          std::make_unique<launch::DistributedDataParallel>(*c.model, *communicator, ddp_options);
      c.setup_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    }
    c.body = [&c, &x, &y] {
      c.model->zero_grad(/*set_to_none=*/false);
      Tensor out = c.ddp ? c.ddp->forward(x) : c.model->forward(x);
      nn::mse_loss(out, y).backward();
      c.optimizer->step();
    };
    c.body();  // the first step (it rebuilds the buckets) is not timed
    contenders.push_back(std::move(contender));
    return c;
  };
  Contender& local = add_model(nullptr, 0);
  Contender& no_comm = add_model(&no_communication, 25);
  // The forward pass and loss alone, on the local model: what a step spends before the first
  // gradient exists, so no-comm minus this is the most a step can hide communication behind.
  auto forward = std::make_unique<Contender>();
  forward->body = [&local, &x, &y] { (void)nn::mse_loss(local.model->forward(x), y); };
  Contender& forward_only = *forward;
  contenders.push_back(std::move(forward));
  std::vector<Contender*> sweep;
  for (double cap : options.bucket_caps) sweep.push_back(&add_model(&world, cap));
  // The default buckets through the communicator's nonblocking all-reduce instead.
  Contender& via_communicator = add_model(&world, 25, false);
  // The same sweep with the buckets cast to bfloat16 for the all-reduce ([distributed]
  // compression = bf16).
  std::vector<Contender*> sweep_bf16;
  for (double cap : options.bucket_caps) {
    sweep_bf16.push_back(&add_model(&world, cap, true, launch::GradCompression::BFloat16));
  }
  // Across nodes, the hierarchical transport asked for by name, beside whatever auto chose for
  // the sweep (the communicator above is the other candidate).
  Contender* hierarchical = nullptr;
  Contender* bf16_communicator = nullptr;
  if (manager.node_count() > 1) {
    hierarchical = &add_model(&world, 25, true, launch::GradCompression::None,
                              launch::TransportKind::Hierarchical);
    bf16_communicator = &add_model(&world, 25, true, launch::GradCompression::BFloat16,
                                   launch::TransportKind::Communicator);
  }
  // DDP over the simulated network, for each bandwidth and bucket cap.
  std::vector<std::vector<Contender*>> on_network(options.network_gbps.size());
  for (size_t n = 0; n < options.network_gbps.size(); ++n) {
    for (double cap : options.bucket_caps) {
      networks.push_back(std::make_unique<SimulatedNetwork>(options.network_alpha_us * 1e-6,
                                                            options.network_gbps[n] * 1e9));
      Contender& c = add_model(networks.back().get(), cap);
      c.network = networks.back().get();
      c.network->reset();
      on_network[n].push_back(&c);
    }
  }
  // Communication alone: one blocking all-reduce (average) of every gradient, and the same
  // average in shared memory as DDP's buckets do it on one node (when the ranks can share).
  Tensor flat = core::zeros({parameters});
  auto allreduce = std::make_unique<Contender>();
  allreduce->body = [&] { world.all_reduce(flat, launch::ReduceOp::Avg); };
  Contender* allreduce_all = allreduce.get();
  contenders.push_back(std::move(allreduce));
  Tensor flat_bf16 = core::zeros({parameters}).to(core::kBFloat16);
  auto allreduce_bf16 = std::make_unique<Contender>();
  allreduce_bf16->body = [&] { world.all_reduce(flat_bf16, launch::ReduceOp::Avg); };
  Contender* allreduce_all_bf16 = allreduce_bf16.get();
  contenders.push_back(std::move(allreduce_bf16));
  // Across nodes, the same average as the hierarchical transport does it: all gradients in one
  // buffer, started and waited for at once, in fp32 and with the bf16 wire. This is the
  // serial bound's all-reduce for the hierarchical configurations ("own"), whose link step is not
  // the flat all-reduce's.
  const launch::SharedBufferSpec all_grads{core::kFloat32, parameters};
  std::vector<std::unique_ptr<launch::HierarchicalAllReduce>> hierarchical_all;
  Contender* own_average = nullptr;
  Contender* own_average_bf16 = nullptr;
  if (manager.node_count() > 1) {
    for (bool bf16_wire : {false, true}) {
      // The thread waits for the link as the sweep's does (auto decides it from the link).
      const auto* sweep_transport = dynamic_cast<launch::HierarchicalAllReduce*>(
          &(bf16_wire ? sweep_bf16 : sweep)[0]->ddp->transport());
      const launch::LinkWait link_wait =
          sweep_transport ? sweep_transport->link_wait() : launch::LinkWait::Blocking;
      auto transport = launch::HierarchicalAllReduce::create(
          world, world.split_node_local("bench node"), {&all_grads, 1}, 60, nullptr,
          bf16_wire ? std::optional<core::DType>(core::kBFloat16) : std::nullopt, link_wait);
      if (!transport) break;
      auto contender = std::make_unique<Contender>();
      launch::HierarchicalAllReduce* average = transport.get();
      contender->body = [average, c = contender.get()] {
        const double cpu = average->thread_cpu_seconds();
        average->start(0);
        average->wait(0);
        c->thread_cpu_seconds += average->thread_cpu_seconds() - cpu;
        ++c->calls;
      };
      (bf16_wire ? own_average_bf16 : own_average) = contender.get();
      contenders.push_back(std::move(contender));
      hierarchical_all.push_back(std::move(transport));
    }
  }
  std::unique_ptr<launch::SharedMemoryAllReduce> shared;
  Contender* shared_average = nullptr;
  if (manager.node_count() == 1) {
    shared = launch::SharedMemoryAllReduce::create(world, {&all_grads, 1}, 60);
  }
  if (shared) {
    auto contender = std::make_unique<Contender>();
    contender->body = [&] {
      shared->start(0);
      shared->wait(0);
    };
    shared_average = contender.get();
    contenders.push_back(std::move(contender));
  }

  // Rounds: every contender runs `iterations` calls in turn; a round's time is the slowest
  // rank's.
  for (int round = 0; round < options.repeats; ++round) {
    for (auto& contender : contenders) {
      world.barrier();
      auto begin = std::chrono::steady_clock::now();
      for (int i = 0; i < options.iterations; ++i) contender->body();
      std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - begin;
      Tensor slowest = core::full({1}, elapsed.count() / options.iterations, core::kFloat64);
      world.all_reduce(slowest, launch::ReduceOp::Max);
      contender->best = std::min(contender->best, slowest.item<double>());
    }
  }
  // What a DDP contender reports besides its time: its buckets' sizes in launch order.
  std::map<std::string, int64_t> parameter_bytes;
  for (auto& [name, tensor] : local.model->named_parameters()) {
    parameter_bytes[name] = tensor.nbytes();
  }
  auto bucket_bytes = [&](const Contender& c) {
    std::vector<int64_t> sizes;
    for (const auto& bucket : c.ddp->bucket_layout()) {
      sizes.push_back(0);
      for (const std::string& name : bucket) sizes.back() += parameter_bytes[name];
    }
    return sizes;
  };

  // The own averages' CPU per call, the most any rank's thread took: with every core busy
  // computing, a step pays at least that much CPU for its communication.
  auto thread_cpu_per_call = [&](const Contender* own) {
    Tensor cpu = core::full({1}, own ? own->thread_cpu_seconds / std::max(1, own->calls) : 0.0,
                            core::kFloat64);
    world.all_reduce(cpu, launch::ReduceOp::Max);
    return cpu.item<double>();
  };
  const double own_cpu = thread_cpu_per_call(own_average);
  const double own_cpu_bf16 = thread_cpu_per_call(own_average_bf16);
  if (!manager.is_main_process()) return 0;
  bench::Results results;
  results.add_text("model", "MLP 1024-" + std::to_string(options.width) + "-" +
                                std::to_string(options.width) + "-1024-1024, float32");
  results.add_text("ranks", std::to_string(manager.world_size()));
  results.add_text("threads_per_rank", std::to_string(core::num_threads()));
  results.add("parameters", double(parameters), "count");
  results.add("gradient_mib", double(parameters) * 4.0 / (1 << 20), "MiB");
  results.add("batch_per_rank", double(options.batch), "samples");
  results.add_text("transport", sweep[0]->ddp->transport_description());
  results.add("rounds", options.repeats, "rounds",
              "of " + std::to_string(options.iterations) + " calls per contender, interleaved");
  results.add("step_local_ms", local.best * 1e3, "ms", "no DDP at all");
  results.add("step_nocomm_ms", no_comm.best * 1e3, "ms", "DDP, communication disabled, 25 MiB");
  results.add("allreduce_all_grads_ms", allreduce_all->best * 1e3, "ms",
              "one blocking MPI all-reduce");
  results.add("shared_average_all_grads_ms", shared_average ? shared_average->best * 1e3 : 0.0,
              "ms", "the same average in shared memory (one node)");
  results.add("step_forward_ms", forward_only.best * 1e3, "ms",
              "forward and loss alone: before it no gradient exists");
  // Not overlapping at all: the step without communication, then one blocking all-reduce.
  const double serial = no_comm.best + allreduce_all->best;
  // Communication can only hide behind what follows the forward pass (backward, the optimizer),
  // so "hidden" cannot pass (no-comm - forward) / all-reduce: the ceiling of this model and batch.
  const double behind = std::max(0.0, no_comm.best - forward_only.best);
  results.add("hidden_ceiling", std::min(1.0, behind / allreduce_all->best), "",
              "(no-comm - forward) / blocking all-reduce: the most hidden can reach");
  results.add("hidden_ceiling_bf16", std::min(1.0, behind / allreduce_all_bf16->best), "",
              "the same against the blocking bf16 all-reduce");
  results.add("step_serial_bound_ms", serial * 1e3, "ms", "no-comm + blocking all-reduce");
  // Against the hierarchical transport's own blocking average, for configurations that took it.
  auto add_own = [&](const Contender& run, const std::string& key, const Contender* own) {
    if (own == nullptr || run.ddp->transport_kind() != launch::TransportKind::Hierarchical) return;
    const double bound = no_comm.best + own->best;
    results.add("vs_own_serial_" + key, run.best / bound, "x",
                "ddp / (no-comm + the hierarchical transport's blocking average)");
    results.add("hidden_own_" + key, (bound - run.best) / own->best, "",
                "of the hierarchical transport's blocking average, hidden behind backward");
  };
  if (own_average != nullptr) {
    results.add("own_average_all_grads_ms", own_average->best * 1e3, "ms",
                "the hierarchical transport's average of all gradients at once");
  }
  if (own_average_bf16 != nullptr) {
    results.add("own_average_all_grads_bf16_ms", own_average_bf16->best * 1e3, "ms",
                "the same with the bf16 wire");
  }
  // Both ceilings against the own average: what backward could cover, and what the averaging
  // costs the cores beside its time on the clock (when backward keeps every core busy, that CPU
  // time is added to the step however well it overlaps, so hidden cannot pass 1 - cpu / average).
  auto add_own_ceilings = [&](const Contender* own, double cpu, const std::string& suffix) {
    if (own == nullptr) return;
    results.add("hidden_ceiling_own" + suffix, std::min(1.0, behind / own->best), "",
                "(no-comm - forward) / the transport's own blocking average");
    results.add("own_average_cpu" + suffix + "_ms", cpu * 1e3, "ms",
                "its communication thread's CPU time per average (the busiest rank's)");
    results.add("hidden_cpu_ceiling" + suffix, std::max(0.0, 1.0 - cpu / own->best), "",
                "1 - cpu / average: the most hidden can reach while compute fills every core "
                "(about 0 for a thread that blocks in MPI, which spins)");
  };
  add_own_ceilings(own_average, own_cpu, "");
  add_own_ceilings(own_average_bf16, own_cpu_bf16, "_bf16");
  double best_ratio = 1e30;
  for (size_t i = 0; i < options.bucket_caps.size(); ++i) {
    const Contender& run = *sweep[i];
    std::ostringstream cap;
    cap << options.bucket_caps[i];
    std::string key = "bucket_" + cap.str() + "mib";
    double ratio = run.best / no_comm.best;
    results.add_text("transport_" + key, run.ddp->transport_description());
    results.add("step_ddp_" + key + "_ms", run.best * 1e3, "ms",
                std::to_string(run.ddp->bucket_count()) + " buckets");
    results.add("overlap_ratio_" + key, ratio, "x", "ddp / no-comm (target <= 1.10)");
    results.add("exposed_" + key + "_ms", (run.best - no_comm.best) * 1e3, "ms", "ddp - no-comm");
    results.add("vs_serial_" + key, run.best / serial, "x", "ddp / serial bound (<= 1)");
    results.add("hidden_" + key, (serial - run.best) / allreduce_all->best, "",
                "of the blocking all-reduce's time, hidden behind backward");
    add_own(run, key, own_average);
    if (options.bucket_caps[i] == 25) results.add("overlap_ratio", ratio, "x", "default 25 MiB");
    best_ratio = std::min(best_ratio, ratio);
  }
  results.add("overlap_ratio_best", best_ratio, "x", "over the sweep");
  results.add("step_ddp_bucket_25mib_mpi_ms", via_communicator.best * 1e3, "ms",
              "shared_memory off: MPI_Iallreduce per bucket");
  results.add("overlap_ratio_bucket_25mib_mpi", via_communicator.best / no_comm.best, "x",
              "shared_memory off");
  results.add("vs_serial_bucket_25mib_mpi", via_communicator.best / serial, "x",
              "shared_memory off, ddp / serial bound");
  results.add("hidden_bucket_25mib_mpi", (serial - via_communicator.best) / allreduce_all->best, "",
              "shared_memory off, of the blocking all-reduce's time");
  if (hierarchical != nullptr) {
    results.add("ddp_setup_auto_ms", sweep[0]->setup_seconds * 1e3, "ms",
                "building the sweep's first DDP under auto (rank 0), the link probe included");
    results.add("ddp_setup_hierarchical_ms", hierarchical->setup_seconds * 1e3, "ms",
                "building DDP with transport = hierarchical (rank 0)");
    results.add("step_ddp_bucket_25mib_hierarchical_ms", hierarchical->best * 1e3, "ms",
                "transport = hierarchical");
    results.add("vs_serial_bucket_25mib_hierarchical", hierarchical->best / serial, "x",
                "hierarchical, ddp / serial bound");
    results.add("hidden_bucket_25mib_hierarchical",
                (serial - hierarchical->best) / allreduce_all->best, "",
                "hierarchical, of the blocking all-reduce's time");
    add_own(*hierarchical, "bucket_25mib_hierarchical", own_average);
  }
  const double serial_bf16 = no_comm.best + allreduce_all_bf16->best;
  results.add("allreduce_all_grads_bf16_ms", allreduce_all_bf16->best * 1e3, "ms",
              "one blocking MPI all-reduce, bfloat16");
  auto add_bf16 = [&](const Contender& run, const std::string& key, const std::string& what) {
    results.add_text("transport_" + key, run.ddp->transport_description());
    results.add("step_ddp_" + key + "_ms", run.best * 1e3, "ms",
                what + ", " + std::to_string(run.ddp->bucket_count()) + " buckets");
    results.add("vs_serial_" + key, run.best / serial_bf16, "x",
                what + ", ddp / (no-comm + blocking bf16 all-reduce)");
    results.add("vs_serial_fp32_" + key, run.best / serial, "x",
                what + ", ddp / the fp32 serial bound");
    results.add("hidden_" + key, (serial_bf16 - run.best) / allreduce_all_bf16->best, "",
                what + ", of the blocking bf16 all-reduce's time");
  };
  for (size_t i = 0; i < options.bucket_caps.size(); ++i) {
    std::ostringstream cap;
    cap << options.bucket_caps[i];
    add_bf16(*sweep_bf16[i], "bucket_" + cap.str() + "mib_bf16",
             "compression = bf16, transport auto");
    add_own(*sweep_bf16[i], "bucket_" + cap.str() + "mib_bf16", own_average_bf16);
  }
  if (bf16_communicator != nullptr) {
    add_bf16(*bf16_communicator, "bucket_25mib_bf16_communicator",
             "compression = bf16, communicator");
  }
  for (size_t n = 0; n < options.network_gbps.size(); ++n) {
    std::ostringstream gbps;
    gbps << options.network_gbps[n];
    for (size_t i = 0; i < options.bucket_caps.size(); ++i) {
      const Contender& run = *on_network[n][i];
      const SimulatedNetwork& network = *run.network;
      const std::vector<int64_t> bytes_per_bucket = bucket_bytes(run);
      double network_s = 0;
      for (int64_t bytes : bytes_per_bucket) network_s += network.seconds_for(bytes);
      const double last_s = network.seconds_for(bytes_per_bucket.back());
      std::ostringstream cap;
      cap << options.bucket_caps[i];
      std::string key = "network_" + gbps.str() + "gbps_bucket_" + cap.str() + "mib";
      results.add(key + "_step_ms", run.best * 1e3, "ms",
                  std::to_string(bytes_per_bucket.size()) + " buckets");
      results.add(key + "_network_ms", network_s * 1e3, "ms", "alpha + bytes/beta, summed");
      results.add(key + "_hidden", 1.0 - network.blocked_seconds / network.busy_seconds, "fraction",
                  "of network time not waited for (target >= 0.7)");
      results.add(key + "_exposed_ms", (run.best - no_comm.best) * 1e3, "ms", "ddp - no-comm");
      results.add(key + "_hidden_ceiling", 1.0 - last_s / network_s, "fraction",
                  "the last bucket (" + std::to_string(bytes_per_bucket.back() >> 10) +
                      " KiB) starts after backward");
    }
  }
  results.add("ddp_overhead_vs_local", no_comm.best / local.best, "x", "no-comm / local");
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
