// The bucket transports' ReduceScatter and AllGather (launch/ddp/bucket_transport.h), and
// ZeRO-1 (launch/ddp/zero_redundancy.h) under mpirun (np 1, 2 and 4) against plain DDP, over
// every transport: shared memory on one node, the communicator (shared_memory off) and the
// hierarchical one on simulated nodes (np 4 as 2 x 2 and 4 x 1, np 2 as 2 x 1). Each case takes
// 20 steps of two micro-batches (the first under no_sync) with gradient clipping, with SGD
// (momentum, weight decay on one group only) and with AdamW, and compares the parameters and the
// gathered optimizer state with plain DDP's to 1e-6; then the plain state is loaded into a fresh
// ZeRO-1 optimizer and must come back out unchanged.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../tensor_difference.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/linalg.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/launch/ddp/distributed_data_parallel.h"
#include "mpigrad/launch/ddp/transport_choice.h"
#include "mpigrad/launch/ddp/zero_redundancy.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/nn/optim/adam.h"
#include "mpigrad/nn/optim/clip_grad.h"
#include "mpigrad/nn/optim/sgd.h"
#include "transport_expectation.h"

using namespace mpigrad;
using core::Tensor;
using launch::DdpOptions;
using launch::DistributedDataParallel;
using launch::NamedTensor;
using launch::ZeroRedundancyOptimizer;

namespace {

// A two-layer MLP as plain tensors, with sizes that no shard boundary respects.
struct Net {
  std::vector<NamedTensor> parameters;
  explicit Net(uint64_t seed) {
    core::Generator generator(seed);
    auto make = [&](const char* name, core::Shape shape) {
      parameters.push_back({name, (core::randn(shape, generator) * 0.3).set_requires_grad()});
    };
    make("fc1.weight", {37, 9});
    make("fc1.bias", {37});
    make("fc2.weight", {5, 37});
    make("fc2.bias", {5});
  }
  Tensor& p(size_t i) { return parameters[i].tensor; }
  Tensor forward(const Tensor& x) {
    Tensor h = core::relu(core::matmul(x, p(0).t()) + p(1));
    return core::matmul(h, p(2).t()) + p(3);
  }
  // Weights decay, biases do not: two groups, so the pieces must follow each group.
  std::vector<nn::ParamGroupSpec> groups() {
    return {{{p(0), p(2)}, {}, {}, {}}, {{p(1), p(3)}, {}, 0.0, {}}};
  }
};

Tensor mse(const Tensor& prediction, const Tensor& target) {
  Tensor diff = prediction - target;
  return core::mean(diff * diff);
}

std::unique_ptr<nn::Optimizer> make_optimizer(const std::string& kind, Net& net) {
  if (kind == "sgd") {
    nn::SGDOptions options;
    options.lr = 0.05;
    options.momentum = 0.9;
    options.weight_decay = 1e-3;
    return std::make_unique<nn::SGD>(net.groups(), options);
  }
  nn::AdamOptions options = nn::AdamW::default_options();
  options.lr = 0.01;
  return std::make_unique<nn::AdamW>(net.groups(), options);
}

void check_same_state(const nn::StateDict& got, const nn::StateDict& expected) {
  REQUIRE(got.size() == expected.size());
  for (const auto& [key, tensor] : expected.tensors()) {
    INFO(key);
    REQUIRE(got.find(key) != nullptr);
    CHECK(got.find(key)->shape() == tensor.shape());
    CHECK(test::max_difference(*got.find(key), tensor) <= 1e-6);
  }
  for (const auto& [key, value] : expected.scalars()) {
    INFO(key);
    REQUIRE(got.find_scalar(key) != nullptr);
    CHECK(*got.find_scalar(key) == doctest::Approx(value));
  }
}

}  // namespace

