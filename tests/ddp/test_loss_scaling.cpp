// fp16 loss scaling under DDP (np 1, 2, 4): an overflow on one rank skips the step on every rank
// and halves the scale everywhere, with no collective beyond the gradients' own averaging, on
// every transport and through bf16 compression (the communicator's on one node, the hierarchical
// one's inter-node step across simulated nodes); clean steps then train alike on every rank.
// Under ZeRO-1 the same holds with the overflow placed in a shard the overflowing rank does not
// own (the case a reduce-scatter hides from it), and ZeRO-1 + fp16 follows DDP + fp16 step for
// step: the same skipped steps, the same scales, the same weights.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "../simulated_nodes.h"
#include "../tensor_difference.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/launch/ddp/distributed_data_parallel.h"
#include "mpigrad/launch/ddp/zero_redundancy.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/layers/linear.h"
#include "mpigrad/nn/loss.h"
#include "mpigrad/nn/optim/adam.h"
#include "mpigrad/nn/optim/clip_grad.h"
#include "mpigrad/nn/optim/grad_scaler.h"
#include "mpigrad/nn/optim/sgd.h"
#include "transport_expectation.h"

using namespace mpigrad;
using core::Tensor;

namespace {

std::shared_ptr<nn::Sequential> small_mlp() {
  core::Generator generator(11);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 12, generator), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(12, 3, generator)});
}

std::vector<float> flat_weights(nn::Module& model) {
  std::vector<float> out;
  for (const Tensor& p : model.parameters()) {
    const std::vector<float> values = p.to_vector<float>();
    out.insert(out.end(), values.begin(), values.end());
  }
  return out;
}

// Small buckets, so the MLP spans two (fc2's and fc1.bias, then fc1.weight) and an overflow
// can sit in a bucket other than the last, whose shards carry the flag.
launch::DdpOptions zero_options(bool shared_memory) {
  launch::DdpOptions options;
  options.shared_memory = shared_memory;
  options.first_bucket_cap_mb = 0.0002;
  options.bucket_cap_mb = 0.001;
  options.zero = true;
  options.carry_found_inf = true;
  return options;
}

// Where element `element` of bucket `bucket` lives: the parameter (index into ddp.parameters())
// and the element in its flattened tensor.
std::pair<size_t, int64_t> parameter_element(const launch::DistributedDataParallel& ddp,
                                             size_t bucket, int64_t element) {
  const std::vector<size_t>& members = ddp.bucket_parameters(bucket);
  const std::vector<int64_t>& offsets = ddp.bucket_offsets(bucket);
  for (size_t k = 0; k < members.size(); ++k) {
    const int64_t numel = ddp.parameters()[members[k]].tensor.numel();
    if (element >= offsets[k] && element < offsets[k] + numel) {
      return {members[k], element - offsets[k]};
    }
  }
  FAIL("element ", element, " of bucket ", bucket, " belongs to no parameter");
  return {0, 0};
}

// A loss term whose gradient is 1e36 at one element of `parameter`: times the scale (2^16 and
// down to 2^14 here) it is inf in float32 there, and only there.
Tensor overflow_at(const Tensor& parameter, int64_t element) {
  return core::sum(parameter.reshape({parameter.numel()}).narrow(0, element, 1)) * 1e36;
}

// After one step: an overflowed step moved no weight and a clean one moved them to finite
// values, and every rank holds the same weights, bit for bit.
void check_step_outcome(launch::Communicator& world, const std::vector<float>& before,
                        const std::vector<float>& after, bool overflow) {
  if (overflow) {
    CHECK(after == before);  // not one weight moved, on any rank
  } else {
    CHECK(after != before);
    for (float w : after) CHECK(std::isfinite(w));
  }
  const Tensor mine = Tensor::from_vector(after, {int64_t(after.size())});
  Tensor max = mine.clone(), min = mine.clone();
  world.all_reduce(max, launch::ReduceOp::Max);
  world.all_reduce(min, launch::ReduceOp::Min);
  CHECK(max.to_vector<float>() == after);
  CHECK(min.to_vector<float>() == after);
}

}  // namespace

