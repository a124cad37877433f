// SyncBatchNorm and convert_sync_batchnorm under mpirun (np 1, 2, 4): a CNN trained with DDP over
// R ranks of batch B must match the same CNN with ordinary BatchNorm2d trained in one process on
// batch R*B, parameters and running statistics alike, on every node layout (and so every bucket
// transport, SyncBatchNorm's all-reduces running beside the hierarchical one's thread); the
// backward must give each rank the exact slice of the global-batch input gradient; eval mode
// must not communicate.
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
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/launch/ddp/distributed_data_parallel.h"
#include "mpigrad/launch/ddp/sync_batch_norm.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/batch_norm.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/layers/conv.h"
#include "mpigrad/nn/layers/linear.h"
#include "mpigrad/nn/layers/pooling.h"
#include "mpigrad/nn/loss.h"
#include "mpigrad/nn/optim/sgd.h"
#include "recording_communicator.h"
#include "transport_expectation.h"

using namespace mpigrad;
using core::Tensor;
using mpigrad::test::max_difference;

namespace {

// conv 3x3 -> BatchNorm2d -> relu -> maxpool 2 -> flatten -> linear, on [n, 2, 8, 8] inputs.
std::shared_ptr<nn::Sequential> make_cnn(uint64_t seed) {
  core::Generator generator(seed);
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Conv2d>(2, 4, 3, generator, 1, 1));
  model->push_back(std::make_shared<nn::BatchNorm2d>(4));
  model->push_back(std::make_shared<nn::ReLU>());
  model->push_back(std::make_shared<nn::MaxPool2d>(2));
  model->push_back(std::make_shared<nn::Flatten>());
  model->push_back(std::make_shared<nn::Linear>(4 * 4 * 4, 3, generator));
  model->to(core::kFloat64);
  return model;
}

std::pair<Tensor, Tensor> global_images(int step, int64_t n) {
  core::Generator generator(500 + uint64_t(step));
  Tensor x = core::randn({n, 2, 8, 8}, generator).to(core::kFloat64) * 2.0 + 0.5;
  Tensor y = core::randn({n, 3}, generator).to(core::kFloat64);
  return {x, y};
}

}  // namespace

TEST_CASE("CNN with SyncBatchNorm over R ranks equals BatchNorm2d with batch R*B in one process") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  const int ranks = world.size(), rank = world.rank();
  const int64_t per_rank = 3;
  for (int nodes : test::node_layouts(ranks)) {
    INFO("simulated nodes " << nodes);
    test::SimulatedNodes simulated(nodes);
    // Other ranks start from other weights: DDP must broadcast rank 0's parameters and buffers.
    auto distributed = make_cnn(rank == 0 ? 7 : 70 + uint64_t(rank));
    auto reference = make_cnn(7);
    CHECK(launch::convert_sync_batchnorm(*distributed, world) == 1);
    REQUIRE((*distributed)[1]->type_name() == "SyncBatchNorm");
    launch::DdpOptions options;
    options.first_bucket_cap_mb = 0.0005;  // several buckets
    options.bucket_cap_mb = 0.0005;
    launch::DistributedDataParallel ddp(*distributed, world, options);
    CHECK(ddp.transport_kind() == test::expected_transport(nodes, ranks));
    nn::SGD optimizer_d(distributed->parameters(), {.lr = 0.1, .momentum = 0.9});
    nn::SGD optimizer_r(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
    for (int step = 0; step < 5; ++step) {
      auto [x, y] = global_images(step, per_rank * ranks);
      // zero_grad's default (set_to_none) drops the bucket views; DDP must re-attach them.
      distributed->zero_grad();
      Tensor local = ddp(x.narrow(0, rank * per_rank, per_rank));
      nn::mse_loss(local, y.narrow(0, rank * per_rank, per_rank)).backward();
      optimizer_d.step();

      reference->zero_grad();
      nn::mse_loss((*reference)(x), y).backward();
      optimizer_r.step();
    }
    auto named_d = distributed->named_parameters(), named_r = reference->named_parameters();
    REQUIRE(named_d.size() == named_r.size());
    for (size_t i = 0; i < named_r.size(); ++i) {
      INFO(named_r[i].first);
      CHECK(named_d[i].first == named_r[i].first);
      CHECK(max_difference(named_d[i].second, named_r[i].second) <= 1e-5);
    }
    auto buffers_d = distributed->named_buffers(), buffers_r = reference->named_buffers();
    REQUIRE(buffers_d.size() == 3);
    REQUIRE(buffers_d.size() == buffers_r.size());
    for (size_t i = 0; i < buffers_r.size(); ++i) {
      INFO(buffers_r[i].first);
      CHECK(buffers_d[i].first == buffers_r[i].first);
      CHECK(max_difference(buffers_d[i].second, buffers_r[i].second) <= 1e-5);
    }
    // The running statistics drive eval mode, which must agree too.
    distributed->eval();
    reference->eval();
    auto [x, y] = global_images(99, 4);
    CHECK(max_difference((*distributed)(x), (*reference)(x)) <= 1e-5);
  }
}

