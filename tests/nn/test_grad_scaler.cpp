// GradScaler (nn/optim/grad_scaler.h): the scale's schedule, unscaling before the optimizer and
// before clipping, gradient accumulation under one scale, and the state a checkpoint carries.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/nn/checkpoint.h"
#include "mpigrad/nn/optim/clip_grad.h"
#include "mpigrad/nn/optim/grad_scaler.h"
#include "mpigrad/nn/optim/sgd.h"

using namespace mpigrad;  // NOLINT
using core::Tensor;

namespace {

Tensor parameter(std::vector<float> values) {
  Tensor p = Tensor::from_vector(values, {int64_t(values.size())});
  p.set_requires_grad(true);
  return p;
}

}  // namespace

TEST_CASE("the scale starts at 2^16, halves on an overflow and doubles after N clean steps") {
  nn::GradScaler scaler(nn::GradScalerOptions{.growth_interval = 3});
  CHECK(scaler.get_scale() == 65536.0);
  Tensor p = parameter({1, 2});
  nn::SGD optimizer({p}, nn::SGDOptions{.lr = 1.0});
  auto step = [&](float gradient_value) {
    optimizer.zero_grad();
    p.set_grad(core::full({2}, double(gradient_value)));
    const bool stepped = scaler.step(optimizer);
    scaler.update();
    return stepped;
  };
  CHECK_FALSE(step(std::numeric_limits<float>::infinity()));
  CHECK(scaler.get_scale() == 32768.0);
  CHECK(p.to_vector<float>() == std::vector<float>{1, 2});  // skipped
  CHECK_FALSE(step(std::numeric_limits<float>::quiet_NaN()));
  CHECK(scaler.get_scale() == 16384.0);
  CHECK(step(16384.0f));  // a scaled gradient of 1: unscaled before the step
  CHECK(p.to_vector<float>() == std::vector<float>{0, 1});
  CHECK(step(0));
  CHECK(scaler.growth_tracker() == 2);
  CHECK(step(0));
  CHECK(scaler.get_scale() == 32768.0);  // three clean steps in a row
  CHECK(scaler.growth_tracker() == 0);
  CHECK(scaler.skipped_steps() == 2);
  CHECK_THROWS_AS(nn::GradScaler(nn::GradScalerOptions{.init_scale = 0}), core::Error);
}

TEST_CASE("unscale_ before clipping: the norm is the true gradient's, and it is unscaled once") {
  nn::GradScaler scaler;
  Tensor p = parameter({0, 0});
  // loss = 3 p0 + 4 p1: the true gradient [3, 4] has norm 5.
  auto backward = [&] {
    Tensor weights = Tensor::from_vector(std::vector<float>{3, 4}, {2});
    scaler.scale(core::sum(p * weights)).backward();
  };
  backward();
  CHECK(p.grad().to_vector<float>() == std::vector<float>{3 * 65536.0f, 4 * 65536.0f});
  CHECK_FALSE(scaler.unscale_({p}));
  CHECK(nn::clip_grad_norm_({p}, 1.0) == doctest::Approx(5.0));
  nn::SGD optimizer({p}, nn::SGDOptions{.lr = 1.0});
  CHECK(scaler.step(optimizer));  // does not unscale a second time
  scaler.update();
  const std::vector<float> after = p.to_vector<float>();
  CHECK(after[0] == doctest::Approx(-0.6).epsilon(1e-5));
  CHECK(after[1] == doctest::Approx(-0.8).epsilon(1e-5));
}

TEST_CASE("gradient accumulation: micro-batches add up under one scale, unscaled at the step") {
  nn::GradScaler scaler;
  Tensor p = parameter({1});
  for (int micro = 0; micro < 4; ++micro) scaler.scale(core::sum(p * 0.25)).backward();
  nn::SGD optimizer({p}, nn::SGDOptions{.lr = 1.0});
  CHECK(scaler.step(optimizer));
  scaler.update();
  CHECK(p.to_vector<float>()[0] == doctest::Approx(0.0).epsilon(1e-6));
}

TEST_CASE("the scale and its counters survive a checkpoint, under /hooks/loss_scaler") {
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("mpigrad-test-scaler-" + std::to_string(::getpid()) + ".h5");
  nn::GradScaler scaler(nn::GradScalerOptions{.growth_interval = 10});
  Tensor p = parameter({1});
  nn::SGD optimizer({p}, nn::SGDOptions{.lr = 0.1});
  for (float g : {std::numeric_limits<float>::infinity(), 1.0f, 1.0f, 1.0f}) {
    optimizer.zero_grad();
    p.set_grad(core::full({1}, double(g)));
    scaler.step(optimizer);
    scaler.update();
  }
  nn::CheckpointData data;
  data.hooks.emplace("loss_scaler", scaler.state_dict());
  nn::save_checkpoint(path.string(), data);
  const nn::CheckpointData loaded = nn::load_checkpoint(path.string());
  std::filesystem::remove(path);
  nn::GradScaler resumed(nn::GradScalerOptions{.growth_interval = 10});
  resumed.load_state_dict(loaded.hooks.at("loss_scaler"));
  CHECK(resumed.get_scale() == 32768.0);
  CHECK(resumed.growth_tracker() == 3);
  CHECK(resumed.skipped_steps() == 1);
  nn::StateDict bad;
  bad.set_scalar("scale", -1.0);
  bad.set_scalar("growth_tracker", 0.0);
  CHECK_THROWS_AS(resumed.load_state_dict(bad), core::Error);
}