TEST_CASE("an overflow on one rank skips the step on every rank and halves the scale") {
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  const int ranks = world.size(), rank = world.rank();
  for (auto [nodes, shared_memory] : test::transport_cases(ranks)) {
    for (auto compression : {launch::GradCompression::None, launch::GradCompression::BFloat16}) {
      INFO("simulated nodes ", nodes, ", shared_memory ", shared_memory, ", compression ",
           int(compression));
      test::SimulatedNodes simulated(nodes);
      auto model = small_mlp();
      launch::DdpOptions options;
      options.shared_memory = shared_memory;
      options.compression = compression;
      launch::DistributedDataParallel ddp(*model, world, options);
      nn::SGD optimizer(model->parameters(), nn::SGDOptions{.lr = 0.1});
      nn::GradScaler scaler(nn::GradScalerOptions{.growth_interval = 2});
      const int overflowing_rank = ranks - 1;
      std::vector<float> before = flat_weights(*model);
      // Steps 0 and 2 overflow on the last rank only; 1, 3 and 4 are clean.
      const std::vector<bool> overflow = {true, false, true, false, false};
      const std::vector<double> scale_after = {32768, 32768, 16384, 16384, 32768};
      for (size_t step = 0; step < overflow.size(); ++step) {
        INFO("step ", step);
        core::Generator data(100 + step * 10 + uint64_t(rank));
        Tensor x = core::randn({4, 6}, data), y = core::randn({4, 3}, data);
        optimizer.zero_grad();
        Tensor loss = nn::mse_loss(ddp.forward(x), y);
        // The fault as fp16 would meet it: a loss this large overflows once scaled.
        if (overflow[step] && rank == overflowing_rank) loss = loss * 1e36;
        scaler.scale(loss).backward();
        const bool stepped = scaler.step(optimizer);
        CHECK(stepped == !overflow[step]);
        CHECK(scaler.found_inf() == overflow[step]);
        scaler.update();
        CHECK(scaler.get_scale() == scale_after[step]);
        const std::vector<float> after = flat_weights(*model);
        check_step_outcome(world, before, after, overflow[step]);
        before = after;
      }
      CHECK(scaler.skipped_steps() == 2);
    }
  }
}

TEST_CASE("ZeRO-1: an overflow in a shard the rank does not own skips the step on every rank") {
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  const int ranks = world.size(), rank = world.rank();
  for (auto [nodes, shared_memory] : test::transport_cases(ranks)) {
    INFO("simulated nodes ", nodes, ", shared_memory ", shared_memory);
    test::SimulatedNodes simulated(nodes);
    auto model = small_mlp();
    launch::DistributedDataParallel ddp(*model, world, zero_options(shared_memory));
    INFO(ddp.transport_description());
    CHECK(ddp.transport_kind() == test::expected_transport(nodes, ranks, shared_memory));
    REQUIRE(ddp.bucket_count() == 2);
    nn::SGD optimizer(model->parameters(), nn::SGDOptions{.lr = 0.1, .momentum = 0.9});
    launch::ZeroRedundancyOptimizer zero(ddp, optimizer);
    nn::GradScaler scaler(nn::GradScalerOptions{.growth_interval = 2});
    // The last rank overflows at the first element of the next rank's shard of bucket 0: after
    // the reduce-scatter only that rank's shard holds the inf.
    const int overflowing_rank = ranks - 1, owner = (overflowing_rank + 1) % ranks;
    const auto [first, last] = ddp.transport().shard(0, owner);
    REQUIRE(first < last);
    REQUIRE(first < ddp.bucket_buffer(0).numel());
    if (ranks > 1) {
      const auto [own_first, own_last] = ddp.transport().shard(0, overflowing_rank);
      REQUIRE((first < own_first || first >= own_last));
    }
    const auto [parameter, element] = parameter_element(ddp, 0, first);
    const Tensor target = ddp.parameters()[parameter].tensor;
    std::vector<float> before = flat_weights(*model);
    const std::vector<bool> overflow = {true, false, true, false, false};
    const std::vector<double> scale_after = {32768, 32768, 16384, 16384, 32768};
    for (size_t step = 0; step < overflow.size(); ++step) {
      INFO("step ", step);
      core::Generator data(100 + step * 10 + uint64_t(rank));
      Tensor x = core::randn({4, 6}, data), y = core::randn({4, 3}, data);
      Tensor loss = nn::mse_loss(ddp.forward(x), y);
      if (overflow[step] && rank == overflowing_rank) loss = loss + overflow_at(target, element);
      scaler.scale(loss).backward();
      const bool overflowed = zero.unscale_(scaler);
      CHECK(overflowed == overflow[step]);
      if (overflowed) {
        zero.skip_step();
      } else {
        zero.step();
      }
      scaler.update();
      CHECK(scaler.get_scale() == scale_after[step]);
      const std::vector<float> after = flat_weights(*model);
      check_step_outcome(world, before, after, overflow[step]);
      before = after;
    }
    CHECK(scaler.skipped_steps() == 2);
  }
}

