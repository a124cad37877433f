// DistributedDataParallel under mpirun (np 1, 2 and 4): equivalence with one process, gradient
// accumulation with no_sync, overlap of all-reduce with backward, errors, compression, uneven
// inputs and the rebuilt buckets, over every transport: shared memory on one node, the
// hierarchical one on simulated nodes (np 4 as 2 nodes x 2 ranks and as 4 x 1, np 2 as 2 x 1),
// and the communicator's all-reduce. Every rank can compute the single-process reference itself,
// because the whole global batch is generated from a seed every rank shares.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "../simulated_nodes.h"
#include "../tensor_difference.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/linalg.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/launch/ddp/distributed_data_parallel.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "recording_communicator.h"
#include "transport_expectation.h"

using namespace mpigrad;
using core::Tensor;
using launch::DdpOptions;
using launch::DistributedDataParallel;
using launch::NamedTensor;
using mpigrad::testing::RecordingCommunicator;

namespace {

// A two-layer MLP as plain tensors: fc1 [16, 8], fc2 [4, 16], like torch.nn.Linear layouts.
struct Mlp {
  std::vector<NamedTensor> parameters;
  explicit Mlp(uint64_t seed, int64_t hidden = 16) {
    core::Generator generator(seed);
    auto make = [&](const char* name, core::Shape shape) {
      parameters.push_back({name, (core::randn(shape, generator) * 0.3).set_requires_grad()});
    };
    make("fc1.weight", {hidden, 8});
    make("fc1.bias", {hidden});
    make("fc2.weight", {4, hidden});
    make("fc2.bias", {4});
  }
  Tensor& p(size_t i) { return parameters[i].tensor; }
  Tensor forward(const Tensor& x) {
    Tensor h = core::relu(core::matmul(x, p(0).t()) + p(1));
    return core::matmul(h, p(2).t()) + p(3);
  }
  void sgd_step(double lr) {
    core::NoGradGuard no_grad;
    for (auto& [name, param] : parameters) {
      param.sub_(core::mul(param.grad(), core::scalar_like(lr, param)));
      param.grad().zero_();
    }
  }
};

Tensor mse(const Tensor& prediction, const Tensor& target) {
  Tensor diff = prediction - target;
  return core::mean(diff * diff);
}

// The global batch of step `step`: inputs [n, 8] and targets [n, 4], identical on every rank.
std::pair<Tensor, Tensor> global_batch(int step, int64_t n) {
  core::Generator generator(1000 + uint64_t(step));
  return {core::randn({n, 8}, generator), core::randn({n, 4}, generator)};
}

void check_close(const Tensor& a, const Tensor& b, double tolerance) {
  CHECK(mpigrad::test::max_difference(a, b) <= tolerance);
}

}  // namespace

TEST_CASE("DDP over R ranks with batch B equals one process with batch R*B after 5 SGD steps") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  const int ranks = world.size(), rank = world.rank();
  const int64_t per_rank = 6;
  for (auto [nodes, shared_memory] : test::transport_cases(ranks)) {
    INFO("simulated nodes " << nodes << ", shared_memory " << shared_memory);
    test::SimulatedNodes simulated(nodes);
    // Rank 0's seed wins: DDP broadcasts rank 0's initial parameters to everyone.
    Mlp distributed(rank == 0 ? 7 : 99), reference(7);
    DdpOptions options;
    options.shared_memory = shared_memory;
    options.first_bucket_cap_mb = 0.0002;  // a bucket for each parameter or two
    options.bucket_cap_mb = 0.0002;
    DistributedDataParallel ddp(distributed.parameters, {}, world, options);
    INFO(ddp.transport_description());
    CHECK(ddp.transport_kind() == test::expected_transport(nodes, ranks, shared_memory));
    CHECK(ddp.bucket_count() >= 3);
    for (int step = 0; step < 5; ++step) {
      auto [x, y] = global_batch(step, per_rank * ranks);
      ddp.prepare_for_backward();
      mse(distributed.forward(x.narrow(0, rank * per_rank, per_rank)),
          y.narrow(0, rank * per_rank, per_rank))
          .backward();
      distributed.sgd_step(0.1);
      mse(reference.forward(x), y).backward();
      reference.sgd_step(0.1);
    }
    for (size_t i = 0; i < reference.parameters.size(); ++i) {
      INFO(reference.parameters[i].name);
      check_close(distributed.p(i), reference.p(i), 1e-5);
    }
  }
}

