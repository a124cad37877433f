// Batch norm, ReLU and a 2x2 max pooling as one op (functional::batch_norm_relu_max_pool2d,
// BatchNorm::forward_relu_max_pool and Sequential's recognition of the three modules) against the
// three ops run one after the other: where it fuses, the output, the running statistics and every
// gradient must match to the bit at 1, 2 and 3 threads, including ties, NaN, -0 and +0 in the
// pooling windows and planes with an odd last row or column; a create_graph backward must give
// the composition's first and second derivatives. Where it does not fuse (eval mode, other
// windows, padding, dilation, Float64, too small or empty inputs) it must be the composition.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "../thread_count.h"
#include "batch_norm_test_util.h"
#include "mpigrad/core/autocast.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/core/threads.h"
#include "mpigrad/nn/functional/normalization.h"
#include "mpigrad/nn/functional/pooling.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/batch_norm.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/layers/conv.h"
#include "mpigrad/nn/layers/pooling.h"

namespace {

using namespace mpigrad;  // NOLINT
using core::Shape;
using core::Tensor;
namespace F = nn::functional;

constexpr const char* kFusedNode = "BatchNormReluMaxPoolBackward";

using Inputs = test::BatchNormInputs;
using test::from;
using test::make_inputs;
using test::node_name;
using test::normal;
using test::normal_values;
using test::same_bits;

F::Pool2dOptions pool_options(int64_t kernel, int64_t stride = 0, int64_t padding = 0,
                              int64_t dilation = 1) {
  F::Pool2dOptions o;
  o.kernel_size = {kernel, kernel};
  o.stride = {stride, stride};
  o.padding = {padding, padding};
  o.dilation = {dilation, dilation};
  return o;
}

Tensor fused(Inputs& in, bool training = true, const F::Pool2dOptions& pool = pool_options(2)) {
  return F::batch_norm_relu_max_pool2d(in.x, in.running_mean, in.running_var, in.weight, in.bias,
                                       training, 0.1, 1e-5, pool);
}

// The three ops in turn.
Tensor composed(Inputs& in, bool training = true, const F::Pool2dOptions& pool = pool_options(2)) {
  return F::max_pool2d(core::relu(F::batch_norm(in.x, in.running_mean, in.running_var, in.weight,
                                                in.bias, training, 0.1, 1e-5)),
                       pool);
}

// The outputs, running statistics and gradients (for the gradient `grad` of the output) of a
// and b, to the bit.
void check_same_results(Inputs& a, const Tensor& ya, Inputs& b, const Tensor& yb,
                        const Tensor& grad) {
  CHECK(same_bits(ya, yb));
  if (a.running_mean.defined()) {
    CHECK(same_bits(a.running_mean, b.running_mean));
    CHECK(same_bits(a.running_var, b.running_var));
  }
  ya.backward(grad);
  yb.backward(grad);
  CHECK(same_bits(a.x.grad(), b.x.grad()));
  if (a.weight.defined()) {
    CHECK(same_bits(a.weight.grad(), b.weight.grad()));
    CHECK(same_bits(a.bias.grad(), b.bias.grad()));
  }
}

}  // namespace

TEST_CASE("batch_norm_relu_max_pool2d in training is bitwise the three ops, at 1 to 3 threads") {
  test::ThreadCount restore;
  // The Fashion-MNIST CNN's two maps, an odd plane (last row and column left out), an odd width
  // only, a plane of exactly 8 elements with one window per row.
  const std::vector<Shape> shapes{
      {64, 16, 28, 28}, {8, 32, 14, 14}, {5, 3, 7, 7}, {4, 3, 9, 10}, {3, 2, 4, 2}};
  for (const Shape& shape : shapes) {
    for (int threads : {1, 2, 3}) {
      CAPTURE(shape);
      CAPTURE(threads);
      core::set_num_threads(threads);
      const Inputs start = make_inputs(shape);
      Inputs a = start.copy(), b = start.copy();
      Tensor ya = fused(a), yb = composed(b);
      REQUIRE(node_name(ya) == std::string(kFusedNode));
      // A gradient with a -0 and a +0 in it, which max pooling's backward turns into +0.
      Tensor grad = normal(yb.shape(), 6);
      {
        core::NoGradGuard no_grad;
        Tensor flat = grad.reshape({-1});
        flat.narrow(0, 0, 1).fill_(-0.0);
        flat.narrow(0, 1, 1).fill_(0.0);
      }
      check_same_results(a, ya, b, yb, grad);
    }
  }
}

