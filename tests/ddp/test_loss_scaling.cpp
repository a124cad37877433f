// fp16 loss scaling under DDP (np 1, 2, 4): an overflow on one rank skips the step on every rank
// and halves the scale everywhere, with no collective beyond the gradients' own averaging, on
// every transport and through bf16 compression; clean steps then train alike on every rank.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "../simulated_nodes.h"
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
        if (overflow[step]) {
          CHECK(after == before);  // not one weight moved, on any rank
        } else {
          CHECK(after != before);
          for (float w : after) CHECK(std::isfinite(w));
        }
        // Every rank holds the same weights, bit for bit, at every step.
        const Tensor mine = Tensor::from_vector(after, {int64_t(after.size())});
        Tensor max = mine.clone(), min = mine.clone();
        world.all_reduce(max, launch::ReduceOp::Max);
        world.all_reduce(min, launch::ReduceOp::Min);
        CHECK(max.to_vector<float>() == after);
        CHECK(min.to_vector<float>() == after);
        before = after;
      }
      CHECK(scaler.skipped_steps() == 2);
    }
  }
}
