// DistributedDataParallel built from an nn::Module (np 1, 2, 4): the parameters that require
// grad and the buffers are taken by dotted name, zero_grad's default set_to_none is survived
// (whether or not the forward goes through DDP) on every node layout, the gradient views are
// kept across steps, fp16 compression stays close, and every transport averages like the
// communicator's all-reduce.
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
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/layers/linear.h"
#include "mpigrad/nn/loss.h"
#include "mpigrad/nn/optim/sgd.h"
#include "transport_expectation.h"

using namespace mpigrad;
using core::Tensor;
using mpigrad::test::max_difference;

namespace {

std::shared_ptr<nn::Sequential> make_mlp(uint64_t seed) {
  core::Generator generator(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(8, 16, generator), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 4, generator)});
}

std::pair<Tensor, Tensor> global_batch(int step, int64_t n) {
  core::Generator generator(2000 + uint64_t(step));
  return {core::randn({n, 8}, generator), core::randn({n, 4}, generator)};
}

}  // namespace

TEST_CASE("DDP over a Module with zero_grad(set_to_none) matches one process with batch R*B") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  const int ranks = world.size(), rank = world.rank();
  const int64_t per_rank = 4;
  for (int nodes : test::node_layouts(ranks)) {
    INFO("simulated nodes " << nodes);
    test::SimulatedNodes simulated(nodes);
    auto distributed = make_mlp(rank == 0 ? 5 : 50), reference = make_mlp(5);
    // A frozen parameter is left out of the buckets (and would otherwise be an unused one).
    distributed->named_parameters()[3].second.set_requires_grad(false);
    reference->named_parameters()[3].second.set_requires_grad(false);
    launch::DistributedDataParallel ddp(*distributed, world);
    CHECK(ddp.transport_kind() == test::expected_transport(nodes, ranks));
    CHECK(&ddp.module() == distributed.get());
    std::vector<std::string> bucketed;
    for (auto& bucket : ddp.bucket_layout()) {
      bucketed.insert(bucketed.end(), bucket.begin(), bucket.end());
    }
    CHECK(bucketed == std::vector<std::string>{"2.weight", "0.bias", "0.weight"});
    auto trainable = [](const nn::Module& module) {
      std::vector<Tensor> out;
      for (auto& param : module.parameters()) {
        if (param.requires_grad()) out.push_back(param);
      }
      return out;
    };
    nn::SGD optimizer_d(trainable(*distributed), {.lr = 0.1});
    nn::SGD optimizer_r(trainable(*reference), {.lr = 0.1});
    for (int step = 0; step < 5; ++step) {
      auto [x, y] = global_batch(step, per_rank * ranks);
      distributed->zero_grad();  // set_to_none
      Tensor xs = x.narrow(0, rank * per_rank, per_rank);
      // Odd steps call the module directly, skipping prepare_for_backward: the grad hooks must
      // then move autograd's fresh gradients back into the buckets themselves.
      Tensor out = step % 2 == 0 ? ddp(xs) : (*distributed)(xs);
      nn::mse_loss(out, y.narrow(0, rank * per_rank, per_rank)).backward();
      optimizer_d.step();
      reference->zero_grad();
      nn::mse_loss((*reference)(x), y).backward();
      optimizer_r.step();
    }
    auto named_d = distributed->named_parameters(), named_r = reference->named_parameters();
    for (size_t i = 0; i < named_r.size(); ++i) {
      INFO(named_r[i].first);
      CHECK(max_difference(named_d[i].second, named_r[i].second) <= 1e-5);
    }
  }
}

TEST_CASE("gradients stay the same bucket views across zero_grad, zeroed with their bucket") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  for (auto [nodes, shared_memory] : test::transport_cases(world.size())) {
    INFO("simulated nodes " << nodes << ", shared_memory " << shared_memory);
    test::SimulatedNodes simulated(nodes);
    auto model = make_mlp(3);
    launch::DdpOptions options;
    options.shared_memory = shared_memory;
    launch::DistributedDataParallel ddp(*model, world, options);
    std::vector<Tensor> views;
    for (auto& param : model->parameters()) views.push_back(param.grad());
    for (int step = 0; step < 3; ++step) {
      auto [x, y] = global_batch(world.rank() + step, 4);
      model->zero_grad(/*set_to_none=*/step != 1);
      ddp.prepare_for_backward();
      auto params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        INFO("parameter " << i << " step " << step);
        // The very tensors DDP made at construction, not new views onto the bucket.
        CHECK(params[i].grad().is_same(views[i]));
        CHECK(core::max(core::abs(params[i].grad())).item<double>() == 0.0);
      }
      nn::mse_loss(ddp(x), y).backward();
      if (ddp.buckets_rebuilt()) break;  // new buckets, new views (the rebuild test covers it)
    }
  }
}

TEST_CASE("fp16 gradient compression stays close to the uncompressed average") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  auto exact = make_mlp(9), compressed = make_mlp(9);
  launch::DdpOptions options;
  options.compression = launch::parse_grad_compression("fp16");
  launch::DistributedDataParallel ddp_exact(*exact, world);
  launch::DistributedDataParallel ddp_compressed(*compressed, world, options);
  auto [x, y] = global_batch(world.rank(), 8);
  nn::mse_loss(ddp_exact(x), y).backward();
  nn::mse_loss(ddp_compressed(x), y).backward();
  auto named_e = exact->named_parameters(), named_c = compressed->named_parameters();
  for (size_t i = 0; i < named_e.size(); ++i) {
    INFO(named_e[i].first);
    Tensor reference = named_e[i].second.grad();
    double scale = core::max(core::abs(reference)).item<double>();
    CHECK(max_difference(named_c[i].second.grad(), reference) <= 2e-3 * scale + 1e-6);
  }
}

TEST_CASE("every transport gives the gradients of the communicator's all-reduce") {
  // The MPI runner owns MPI; each test's manager attaches to it and is gone before MPI_Finalize.
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  for (int nodes : test::node_layouts(world.size())) {
    INFO("simulated nodes " << nodes);
    test::SimulatedNodes simulated(nodes);
    auto shared = make_mlp(13), via_mpi = make_mlp(13);
    launch::DdpOptions mpi_options;
    mpi_options.shared_memory = false;
    mpi_options.first_bucket_cap_mb = 0.0002;  // several buckets, each with its own all-reduce
    launch::DistributedDataParallel ddp_shared(*shared, world);
    launch::DistributedDataParallel ddp_mpi(*via_mpi, world, mpi_options);
    CHECK(ddp_shared.transport_kind() == test::expected_transport(nodes, world.size()));
    CHECK(ddp_mpi.transport_kind() == launch::TransportKind::Communicator);
    CHECK(ddp_mpi.transport_description().find("(shared_memory is off)") != std::string::npos);
    for (int step = 0; step < 3; ++step) {
      auto [x, y] = global_batch(10 * world.rank() + step, 8);
      shared->zero_grad();
      via_mpi->zero_grad();
      nn::mse_loss(ddp_shared(x), y).backward();
      nn::mse_loss(ddp_mpi(x), y).backward();
      auto named_s = shared->named_parameters(), named_m = via_mpi->named_parameters();
      for (size_t i = 0; i < named_s.size(); ++i) {
        INFO(named_s[i].first << " step " << step);
        Tensor reference = named_m[i].second.grad();
        double scale = core::max(core::abs(reference)).item<double>();
        CHECK(max_difference(named_s[i].second.grad(), reference) <= 1e-6 * scale);
      }
    }
  }
}
