// [train] cuda_graphs on an embedded model (launch/train/captured_step.h): a model whose steps
// are replayed from a CUDA graph ends with the weights, and the losses, of one trained the
// ordinary way, also when its arrays move and a step runs eagerly between replays; the cases it
// does not apply to say why and train as usual.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/launch/insitu/embedded_model.h"
#include "nn_cuda_test.h"

namespace {

using mpigrad::core::Tensor;
using mpigrad::launch::EmbeddedModel;
namespace core = mpigrad::core;

const core::Device kGpu = core::cuda(0);

std::string config(bool graphs, const std::string& extra = "") {
  return std::string(
             "[model]\nname = mlp\ninput_shape = 64\nhidden = 128,128\noutputs = 8\n"
             "[loss]\nname = mse\n[optim]\nname = adamw\nlr = 0.001\n"
             "[sched]\nname = linear\ntotal_steps = 40\nend_factor = 0.1\n[train]\nseed = 3\n"
             "cuda_graph_warmup = 2\ncuda_graphs = ") +
         (graphs ? "true\n" : "false\n") + extra;
}

// Batch `step`'s values, the same for every model.
Tensor batch(int64_t step, const core::Shape& shape) {
  core::Generator generator(1000 + uint64_t(step));
  return core::randn(shape, generator).to(kGpu);
}

std::vector<double> weights(EmbeddedModel& model) {
  std::vector<double> all;
  for (const Tensor& p : model.module().parameters()) {
    const auto values = mpigrad::test::host_values(p);
    all.insert(all.end(), values.begin(), values.end());
  }
  return all;
}

}  // namespace

MPIGRAD_NN_CUDA_TEST_CASE("replayed steps give the ordinary steps' losses and weights") {
  EmbeddedModel plain(config(false), kGpu);
  EmbeddedModel graphed(config(true), kGpu);
  // The graphed model's arrays keep their addresses: refilled in place each step.
  Tensor x = core::zeros({16, 64}, core::TensorOptions().device(kGpu));
  Tensor y = core::zeros({16, 8}, core::TensorOptions().device(kGpu));
  for (int64_t step = 0; step < 12; ++step) {
    x.copy_(batch(step, {16, 64}));
    y.copy_(batch(100 + step, {16, 8}));
    const double expected = plain.train_step(x.clone(), y.clone()).item<double>();
    const double loss = graphed.train_step(x, y).item<double>();
    CHECK(loss == doctest::Approx(expected).epsilon(1e-6));
  }
  CHECK(graphed.cuda_graph_status() == "replaying (10 replays)");
  const auto a = weights(graphed), b = weights(plain);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) REQUIRE(a[i] == doctest::Approx(b[i]).epsilon(1e-6));
}

MPIGRAD_NN_CUDA_TEST_CASE("a step whose arrays moved runs eagerly, and replays resume after") {
  EmbeddedModel plain(config(false), kGpu);
  EmbeddedModel graphed(config(true), kGpu);
  Tensor x = core::zeros({16, 64}, core::TensorOptions().device(kGpu));
  Tensor y = core::zeros({16, 8}, core::TensorOptions().device(kGpu));
  for (int64_t step = 0; step < 10; ++step) {
    const Tensor bx = batch(step, {16, 64}), by = batch(100 + step, {16, 8});
    const double expected = plain.train_step(bx, by).item<double>();
    double loss = 0;
    if (step == 6) {
      loss = graphed.train_step(bx, by).item<double>();  // other addresses
    } else {
      x.copy_(bx);
      y.copy_(by);
      loss = graphed.train_step(x, y).item<double>();
    }
    CHECK(loss == doctest::Approx(expected).epsilon(1e-6));
  }
  // Steps 0-1 warm up, 2 is captured (and replayed), 6 runs eagerly: 7 replays.
  CHECK(graphed.cuda_graph_status() == "replaying (7 replays)");
  const auto a = weights(graphed), b = weights(plain);
  for (size_t i = 0; i < a.size(); ++i) REQUIRE(a[i] == doctest::Approx(b[i]).epsilon(1e-6));
}

MPIGRAD_NN_CUDA_TEST_CASE("cuda_graphs says why it does not apply and trains as usual") {
  EmbeddedModel dropout(config(true, "") + "[model]\ndropout = 0.1\n", kGpu);
  CHECK(dropout.cuda_graph_status() == "off: the model has dropout");
  EmbeddedModel accumulating(config(true, "grad_accum_steps = 2\n"), kGpu);
  CHECK(accumulating.cuda_graph_status().find("grad_accum_steps") != std::string::npos);
  EmbeddedModel on_cpu(config(true), core::kCPU);
  CHECK(on_cpu.cuda_graph_status() == "off: the model is on cpu");
  Tensor x = core::ones({4, 64}), y = core::ones({4, 8});
  CHECK(std::isfinite(on_cpu.train_step(x, y).item<double>()));
}