TEST_CASE("ZeRO-1 with fp16 compression: an overflow on the fp16 wire skips on every rank") {
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  const int ranks = world.size(), rank = world.rank();
  // On one node through the communicator; across simulated nodes the hierarchical transport
  // reduce-scatters its node sums in fp16 between the nodes.
  for (int nodes : test::node_layouts(ranks)) {
    INFO("simulated nodes ", nodes);
    test::SimulatedNodes simulated(nodes);
    auto model = small_mlp();
    launch::DdpOptions options = zero_options(true);
    options.compression = launch::GradCompression::Float16;
    launch::DistributedDataParallel ddp(*model, world, options);
    INFO(ddp.transport_description());
    CHECK(ddp.transport_kind() == (test::layout_nodes(nodes) > 1 && ranks > 1
                                       ? launch::TransportKind::Hierarchical
                                       : launch::TransportKind::Communicator));
    nn::SGD optimizer(model->parameters(), nn::SGDOptions{.lr = 0.1});
    launch::ZeroRedundancyOptimizer zero(ddp, optimizer);
    // A small scale keeps the clean gradients inside fp16's range on the wire.
    nn::GradScaler scaler(nn::GradScalerOptions{.init_scale = 256.0});
    const int overflowing_rank = ranks - 1, owner = (overflowing_rank + 1) % ranks;
    const auto [parameter, element] =
        parameter_element(ddp, 0, ddp.transport().shard(0, owner).first);
    const Tensor target = ddp.parameters()[parameter].tensor;
    std::vector<float> before = flat_weights(*model);
    const Tensor fc2_weight = model->parameters()[2];
    // Step 1 overflows on the wire of one rank, step 2 in the fp16 sum over the ranks.
    const std::vector<bool> overflows = {false, true, true, false};
    for (size_t step = 0; step < overflows.size(); ++step) {
      INFO("step ", step);
      const bool overflow = overflows[step];
      core::Generator data(300 + step * 10 + uint64_t(rank));
      Tensor x = core::randn({4, 6}, data), y = core::randn({4, 3}, data);
      Tensor loss = nn::mse_loss(ddp.forward(x), y);
      // 1e4 x 256: finite in float32, beyond fp16's 65504 once cast for the reduce-scatter.
      if (step == 1 && rank == overflowing_rank) {
        loss = loss + core::sum(target.reshape({target.numel()}).narrow(0, element, 1)) * 1e4;
      }
      // Gradients of 76800 / ranks each at scale 128 (after step 1), so their sum over the ranks
      // in the fp16 reduce-scatter is beyond 65504: inf in the owner's shard alone.
      if (step == 2) loss = loss + core::sum(target) * (600.0 / ranks);
      // At scale 64, 36 gradients of 12800 that fit in fp16 even summed over 4 ranks, but add up
      // to more than 65504: not an overflow, however a check adds them.
      if (step == 3) loss = loss + core::sum(fc2_weight) * 200.0;
      scaler.scale(loss).backward();
      const bool overflowed = zero.unscale_(scaler);
      CHECK(overflowed == overflow);
      if (overflowed) {
        zero.skip_step();
      } else {
        zero.step();
      }
      scaler.update();
      const std::vector<float> after = flat_weights(*model);
      check_step_outcome(world, before, after, overflow);
      before = after;
    }
    CHECK(scaler.skipped_steps() == 2);
    CHECK(scaler.get_scale() == 64.0);
  }
}

TEST_CASE("ZeRO-1 refuses to unscale when DDP does not carry the found-inf flag") {
  auto manager = launch::DistributedManager::initialize();
  auto model = small_mlp();
  launch::DdpOptions options = zero_options(true);
  options.carry_found_inf = false;
  launch::DistributedDataParallel ddp(*model, manager.world(), options);
  nn::SGD optimizer(model->parameters(), nn::SGDOptions{.lr = 0.1});
  launch::ZeroRedundancyOptimizer zero(ddp, optimizer);
  nn::GradScaler scaler;
  CHECK_THROWS_WITH_AS(zero.unscale_(scaler), doctest::Contains("carry_found_inf"), core::Error);
}