TEST_CASE(
    "no_sync over k micro-steps equals one large-batch step, with a parameter unused in some") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  const int ranks = world.size(), rank = world.rank();
  const int64_t per_rank = 8, micro_steps = 4, micro = per_rank / micro_steps;
  for (auto [nodes, shared_memory] : test::transport_cases(ranks)) {
    INFO("simulated nodes " << nodes << ", shared_memory " << shared_memory);
    test::SimulatedNodes simulated(nodes);
    Mlp distributed(11), reference(11);
    // An extra parameter used only in the second micro-step.
    Tensor extra_d = core::ones({4}).set_requires_grad();
    Tensor extra_r = core::ones({4}).set_requires_grad();
    distributed.parameters.push_back({"extra", extra_d});
    DdpOptions options;
    options.find_unused_parameters = true;
    options.shared_memory = shared_memory;
    options.first_bucket_cap_mb = 0.0002;
    options.bucket_cap_mb = 0.0002;
    DistributedDataParallel ddp(distributed.parameters, {}, world, options);
    CHECK(ddp.transport_kind() == test::expected_transport(nodes, ranks, shared_memory));

    auto [x, y] = global_batch(0, per_rank * ranks);
    for (int64_t k = 0; k < micro_steps; ++k) {
      Tensor xs = x.narrow(0, rank * per_rank + k * micro, micro);
      Tensor ys = y.narrow(0, rank * per_rank + k * micro, micro);
      ddp.prepare_for_backward();
      Tensor out = distributed.forward(xs);
      if (k == 1) out = out * extra_d;
      Tensor loss = core::mul(mse(out, ys), core::scalar_like(1.0 / double(micro_steps), out));
      if (k + 1 < micro_steps) {
        auto guard = ddp.no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
    }
    // Reference: the same micro-batches of every rank, in one process, averaged.
    for (int r = 0; r < ranks; ++r) {
      for (int64_t k = 0; k < micro_steps; ++k) {
        Tensor out = reference.forward(x.narrow(0, r * per_rank + k * micro, micro));
        if (k == 1) out = out * extra_r;
        core::mul(mse(out, y.narrow(0, r * per_rank + k * micro, micro)),
                  core::scalar_like(1.0 / double(micro_steps * ranks), out))
            .backward();
      }
    }
    for (size_t i = 0; i < reference.parameters.size(); ++i) {
      INFO(reference.parameters[i].name);
      check_close(distributed.p(i).grad(), reference.p(i).grad(), 1e-5);
    }
    check_close(extra_d.grad(), extra_r.grad(), 1e-5);
  }
}

TEST_CASE("a bucket's all-reduce starts before backward reaches the first layer") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  std::vector<std::string> log;
  RecordingCommunicator recording(world, log);
  Mlp model(3, 256);
  DdpOptions options;
  options.first_bucket_cap_mb = 0.001;  // every parameter in its own bucket
  options.bucket_cap_mb = 0.001;
  options.shared_memory = false;  // this test watches the communicator's all-reduces
  DistributedDataParallel ddp(model.parameters, {}, recording, options);
  CHECK(ddp.bucket_count() == 4);
  CHECK(ddp.bucket_layout()[0] == std::vector<std::string>{"fc2.bias"});
  // fc1.weight's gradient is the last one backward produces.
  model.p(0).register_grad_ready_hook([&](Tensor&) { log.push_back("fc1.weight ready"); });
  log.clear();
  auto [x, y] = global_batch(0, 16);
  ddp.prepare_for_backward();
  mse(model.forward(x), y).backward();
  auto first_param = std::find(log.begin(), log.end(), "fc1.weight ready");
  REQUIRE(first_param != log.end());
  CHECK(std::count(log.begin(), first_param, "all_reduce started") >= 1);
  CHECK(std::count(log.begin(), log.end(), "all_reduce started") == 4);
}