TEST_CASE("batch_norm_relu_max_pool2d breaks ties, NaN, -0 and +0 as the three ops do") {
  test::ThreadCount restore;
  const Shape shape{6, 4, 6, 8};
  const int64_t inner = 48;
  // Channel 0: weight 0, bias -0: fma(x, 0, -0) is -0 for x < 0 and +0 for x > 0, so windows tie
  // +0 with -0. Channel 1: x from three values, so windows tie on positive maxima. Channel 2: one
  // NaN in one plane, which makes the channel's statistics, output and gradients NaN. Channel 3:
  // weight 0, bias 0 (every element +0).
  std::vector<double> x = normal_values(shape.numel(), 12, 0.0, 1.0);
  for (int64_t n = 0; n < shape[0]; ++n) {
    for (int64_t i = 0; i < inner; ++i) {
      double& v = x[size_t((n * 4 + 1) * inner + i)];
      v = std::round(v * 1.2);
    }
  }
  x[size_t((3 * 4 + 2) * inner + 17)] = std::numeric_limits<double>::quiet_NaN();
  Inputs start;
  start.x = from(x, shape);
  start.weight = from({0.0, 1.3, 0.8, 0.0}, {4});
  start.bias = from({-0.0, 0.2, -0.1, 0.0}, {4});
  start.running_mean = from({0.0, 0.1, 0.2, 0.3}, {4});
  start.running_var = from({1.0, 1.5, 2.0, 2.5}, {4});
  for (int threads : {1, 2, 3}) {
    CAPTURE(threads);
    core::set_num_threads(threads);
    Inputs a = start.copy(), b = start.copy();
    Tensor ya = fused(a), yb = composed(b);
    REQUIRE(node_name(ya) == std::string(kFusedNode));
    // The cases are there: -0 wins some windows of channel 0, NaN fills channel 2.
    const std::vector<float> out = ya.to_vector<float>();
    int negative_zeros = 0, nans = 0;
    for (float v : out) {
      negative_zeros += v == 0.0f && std::signbit(v);
      nans += std::isnan(v);
    }
    CHECK(negative_zeros > 0);
    CHECK(nans == shape[0] * 3 * 4);
    check_same_results(a, ya, b, yb, normal(yb.shape(), 13));
  }
}

TEST_CASE("batch_norm_relu_max_pool2d without running statistics or affine parameters") {
  const Shape shape{4, 5, 6, 6};
  for (bool affine : {true, false}) {
    CAPTURE(affine);
    const Inputs start = make_inputs(shape);
    Inputs a = start.copy(), b = start.copy();
    a.running_mean = a.running_var = b.running_mean = b.running_var = Tensor();
    if (!affine) a.weight = a.bias = b.weight = b.bias = Tensor();
    Tensor ya = fused(a), yb = composed(b);
    CHECK(node_name(ya) == std::string(kFusedNode));
    check_same_results(a, ya, b, yb, normal(yb.shape(), 11));
  }
}