TEST_CASE("SyncBatchNorm backward gives each rank its slice of the global input gradient") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  const int ranks = world.size(), rank = world.rank();
  const int64_t per_rank = 2, channels = 3, length = 5;
  core::Generator generator(42);
  Tensor x = core::randn({per_rank * ranks, channels, length}, generator).to(core::kFloat64);
  Tensor upstream = core::randn({per_rank * ranks, channels, length}, generator).to(core::kFloat64);

  nn::BatchNorm1d reference(channels);
  reference.to(core::kFloat64);
  {
    core::NoGradGuard no_grad;
    reference.parameter("weight").copy_(core::randn({channels}, generator));
    reference.parameter("bias").copy_(core::randn({channels}, generator));
  }
  auto sync = launch::SyncBatchNorm::from_batch_norm(reference, world);
  // The same tensors, not copies: an optimizer built on the BatchNorm keeps working.
  CHECK(sync->parameter("weight").is_same(reference.parameter("weight")));

  Tensor x_global = x.detach().clone().set_requires_grad();
  core::sum(reference(x_global) * upstream).backward();
  Tensor grad_weight_reference = reference.parameter("weight").grad().clone();
  Tensor grad_bias_reference = reference.parameter("bias").grad().clone();
  reference.zero_grad();

  Tensor x_local = x.narrow(0, rank * per_rank, per_rank).clone().set_requires_grad();
  core::sum((*sync)(x_local)*upstream.narrow(0, rank * per_rank, per_rank)).backward();
  CHECK(max_difference(x_local.grad(), x_global.grad().narrow(0, rank * per_rank, per_rank)) <=
        1e-10);
  // Weight and bias gradients are local sums: over ranks they add up to the global ones.
  Tensor grad_weight = sync->parameter("weight").grad().clone();
  Tensor grad_bias = sync->parameter("bias").grad().clone();
  world.all_reduce(grad_weight);
  world.all_reduce(grad_bias);
  CHECK(max_difference(grad_weight, grad_weight_reference) <= 1e-10);
  CHECK(max_difference(grad_bias, grad_bias_reference) <= 1e-10);
}

TEST_CASE("SyncBatchNorm communicates once per training forward and never in eval") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  std::vector<std::string> log;
  mpigrad::testing::RecordingCommunicator recording(manager.world(), log);
  nn::BatchNormConfig config;
  config.num_features = 4;
  launch::SyncBatchNorm norm(config, recording);
  core::Generator generator(1);
  Tensor x = core::randn({3, 4, 2, 2}, generator);
  norm(x);
  CHECK(std::count(log.begin(), log.end(), "blocking all_reduce") == 1);
  CHECK(norm.buffer("num_batches_tracked").item<int64_t>() == 1);
  log.clear();
  norm.eval();
  Tensor y = norm(x);
  CHECK(log.empty());
  CHECK(y.shape() == x.shape());
  CHECK(norm.str().find("SyncBatchNorm(4, eps=") != std::string::npos);
}

TEST_CASE("convert_sync_batchnorm swaps every BatchNorm in nested containers, keeping names") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  core::Generator generator(3);
  auto inner = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 4, generator), std::make_shared<nn::BatchNorm1d>(4)});
  nn::Sequential model{std::make_shared<nn::BatchNorm1d>(4), inner, std::make_shared<nn::ReLU>()};
  auto names_before = model.state_dict().size();
  Tensor weight_before = inner->named_parameters()[2].second;  // "1.weight" of the BatchNorm
  model.eval();
  CHECK(launch::convert_sync_batchnorm(model, manager.world()) == 2);
  CHECK(model[0]->type_name() == "SyncBatchNorm");
  CHECK((*inner)[1]->type_name() == "SyncBatchNorm");
  CHECK(!(*inner)[1]->is_training());  // the mode carries over
  CHECK(model.state_dict().size() == names_before);
  CHECK(model.named_parameters()[4].first == "1.1.weight");
  CHECK(model.named_parameters()[4].second.is_same(weight_before));
  CHECK(model.named_buffers()[3].first == "1.1.running_mean");
  CHECK(launch::convert_sync_batchnorm(model, manager.world()) == 0);
}