TEST_CASE("shared-memory and hierarchical buckets start averaging before backward ends") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  if (world.size() == 1) return;
  for (int nodes : test::node_layouts(world.size())) {
    INFO("simulated nodes " << nodes);
    test::SimulatedNodes simulated(nodes);
    Mlp model(3, 256);
    DdpOptions options;
    options.first_bucket_cap_mb = 0.001;  // every parameter in its own bucket
    options.bucket_cap_mb = 0.001;
    DistributedDataParallel ddp(model.parameters, {}, world, options);
    INFO(ddp.transport_description());
    REQUIRE(ddp.transport_kind() == test::expected_transport(nodes, world.size()));
    auto [x, y] = global_batch(0, 16);
    ddp.prepare_for_backward();
    mse(model.forward(x), y).backward();
    // Buckets 0-2 started from the hooks of fc2.bias, fc2.weight and fc1.bias; bucket 3
    // (fc1.weight, the last gradient) from the same hook that ends backward's gradients.
    CHECK(ddp.buckets_started_during_backward() == 4);
  }
}

TEST_CASE("buckets are rebuilt once, in the order rank 0's gradients became ready") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  const int ranks = world.size(), rank = world.rank();
  for (auto [nodes, shared_memory] : test::transport_cases(ranks)) {
    INFO("simulated nodes " << nodes << ", shared_memory " << shared_memory);
    test::SimulatedNodes simulated(nodes);
    // fc1 listed before fc2 in reverse: the initial buckets (reverse registration order) begin
    // with fc1, whose gradients backward produces last, so no bucket can start early.
    Mlp model(rank == 0 ? 8 : 80, 64), reference(8, 64);
    auto listed = [](Mlp& mlp) {
      auto& p = mlp.parameters;
      return std::vector<NamedTensor>{p[2], p[3], p[0], p[1]};
    };
    std::vector<std::string> log;
    RecordingCommunicator recording(world, log);
    DdpOptions options;
    options.shared_memory = shared_memory;
    options.first_bucket_cap_mb = 0.0001;  // every parameter in its own bucket
    options.bucket_cap_mb = 0.0001;
    DistributedDataParallel ddp(listed(model), {}, shared_memory ? world : recording, options);
    REQUIRE(ddp.bucket_layout()[0] == std::vector<std::string>{"fc1.bias"});
    model.p(0).register_grad_ready_hook([&log](Tensor&) { log.push_back("fc1 ready"); });
    model.p(1).register_grad_ready_hook([&log](Tensor&) { log.push_back("fc1 ready"); });
    std::vector<int> early_starts;  // all-reduces started before fc1's first gradient, per step
    for (int step = 0; step < 3; ++step) {
      log.clear();
      auto [x, y] = global_batch(step, 4 * ranks);
      ddp.prepare_for_backward();
      mse(model.forward(x.narrow(0, rank * 4, 4)), y.narrow(0, rank * 4, 4)).backward();
      early_starts.push_back(int(std::count(
          log.begin(), std::find(log.begin(), log.end(), "fc1 ready"), "all_reduce started")));
      CHECK(ddp.buckets_rebuilt());
      model.sgd_step(0.1);
      mse(reference.forward(x), y).backward();
      reference.sgd_step(0.1);
    }
    // fc2's gradients come first: after the rebuild they lead the buckets, on every rank alike.
    auto layout = ddp.bucket_layout();
    CHECK(layout[0][0].starts_with("fc2."));
    CHECK(layout[1][0].starts_with("fc2."));
    std::string flat;
    for (auto& bucket : layout) flat += bucket[0] + ";";
    Tensor mine = Tensor::from_vector<uint8_t>(std::vector<uint8_t>(flat.begin(), flat.end()),
                                               {int64_t(flat.size())});
    Tensor rank0 = mine.clone();
    world.broadcast(rank0, 0);
    check_close(mine, rank0, 0.0);
    if (!shared_memory) {
      CHECK(early_starts[0] <= 1);  // before: fc1.bias leads, nothing starts before fc1
      CHECK(early_starts[2] >= 2);  // after: both fc2 buckets start while fc1 is computed
    }
    for (size_t i = 0; i < reference.parameters.size(); ++i) {
      INFO(reference.parameters[i].name);
      check_close(model.p(i), reference.p(i), 1e-5);
    }
  }
}