TEST_CASE("ZeRO-1 equals plain DDP after 20 steps with no_sync and clipping, on every transport") {
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  const int ranks = world.size(), rank = world.rank();
  const int64_t micro = 3;
  for (const std::string kind : {"sgd", "adamw"}) {
    for (auto [nodes, shared_memory] : test::transport_cases(ranks)) {
      INFO(kind << ", simulated nodes " << nodes << ", shared_memory " << shared_memory);
      test::SimulatedNodes simulated(nodes);
      Net plain(7), sharded(7);
      DdpOptions options;
      options.shared_memory = shared_memory;
      options.first_bucket_cap_mb = 0.0002;  // several buckets, cut inside parameters
      options.bucket_cap_mb = 0.001;
      DistributedDataParallel plain_ddp(plain.parameters, {}, world, options);
      options.zero = true;
      DistributedDataParallel zero_ddp(sharded.parameters, {}, world, options);
      INFO(zero_ddp.transport_description());
      CHECK(zero_ddp.transport_kind() == test::expected_transport(nodes, ranks, shared_memory));
      CHECK(zero_ddp.bucket_count() >= 2);
      auto plain_optimizer = make_optimizer(kind, plain);
      auto inner = make_optimizer(kind, sharded);
      ZeroRedundancyOptimizer zero(zero_ddp, *inner);
      double plain_norm = 0, zero_norm = 0;
      for (int step = 0; step < 20; ++step) {
        core::Generator generator(500 + uint64_t(step) * 10 + uint64_t(rank));
        for (int m = 0; m < 2; ++m) {
          Tensor x = core::randn({micro, 9}, generator), y = core::randn({micro, 5}, generator);
          plain_ddp.prepare_for_backward();
          zero_ddp.prepare_for_backward();
          if (m == 0) {
            auto a = plain_ddp.no_sync();
            auto b = zero_ddp.no_sync();
            (mse(plain.forward(x), y) * 0.5).backward();
            (mse(sharded.forward(x), y) * 0.5).backward();
          } else {
            (mse(plain.forward(x), y) * 0.5).backward();
            (mse(sharded.forward(x), y) * 0.5).backward();
          }
        }
        plain_norm = nn::clip_grad_norm_({plain.p(0), plain.p(1), plain.p(2), plain.p(3)}, 0.5);
        zero_norm = zero.clip_grad_norm(0.5);
        // Across more than two nodes MPI's reduce-scatter may add in another order than its
        // all-reduce: the gradients, and so the norm, agree to float32 rounding.
        CHECK(zero_norm == doctest::Approx(plain_norm).epsilon(1e-6));
        plain_optimizer->step();
        plain_optimizer->zero_grad();
        zero.step();
      }
      for (size_t i = 0; i < plain.parameters.size(); ++i) {
        INFO(plain.parameters[i].name);
        CHECK(test::max_difference(sharded.p(i), plain.p(i)) <= 1e-6);
      }
      // The reduce-scatters overlap backward as the all-reduces do: the buckets other than the
      // last (fc1's, which backward reaches last) started before backward's end.
      CHECK(zero_ddp.buckets_started_during_backward() >= zero_ddp.bucket_count() - 1);
      // The optimizer's own state stays empty; the shards hold it.
      CHECK(inner->state_dict().tensors().empty());
      CHECK(zero.state_bytes() > 0);
      const nn::StateDict gathered = zero.state_dict();
      check_same_state(gathered, plain_optimizer->state_dict());
      // A plain state loads into a fresh ZeRO-1 optimizer, each rank taking its shard.
      auto other = make_optimizer(kind, sharded);
      ZeroRedundancyOptimizer reloaded(zero_ddp, *other);
      reloaded.load_state_dict(plain_optimizer->state_dict());
      check_same_state(reloaded.state_dict(), plain_optimizer->state_dict());
      // Each rank holds about 1/ranks of the state.
      const nn::StateDict full = plain_optimizer->state_dict();
      int64_t total = 0;
      for (const auto& entry : full.tensors()) total += entry.second.numel() * 4;
      CHECK(zero.state_bytes() <= total / ranks + 2 * 64 * int64_t(zero_ddp.bucket_count()) * 2);
    }
  }
}

