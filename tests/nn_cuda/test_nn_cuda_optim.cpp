// The fused multi-tensor optimizers on CUDA against the CPU optimizers over 3 steps: parameters
// of several sizes (one element up to more than a block's grid stride) in two parameter groups
// with their own lr and weight decay, fixed gradients per step; parameters and optimizer state
// are compared after every step.
#include <doctest/doctest.h>

#include <functional>
#include <memory>
#include <vector>

#include "mpigrad/nn/optim/adam.h"
#include "mpigrad/nn/optim/sgd.h"
#include "nn_cuda_test.h"

namespace {

using namespace mpigrad;  // NOLINT
using core::Tensor;

const core::Shape kShapes[] = {{1}, {7, 3}, {300000}, {4, 5, 6}};

std::vector<Tensor> make_params(core::DType dtype, core::Device device) {
  std::vector<Tensor> params;
  uint64_t seed = 10;
  for (const auto& shape : kShapes) {
    Tensor p = test::random_input(shape, dtype, seed++).to(device);
    p.set_requires_grad(true);
    params.push_back(p);
  }
  return params;
}

std::vector<nn::ParamGroupSpec> two_groups(const std::vector<Tensor>& params) {
  nn::ParamGroupSpec first{{params[0], params[1]}, {}, {}, {}};
  nn::ParamGroupSpec second{{params[2], params[3]}, 0.05, 0.01, {}};
  return {first, second};
}

using MakeOptimizer =
    std::function<std::unique_ptr<nn::Optimizer>(std::vector<nn::ParamGroupSpec>)>;

void compare_optimizer(const char* label, const MakeOptimizer& make, core::DType dtype) {
  INFO(label << " " << dtype);
  const test::Tolerance tol =
      dtype == core::kFloat64 ? test::Tolerance{1e-12, 1e-12} : test::Tolerance{1e-5, 1e-5};
  auto cpu_params = make_params(dtype, core::kCPU);
  auto gpu_params = make_params(dtype, core::cuda(0));
  auto cpu = make(two_groups(cpu_params));
  auto gpu = make(two_groups(gpu_params));
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      Tensor grad = test::random_input(cpu_params[i].shape(), dtype, 50 + 10 * uint64_t(step) + i);
      cpu_params[i].set_grad(grad);
      gpu_params[i].set_grad(grad.to(core::cuda(0)));
    }
    cpu->step();
    gpu->step();
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      INFO("parameter " << i);
      MPIGRAD_CHECK_CLOSE("parameter", gpu_params[i], cpu_params[i], tol);
    }
    const auto state_c = cpu->state_dict();
    const auto state_g = gpu->state_dict();
    REQUIRE(state_c.tensors().size() == state_g.tensors().size());
    for (size_t i = 0; i < state_c.tensors().size(); ++i) {
      MPIGRAD_CHECK_CLOSE(state_c.tensors()[i].first, state_g.tensors()[i].second,
                          state_c.tensors()[i].second, tol);
    }
  }
}

MPIGRAD_NN_CUDA_TEST_CASE("fused SGD on CUDA matches the CPU over 3 steps") {
  for (core::DType dtype : {core::kFloat32, core::kFloat64}) {
    compare_optimizer(
        "SGD plain",
        [](std::vector<nn::ParamGroupSpec> groups) {
          nn::SGDOptions o;
          o.lr = 0.1;
          return std::make_unique<nn::SGD>(std::move(groups), o);
        },
        dtype);
    compare_optimizer(
        "SGD momentum dampening weight decay",
        [](std::vector<nn::ParamGroupSpec> groups) {
          nn::SGDOptions o;
          o.lr = 0.1;
          o.momentum = 0.9;
          o.dampening = 0.2;
          o.weight_decay = 1e-3;
          return std::make_unique<nn::SGD>(std::move(groups), o);
        },
        dtype);
    compare_optimizer(
        "SGD nesterov",
        [](std::vector<nn::ParamGroupSpec> groups) {
          nn::SGDOptions o;
          o.lr = 0.05;
          o.momentum = 0.8;
          o.nesterov = true;
          return std::make_unique<nn::SGD>(std::move(groups), o);
        },
        dtype);
  }
}

MPIGRAD_NN_CUDA_TEST_CASE("fused Adam and AdamW on CUDA match the CPU over 3 steps") {
  for (core::DType dtype : {core::kFloat32, core::kFloat64}) {
    compare_optimizer(
        "Adam",
        [](std::vector<nn::ParamGroupSpec> groups) {
          nn::AdamOptions o;
          o.lr = 1e-2;
          o.weight_decay = 1e-3;
          return std::make_unique<nn::Adam>(std::move(groups), o);
        },
        dtype);
    compare_optimizer(
        "AdamW",
        [](std::vector<nn::ParamGroupSpec> groups) {
          nn::AdamOptions o = nn::AdamW::default_options();
          o.lr = 1e-2;
          return std::make_unique<nn::AdamW>(std::move(groups), o);
        },
        dtype);
  }
}

MPIGRAD_NN_CUDA_TEST_CASE("a CUDA optimizer step leaves parameters without gradients alone") {
  auto params = make_params(core::kFloat32, core::cuda(0));
  const Tensor before = params[1].detach().clone();
  params[0].set_grad(core::ones_like(params[0]));
  nn::SGDOptions o;
  o.lr = 0.5;
  nn::SGD sgd(params, o);
  sgd.step();
  CHECK(test::mismatch(params[1], before, {0, 0}).empty());
  CHECK(test::host_values(params[0])[0] ==
        doctest::Approx(test::host_values(test::random_input({1}, core::kFloat32, 10))[0] - 0.5));
}

}  // namespace