TEST_CASE("with find_unused_parameters the buckets keep their first layout") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  Mlp model(8);
  DdpOptions options;
  options.find_unused_parameters = true;
  options.first_bucket_cap_mb = 0.0001;
  options.bucket_cap_mb = 0.0001;
  std::vector<NamedTensor> listed{model.parameters[2], model.parameters[3], model.parameters[0],
                                  model.parameters[1]};
  DistributedDataParallel ddp(listed, {}, world, options);
  auto before = ddp.bucket_layout();
  for (int step = 0; step < 2; ++step) {
    auto [x, y] = global_batch(step, 4);
    ddp.prepare_for_backward();
    mse(model.forward(x), y).backward();
  }
  CHECK_FALSE(ddp.buckets_rebuilt());
  CHECK(ddp.bucket_layout() == before);
}

TEST_CASE("a model that differs between ranks is a clear error on every rank") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  Mlp model(5, world.rank() == 1 ? 12 : 16);
  std::string message;
  try {
    DistributedDataParallel ddp(model.parameters, {}, world);
  } catch (const core::Error& error) {
    message = error.what();
  }
  if (world.size() == 1) {
    CHECK(message.empty());
  } else {
    CHECK(message.find("differs between ranks") != std::string::npos);
    CHECK(message.find("fc1.weight") != std::string::npos);
    CHECK(message.find("rank 1") != std::string::npos);
  }
}

TEST_CASE("a parameter without gradient is an error naming it, unless find_unused_parameters") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  Mlp model(5);
  Tensor unused = core::ones({3}).set_requires_grad();
  model.parameters.push_back({"head.unused", unused});
  DistributedDataParallel ddp(model.parameters, {}, world);
  auto [x, y] = global_batch(0, 4);
  ddp.prepare_for_backward();
  std::string message;
  try {
    mse(model.forward(x), y).backward();
  } catch (const core::Error& error) {
    message = error.what();
  }
  CHECK(message.find("head.unused") != std::string::npos);
  CHECK(message.find("find_unused_parameters") != std::string::npos);
}