TEST_CASE("ZeRO-1 with compression across nodes: each rank's shard is DDP's compressed average") {
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  const int ranks = world.size(), rank = world.rank();
  for (int nodes : test::node_layouts(ranks)) {
    if (test::layout_nodes(nodes) < 2) continue;
    for (auto compression : {launch::GradCompression::BFloat16, launch::GradCompression::Float16}) {
      INFO("simulated nodes " << nodes << ", compression " << int(compression));
      test::SimulatedNodes simulated(nodes);
      Net plain(7), sharded(7);
      DdpOptions options;
      options.compression = compression;
      options.first_bucket_cap_mb = 0.0002;
      options.bucket_cap_mb = 0.001;
      DistributedDataParallel plain_ddp(plain.parameters, {}, world, options);
      options.zero = true;
      DistributedDataParallel zero_ddp(sharded.parameters, {}, world, options);
      INFO(zero_ddp.transport_description());
      CHECK(zero_ddp.transport_kind() == launch::TransportKind::Hierarchical);
      CHECK(plain_ddp.transport_kind() == launch::TransportKind::Hierarchical);
      REQUIRE(zero_ddp.bucket_count() == plain_ddp.bucket_count());
      core::Generator generator(900 + uint64_t(rank));
      Tensor x = core::randn({3, 9}, generator), y = core::randn({3, 5}, generator);
      plain_ddp.prepare_for_backward();
      zero_ddp.prepare_for_backward();
      mse(plain.forward(x), y).backward();
      mse(sharded.forward(x), y).backward();
      const double u = compression == launch::GradCompression::BFloat16 ? 0x1p-8 : 0x1p-11;
      for (int b = 0; b < zero_ddp.bucket_count(); ++b) {
        INFO("bucket " << b);
        const Tensor& averaged = plain_ddp.bucket_buffer(size_t(b));
        const auto [first, last] = zero_ddp.transport().shard(size_t(b), rank);
        const int64_t end = std::min(last, averaged.numel());
        if (first >= end) continue;
        const Tensor mine = zero_ddp.bucket_buffer(size_t(b)).narrow(0, first, end - first);
        const Tensor expected = averaged.narrow(0, first, end - first);
        if (test::layout_nodes(nodes) == 2) {
          // Two nodes: the same node sums, rounded alike, added once in 16 bits either way.
          CHECK(mine.to_vector<float>() == expected.to_vector<float>());
        } else {
          // More nodes: MPI's reduce-scatter may add in another order than its all-reduce.
          const double scale = core::max(core::abs(averaged)).item<double>();
          CHECK(test::max_difference(mine, expected) <= 2 * (ranks + 1) * u * scale + 1e-7);
        }
      }
    }
  }
}

TEST_CASE("ZeRO-1 refuses a DDP built without zero, on every rank") {
  auto manager = launch::DistributedManager::initialize();
  Net net(3);
  DdpOptions options;
  DistributedDataParallel ddp(net.parameters, {}, manager.world(), options);
  auto optimizer = make_optimizer("sgd", net);
  CHECK_THROWS_WITH_AS(ZeroRedundancyOptimizer(ddp, *optimizer),
                       doctest::Contains("built without DdpOptions::zero"), core::Error);
}

TEST_CASE("uneven inputs (join_backward) are refused under ZeRO-1, on every rank") {
  auto manager = launch::DistributedManager::initialize();
  Net net(3);
  DdpOptions options;
  options.zero = true;
  DistributedDataParallel ddp(net.parameters, {}, manager.world(), options);
  CHECK_THROWS_WITH_AS(ddp.join_backward(), doctest::Contains("not supported with zero = 1"),
                       core::Error);
}