TEST_CASE("batch_norm_relu_max_pool2d is the composition where it does not fuse") {
  const Shape shape{4, 3, 6, 6};
  struct Case {
    std::string name;
    bool training;
    F::Pool2dOptions pool;
    core::DType dtype;
    Shape shape;
  };
  const std::vector<Case> cases{
      {"eval mode", false, pool_options(2), core::kFloat32, shape},
      {"3x3 windows", true, pool_options(3), core::kFloat32, shape},
      {"overlapping windows (stride 1)", true, pool_options(2, 1), core::kFloat32, shape},
      {"stride 3", true, pool_options(2, 3), core::kFloat32, shape},
      {"padding", true, pool_options(2, 0, 1), core::kFloat32, shape},
      {"dilation", true, pool_options(2, 0, 0, 2), core::kFloat32, shape},
      {"Float64", true, pool_options(2), core::kFloat64, shape},
      {"a plane under 8 elements", true, pool_options(2), core::kFloat32, {4, 3, 2, 3}},
      {"one row: smaller than the window",
       true,
       pool_options(2, 0, 0, 1),
       core::kFloat32,
       {4, 3, 1, 9}},
      {"one row, padded", true, pool_options(2, 0, 1), core::kFloat32, {4, 3, 1, 9}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const Inputs start = make_inputs(c.shape, c.dtype);
    Inputs a = start.copy(), b = start.copy();
    bool thrown_a = false, thrown_b = false;
    Tensor ya, yb;
    try {
      ya = fused(a, c.training, c.pool);
    } catch (const core::Error&) {
      thrown_a = true;
    }
    try {
      yb = composed(b, c.training, c.pool);
    } catch (const core::Error&) {
      thrown_b = true;
    }
    REQUIRE(thrown_a == thrown_b);
    if (thrown_a) continue;  // the one row without padding: too small for the window
    CHECK(node_name(ya) != std::string(kFusedNode));
    check_same_results(a, ya, b, yb, normal(yb.shape(), 8, 0.0, 1.0, c.dtype));
  }
  SUBCASE("an empty batch and a 3-d input fail or compose as the three ops do") {
    for (const Shape& s : {Shape{0, 3, 4, 4}, Shape{3, 4, 4}}) {
      CAPTURE(s);
      Inputs a = make_inputs({2, s.size() == 4 ? 3 : 4, 4, 4});
      a.x = Tensor::from_vector(std::vector<double>(size_t(s.numel()), 1.0), s, core::kFloat64)
                .to(core::kFloat32)
                .set_requires_grad(true);
      Inputs b = a.copy();
      bool thrown_a = false, thrown_b = false;
      Tensor ya, yb;
      try {
        ya = fused(a);
      } catch (const core::Error&) {
        thrown_a = true;
      }
      try {
        yb = composed(b);
      } catch (const core::Error&) {
        thrown_b = true;
      }
      CHECK(thrown_a == thrown_b);
      if (!thrown_a) {
        CHECK(node_name(ya) != std::string(kFusedNode));
        CHECK(same_bits(ya, yb));
      }
    }
  }
}

TEST_CASE(
    "batch_norm_relu_max_pool2d's create_graph backward gives the composition's "
    "derivatives") {
  for (const Shape& shape : {Shape{6, 3, 4, 4}, Shape{3, 2, 5, 7}}) {
    CAPTURE(shape);
    test::check_create_graph_matches(
        make_inputs(shape), [](Inputs& in) { return fused(in); },
        [](Inputs& in) { return composed(in); }, 9, kFusedNode);
  }
}

TEST_CASE("Sequential fuses exactly a training BatchNorm2d, a ReLU and a 2x2 MaxPool2d") {
  const Shape shape{4, 3, 6, 6};
  Tensor x = normal(shape, 10);
  const auto input = [&] { return x.detach().clone().set_requires_grad(true); };
  const auto bn = [] { return std::make_shared<nn::BatchNorm2d>(3); };
  const auto relu = [] { return std::make_shared<nn::ReLU>(); };
  SUBCASE("fused in training, composed in eval") {
    nn::Sequential seq{bn(), relu(), std::make_shared<nn::MaxPool2d>(2)};
    CHECK(node_name(seq.forward(input())) == std::string(kFusedNode));
    nn::Sequential explicit_stride{bn(), relu(), std::make_shared<nn::MaxPool2d>(2, 2)};
    CHECK(node_name(explicit_stride.forward(input())) == std::string(kFusedNode));
    seq.eval();
    CHECK(node_name(seq.forward(input())) == std::string("MaxPool2dBackward"));
  }
  SUBCASE("other windows, another module between, or a subclass: not fused") {
    struct ScaledBatchNorm : nn::BatchNorm2d {
      using nn::BatchNorm2d::BatchNorm2d;
      Tensor forward(const Tensor& in) override {
        return core::mul(nn::BatchNorm2d::forward(in), core::scalar_like(2.0, in));
      }
    };
    std::vector<std::shared_ptr<nn::Sequential>> models{
        std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
            bn(), relu(), std::make_shared<nn::MaxPool2d>(3)}),
        std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
            bn(), relu(), std::make_shared<nn::MaxPool2d>(2, 1)}),
        std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
            bn(), relu(), std::make_shared<nn::MaxPool2d>(2, 2, 1)}),
        std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
            bn(), relu(), std::make_shared<nn::Identity>(), std::make_shared<nn::MaxPool2d>(2)}),
        std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
            std::make_shared<ScaledBatchNorm>(3), relu(), std::make_shared<nn::MaxPool2d>(2)}),
    };
    for (size_t i = 0; i < models.size(); ++i) {
      CAPTURE(i);
      Tensor y = models[i]->forward(input());
      CHECK(node_name(y) == std::string("MaxPool2dBackward"));
      // Module by module: the same result.
      Tensor ref = input();
      for (const auto& [name, child] : models[i]->named_children()) ref = child->forward(ref);
      CHECK(same_bits(y, ref));
    }
  }
}

TEST_CASE("a convolution under bf16 autocast then the fused op is the modules run one by one") {
  const auto build = [] {
    core::Generator generator(3);
    return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Conv2d>(2, 4, 3, generator, 1, 1),
        std::make_shared<nn::BatchNorm2d>(4), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::MaxPool2d>(2)});
  };
  auto model = build(), reference = build();
  Tensor x = normal({4, 2, 10, 10}, 21);
  core::AutocastGuard autocast(core::kBFloat16);
  Tensor y = model->forward(x);
  Tensor ref = x;
  for (const auto& [name, child] : reference->named_children()) ref = child->forward(ref);
  CHECK(same_bits(y, ref));
  Tensor grad = normal(y.shape(), 22, 0.0, 1.0, y.dtype());
  y.backward(grad);
  ref.backward(grad);
  const auto a = model->named_parameters(), b = reference->named_parameters();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CAPTURE(a[i].first);
    CHECK(same_bits(a[i].second.grad(), b[i].second.grad()));
  }
}