TEST_CASE("after an unused-parameter error with buckets in flight, the next step averages right") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  std::vector<std::vector<double>> grads;  // every case's, compared with the first
  for (auto [nodes, shared_memory] : test::transport_cases(world.size())) {
    INFO("simulated nodes " << nodes << ", shared_memory " << shared_memory);
    test::SimulatedNodes simulated(nodes);
    Mlp model(5);
    // Registered first, so it lands in the last bucket: the other buckets are in flight when
    // backward finds it unused.
    Tensor gate = core::ones({4}).set_requires_grad();
    model.parameters.insert(model.parameters.begin(), {"head.gate", gate});
    DdpOptions options;
    options.shared_memory = shared_memory;
    options.first_bucket_cap_mb = 0.0001;
    options.bucket_cap_mb = 0.0001;
    DistributedDataParallel ddp(model.parameters, {}, world, options);
    REQUIRE(ddp.bucket_layout().back() == std::vector<std::string>{"head.gate"});
    auto [x, y] = global_batch(world.rank(), 4);
    auto mlp = [&, x = x] {  // fc1 and fc2 are parameters 1-4 now
      Tensor hidden = core::relu(core::matmul(x, model.p(1).t()) + model.p(2));
      return core::matmul(hidden, model.p(3).t()) + model.p(4);
    };
    ddp.prepare_for_backward();
    std::string message;
    try {
      mse(mlp(), y).backward();
    } catch (const core::Error& error) {
      message = error.what();
    }
    CHECK(message.find("head.gate") != std::string::npos);
    // The same DDP carries on: zeroed gradients, every parameter used, a correct average.
    for (auto& [name, param] : model.parameters) param.grad().zero_();
    ddp.prepare_for_backward();
    mse(mlp() * gate, y).backward();
    std::vector<double> all;
    for (auto& [name, param] : model.parameters) {
      std::vector<double> values = param.grad().to_vector<double>();
      Tensor ranks0 = param.grad().clone();
      world.broadcast(ranks0, 0);
      INFO(name);
      check_close(param.grad(), ranks0, 0.0);  // every rank holds the same average
      all.insert(all.end(), values.begin(), values.end());
    }
    grads.push_back(all);
    const int64_t count = int64_t(all.size());
    check_close(Tensor::from_vector<double>(grads[0], {count}),
                Tensor::from_vector<double>(all, {count}), 1e-6);
  }
}

TEST_CASE("DDP options that differ between ranks are a clear error on every rank") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  if (world.size() == 1) return;
  Mlp model(5);
  DdpOptions options;
  options.shared_memory = world.rank() != 1;  // would make rank 1 skip create()'s collectives
  std::string message;
  try {
    DistributedDataParallel ddp(model.parameters, {}, world, options);
  } catch (const core::Error& error) {
    message = error.what();
  }
  CHECK(message.find("the DDP options differ between ranks") != std::string::npos);
  CHECK(message.find("shared_memory=0 transport=auto zero=0 carry_found_inf=0' on rank 1") !=
        std::string::npos);
}

TEST_CASE("bf16 gradient compression stays close to the uncompressed average") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  Mlp exact(21), compressed(21);
  DdpOptions options;
  options.compression = launch::GradCompression::BFloat16;
  DistributedDataParallel ddp_exact(exact.parameters, {}, world);
  DistributedDataParallel ddp_compressed(compressed.parameters, {}, world, options);
  auto [x, y] = global_batch(world.rank(), 8);
  ddp_exact.prepare_for_backward();
  mse(exact.forward(x), y).backward();
  ddp_compressed.prepare_for_backward();
  mse(compressed.forward(x), y).backward();
  for (size_t i = 0; i < exact.parameters.size(); ++i) {
    INFO(exact.parameters[i].name);
    Tensor reference = exact.p(i).grad();
    double scale = core::max(core::abs(reference)).item<double>();
    check_close(compressed.p(i).grad(), reference, 1e-2 * scale + 1e-6);
  }
}