TEST_CASE("ZeRO-1 + fp16 loss scaling equals DDP + fp16 over 20 AdamW steps, on every transport") {
  auto manager = launch::DistributedManager::initialize();
  auto& world = manager.world();
  const int ranks = world.size(), rank = world.rank();
  for (auto [nodes, shared_memory] : test::transport_cases(ranks)) {
    INFO("simulated nodes ", nodes, ", shared_memory ", shared_memory);
    test::SimulatedNodes simulated(nodes);
    auto plain_model = small_mlp(), zero_model = small_mlp();
    launch::DdpOptions plain_options = zero_options(shared_memory);
    plain_options.zero = false;
    plain_options.carry_found_inf = false;
    launch::DistributedDataParallel plain_ddp(*plain_model, world, plain_options);
    launch::DistributedDataParallel zero_ddp(*zero_model, world, zero_options(shared_memory));
    nn::AdamOptions adam = nn::AdamW::default_options();
    adam.lr = 0.01;
    nn::AdamW plain_optimizer(plain_model->parameters(), adam);
    nn::AdamW zero_inner(zero_model->parameters(), adam);
    launch::ZeroRedundancyOptimizer zero(zero_ddp, zero_inner);
    const nn::GradScalerOptions scaling{.growth_interval = 3};
    nn::GradScaler plain_scaler(scaling), zero_scaler(scaling);
    for (int step = 0; step < 20; ++step) {
      INFO("step ", step);
      core::Generator data(700 + uint64_t(step) * 10 + uint64_t(rank));
      Tensor x = core::randn({4, 6}, data), y = core::randn({4, 3}, data);
      // Overflows on one rank or another, in either bucket, between runs of clean steps that
      // let the scale grow back.
      const int overflowing_rank = step % ranks;
      const bool overflow = (step == 2 || step == 9 || step == 10 || step == 17);
      const size_t bucket = size_t(step) % 2;
      for (int run = 0; run < 2; ++run) {
        launch::DistributedDataParallel& ddp = run == 0 ? plain_ddp : zero_ddp;
        nn::GradScaler& scaler = run == 0 ? plain_scaler : zero_scaler;
        Tensor loss = nn::mse_loss(ddp.forward(x), y);
        if (overflow && rank == overflowing_rank) {
          const auto [parameter, element] = parameter_element(ddp, bucket, 0);
          loss = loss + overflow_at(ddp.parameters()[parameter].tensor, element);
        }
        scaler.scale(loss).backward();
      }
      const bool plain_overflowed = plain_scaler.unscale_(plain_model->parameters());
      const bool zero_overflowed = zero.unscale_(zero_scaler);
      CHECK(plain_overflowed == overflow);
      CHECK(zero_overflowed == overflow);
      // Clipping sees the unscaled gradients (and no more than a NaN norm on a skipped step).
      if (!plain_overflowed) nn::clip_grad_norm_(plain_model->parameters(), 0.5);
      if (!zero_overflowed) zero.clip_grad_norm(0.5);
      plain_scaler.step(plain_optimizer);
      plain_optimizer.zero_grad();
      if (zero_overflowed) {
        zero.skip_step();
      } else {
        zero.step();
      }
      plain_scaler.update();
      zero_scaler.update();
      CHECK(zero_scaler.get_scale() == plain_scaler.get_scale());
      CHECK(zero_scaler.growth_tracker() == plain_scaler.growth_tracker());
    }
    CHECK(zero_scaler.skipped_steps() == 4);
    CHECK(plain_scaler.skipped_steps() == 4);
    // Four halvings (steps 2, 9, 10, 17) and four doublings (5, 8, 13, 16): 2^16 again.
    CHECK(zero_scaler.get_scale() == 65536.0);
    const std::vector<Tensor> plain = plain_model->parameters(), sharded = zero_model->parameters();
    for (size_t i = 0; i < plain.size(); ++i) {
      INFO("parameter ", i);
      CHECK(test::max_difference(sharded[i], plain[i]) <= 1e-6);
    }
    // The sharded AdamW state, gathered, is the plain one (steps skipped alike).
    const nn::StateDict gathered = zero.state_dict(), expected = plain_optimizer.state_dict();
    for (const auto& [key, tensor] : expected.tensors()) {
      INFO(key);
      REQUIRE(gathered.find(key) != nullptr);
      CHECK(test::max_difference(*gathered.find(key), tensor) <= 1e-6);
    }
    for (const auto& [key, value] : expected.scalars()) {
      INFO(key);
      REQUIRE(gathered.find_scalar(key) != nullptr);
      CHECK(*gathered.find_scalar(key) == value);
    }
  }
}