TEST_CASE("every transport reduce-scatters and all-gathers by the shards it names") {
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  const int ranks = world.size(), rank = world.rank();
  const std::vector<launch::BucketSpec> specs = {{core::kFloat32, core::kCPU, 1000},
                                                 {core::kFloat32, core::kCPU, 37},
                                                 {core::kFloat64, core::kCPU, 5}};
  for (auto [nodes, shared_memory] : test::transport_cases(ranks)) {
    INFO("simulated nodes " << nodes << ", shared_memory " << shared_memory);
    test::SimulatedNodes simulated(nodes);
    launch::TransportRequest request;
    request.shared_memory = shared_memory;
    launch::TransportChoice choice = launch::choose_bucket_transport(world, specs, request);
    CHECK(choice.kind == test::expected_transport(nodes, ranks, shared_memory));
    launch::BucketTransport& transport = *choice.transport;
    for (size_t b = 0; b < specs.size(); ++b) {
      const int64_t numel = specs[b].numel;
      // The shards cover the bucket once: contiguous, in some order of the ranks.
      std::vector<std::pair<int64_t, int64_t>> shards;
      for (int r = 0; r < ranks; ++r) shards.push_back(transport.shard(b, r));
      std::sort(shards.begin(), shards.end());
      int64_t covered = 0;
      for (const auto& [first, last] : shards) {
        CHECK(first == covered);
        CHECK(last >= first);
        covered = last;
      }
      CHECK(covered >= numel);
      CHECK(covered <= transport.buffer(b).numel());
    }
    for (int round = 0; round < 2; ++round) {  // twice: the rounds follow each other
      core::NoGradGuard no_grad;
      for (size_t b = 0; b < specs.size(); ++b) {
        std::vector<double> mine(size_t(specs[b].numel));
        for (size_t i = 0; i < mine.size(); ++i) mine[i] = double((rank + 1) * int(i + 1) + round);
        transport.buffer(b)
            .narrow(0, 0, specs[b].numel)
            .copy_(Tensor::from_vector<double>(mine, {specs[b].numel}));
      }
      for (size_t b = 0; b < specs.size(); ++b) {
        transport.start(b, launch::BucketCollective::ReduceScatter);
      }
      for (size_t b = 0; b < specs.size(); ++b) transport.wait(b);
      for (size_t b = 0; b < specs.size(); ++b) {
        auto [first, last] = transport.shard(b, rank);
        last = std::min(last, specs[b].numel);
        const std::vector<double> got = transport.buffer(b).to(core::kFloat64).to_vector<double>();
        for (int64_t i = first; i < last; ++i) {
          const double average = double(ranks + 1) / 2.0 * double(i + 1) + round;
          CHECK(got[size_t(i)] == doctest::Approx(average).epsilon(1e-12));
        }
      }
      // Each rank writes its own shard; the all-gather brings every shard everywhere.
      for (size_t b = 0; b < specs.size(); ++b) {
        auto [first, last] = transport.shard(b, rank);
        last = std::min(last, specs[b].numel);
        if (first >= last) continue;
        std::vector<double> values;
        for (int64_t i = first; i < last; ++i) values.push_back(1000.0 * rank + double(i));
        transport.buffer(b)
            .narrow(0, first, last - first)
            .copy_(Tensor::from_vector<double>(values, {last - first}));
      }
      for (size_t b = 0; b < specs.size(); ++b) {
        transport.start(b, launch::BucketCollective::AllGather);
        transport.progress();
      }
      for (size_t b = 0; b < specs.size(); ++b) {
        transport.wait(b);
        const std::vector<double> got = transport.buffer(b).to(core::kFloat64).to_vector<double>();
        for (int r = 0; r < ranks; ++r) {
          auto [first, last] = transport.shard(b, r);
          for (int64_t i = first; i < std::min(last, specs[b].numel); ++i) {
            CHECK(got[size_t(i)] == 1000.0 * r + double(i));
          }
        }
      }
    }
  }
}