TEST_CASE(
    "compression across nodes: hierarchical equals the communicator within the wire's rounding") {
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  const int ranks = world.size();
  for (int nodes : test::node_layouts(ranks)) {
    if (test::layout_nodes(nodes) < 2) continue;
    const bool one_rank_a_node = test::layout_nodes(nodes) == ranks;
    for (auto compression : {launch::GradCompression::BFloat16, launch::GradCompression::Float16}) {
      INFO("simulated nodes " << nodes << ", compression " << int(compression));
      test::SimulatedNodes simulated(nodes);
      Mlp exact(21, 64), hierarchical(21, 64), flat(21, 64), local(21, 64);
      DdpOptions options;
      options.compression = compression;
      DdpOptions flat_options = options;
      flat_options.transport = launch::TransportKind::Communicator;
      DistributedDataParallel ddp_exact(exact.parameters, {}, world);
      DistributedDataParallel ddp_hierarchical(hierarchical.parameters, {}, world, options);
      DistributedDataParallel ddp_flat(flat.parameters, {}, world, flat_options);
      INFO(ddp_hierarchical.transport_description());
      CHECK(ddp_hierarchical.transport_kind() == launch::TransportKind::Hierarchical);
      const std::string wire =
          compression == launch::GradCompression::BFloat16 ? "bfloat16" : "float16";
      CHECK(ddp_hierarchical.transport_description().find(" in " + wire + " (compression)") !=
            std::string::npos);
      CHECK(ddp_flat.transport_kind() == launch::TransportKind::Communicator);
      auto [x, y] = global_batch(world.rank(), 8);
      for (auto [model, ddp] :
           {std::pair{&exact, &ddp_exact}, std::pair{&hierarchical, &ddp_hierarchical},
            std::pair{&flat, &ddp_flat}}) {
        ddp->prepare_for_backward();
        mse(model->forward(x), y).backward();
      }
      mse(local.forward(x), y).backward();
      // Either path rounds each gradient, or a node's sum, and each partial sum over the nodes
      // once to the wire: at most `ranks` roundings of relative size u (bf16 2^-8, fp16 2^-11)
      // of values no larger than the largest gradient of any rank.
      const double u = compression == launch::GradCompression::BFloat16 ? 0x1p-8 : 0x1p-11;
      for (size_t i = 0; i < exact.parameters.size(); ++i) {
        INFO(exact.parameters[i].name);
        Tensor largest = core::max(core::abs(local.p(i).grad())).reshape({1});
        world.all_reduce(largest, launch::ReduceOp::Max);
        const double tolerance = (ranks + 1) * u * largest.item<float>() + 1e-7;
        check_close(hierarchical.p(i).grad(), exact.p(i).grad(), tolerance);
        check_close(flat.p(i).grad(), exact.p(i).grad(), tolerance);
        if (one_rank_a_node) {
          // The same 16-bit values summed by the same MPI algorithm, scaled by a power of two.
          CHECK(hierarchical.p(i).grad().to_vector<float>() == flat.p(i).grad().to_vector<float>());
        } else {
          check_close(hierarchical.p(i).grad(), flat.p(i).grad(), 2 * tolerance);
        }
      }
    }
  }
}

TEST_CASE("uneven inputs: ranks with fewer batches join until everyone is done") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  const int rank = world.rank();
  for (auto [nodes, shared_memory] : test::transport_cases(world.size())) {
    INFO("simulated nodes " << nodes << ", shared_memory " << shared_memory);
    test::SimulatedNodes simulated(nodes);
    Mlp model(31);
    DdpOptions options;
    options.shared_memory = shared_memory;
    options.first_bucket_cap_mb = 0.0002;
    options.bucket_cap_mb = 0.0002;
    DistributedDataParallel ddp(model.parameters, {}, world, options);
    CHECK(ddp.transport_kind() == test::expected_transport(nodes, world.size(), shared_memory));
    const int my_batches = 2 + rank;  // rank r has r more batches than rank 0
    int step = 0;
    while (true) {
      bool has_batch = step < my_batches;
      if (ddp.ranks_with_data(has_batch) == 0) break;
      if (has_batch) {
        auto [x, y] = global_batch(100 * rank + step, 4);
        ddp.prepare_for_backward();
        mse(model.forward(x), y).backward();
      } else {
        ddp.join_backward();
      }
      model.sgd_step(0.05);
      ++step;
    }
    CHECK(step == 2 + world.size() - 1);
    // Every rank applied the same averaged gradients, so the parameters still agree.
    for (auto& [name, param] : model.parameters) {
      INFO(name);
      Tensor mine = param.detach().clone();
      Tensor ranks0 = param.detach().clone();
      world.broadcast(ranks0, 0);
      check_close(mine, ranks0, 0.0);
    }
  }
}
