// Every nn layer and loss on CUDA against the CPU: outputs, input and parameter gradients and
// running statistics, in float32 and float64 (see compare_module in nn_cuda_test.h).
#include <doctest/doctest.h>

#include <cmath>
#include <memory>

#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/batch_norm.h"
#include "mpigrad/nn/layers/conv.h"
#include "mpigrad/nn/layers/dropout.h"
#include "mpigrad/nn/layers/layer_norm.h"
#include "mpigrad/nn/layers/linear.h"
#include "mpigrad/nn/layers/pooling.h"
#include "mpigrad/nn/loss.h"
#include "nn_cuda_test.h"

namespace {

using namespace mpigrad;  // NOLINT
using core::Tensor;
using test::compare_module;

const core::DType kDtypes[] = {core::kFloat32, core::kFloat64};

MPIGRAD_NN_CUDA_TEST_CASE("Linear on CUDA matches the CPU") {
  for (core::DType dtype : kDtypes) {
    compare_module(
        "Linear 7->5",
        [] {
          core::Generator g(1);
          return std::make_unique<nn::Linear>(7, 5, g);
        },
        {6, 7}, dtype, true);
    compare_module(
        "Linear no bias, 3-d input",
        [] {
          core::Generator g(2);
          return std::make_unique<nn::Linear>(4, 3, g, false);
        },
        {2, 3, 4}, dtype, true);
  }
}

MPIGRAD_NN_CUDA_TEST_CASE(
    "Conv2d on CUDA (cuDNN) matches the CPU: stride, padding, dilation, groups") {
  struct Case {
    const char* label;
    nn::Conv2dConfig config;
    core::Shape input;
  };
  const Case cases[] = {
      {"3x3 pad 1", {4, 6, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true}, {2, 4, 9, 8}},
      {"3x3 stride 2", {3, 5, {3, 3}, {2, 2}, {0, 0}, {1, 1}, 1, true}, {2, 3, 11, 10}},
      {"5x3 stride 2x1 pad 2x1", {2, 4, {5, 3}, {2, 1}, {2, 1}, {1, 1}, 1, false}, {3, 2, 9, 7}},
      {"groups 2 dilation 2", {4, 6, {3, 3}, {1, 2}, {1, 2}, {2, 2}, 2, true}, {2, 4, 10, 12}},
      {"depthwise", {6, 6, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 6, true}, {2, 6, 7, 7}},
      {"1x1", {5, 3, {1, 1}, {1, 1}, {0, 0}, {1, 1}, 1, true}, {2, 5, 4, 4}},
  };
  for (core::DType dtype : kDtypes) {
    for (const Case& c : cases) {
      compare_module(
          c.label,
          [&] {
            core::Generator g(3);
            return std::make_unique<nn::Conv2d>(c.config, g);
          },
          c.input, dtype, true);
    }
  }
}

MPIGRAD_NN_CUDA_TEST_CASE("BatchNorm on CUDA (cuDNN) matches the CPU in train and eval mode") {
  for (core::DType dtype : kDtypes) {
    // Three training steps: the running statistics evolve and are compared after each.
    compare_module(
        "BatchNorm2d train", [] { return std::make_unique<nn::BatchNorm2d>(3); }, {4, 3, 5, 6},
        dtype, true, 3);
    compare_module(
        "BatchNorm2d eval", [] { return std::make_unique<nn::BatchNorm2d>(3); }, {4, 3, 5, 6},
        dtype, false);
    compare_module(
        "BatchNorm1d [N, C] train", [] { return std::make_unique<nn::BatchNorm1d>(5); }, {8, 5},
        dtype, true, 2);
    compare_module(
        "BatchNorm1d [N, C, L] train", [] { return std::make_unique<nn::BatchNorm1d>(4); },
        {3, 4, 7}, dtype, true);
    compare_module(
        "BatchNorm2d no affine, momentum None",
        [] { return std::make_unique<nn::BatchNorm2d>(2, 1e-3, std::nullopt, false); },
        {3, 2, 4, 4}, dtype, true, 2);
    compare_module(
        "BatchNorm2d without running stats",
        [] { return std::make_unique<nn::BatchNorm2d>(2, 1e-5, 0.1, true, false); }, {3, 2, 4, 4},
        dtype, true);
  }
}

MPIGRAD_NN_CUDA_TEST_CASE("LayerNorm on CUDA (hand-written kernel) matches the CPU") {
  for (core::DType dtype : kDtypes) {
    // Short rows take one warp per row; 3000 columns take one block per row.
    compare_module(
        "LayerNorm [*, 7]", [] { return std::make_unique<nn::LayerNorm>(std::vector<int64_t>{7}); },
        {9, 7}, dtype, true);
    compare_module(
        "LayerNorm [*, 3000]",
        [] { return std::make_unique<nn::LayerNorm>(std::vector<int64_t>{3000}); }, {5, 3000},
        dtype, true);
    compare_module(
        "LayerNorm [*, 3, 4] no affine",
        [] {
          return std::make_unique<nn::LayerNorm>(std::vector<int64_t>{3, 4}, 1e-5, false);
        },
        {2, 5, 3, 4}, dtype, true);
    compare_module(
        "LayerNorm many rows",
        [] { return std::make_unique<nn::LayerNorm>(std::vector<int64_t>{33}); }, {1030, 33}, dtype,
        true);
  }
}

MPIGRAD_NN_CUDA_TEST_CASE("pooling on CUDA (cuDNN) matches the CPU") {
  for (core::DType dtype : kDtypes) {
    compare_module(
        "MaxPool2d 3 stride 2 pad 1", [] { return std::make_unique<nn::MaxPool2d>(3, 2, 1); },
        {2, 3, 9, 8}, dtype, true);
    compare_module(
        "MaxPool2d 2", [] { return std::make_unique<nn::MaxPool2d>(2); }, {2, 3, 8, 8}, dtype,
        true);
    compare_module(
        "AvgPool2d 3 stride 2 pad 1", [] { return std::make_unique<nn::AvgPool2d>(3, 2, 1); },
        {2, 3, 9, 8}, dtype, true);
    compare_module(
        "AvgPool2d count_include_pad=false",
        [] {
          nn::functional::Pool2dOptions o;
          o.kernel_size = {3, 3};
          o.stride = {2, 2};
          o.padding = {1, 1};
          o.count_include_pad = false;
          return std::make_unique<nn::AvgPool2d>(o);
        },
        {2, 3, 9, 8}, dtype, true);
    compare_module(
        "AdaptiveAvgPool2d 1", [] { return std::make_unique<nn::AdaptiveAvgPool2d>(1); },
        {2, 4, 6, 6}, dtype, true);
    compare_module(
        "AdaptiveAvgPool2d 2x3",
        [] {
          return std::make_unique<nn::AdaptiveAvgPool2d>(std::array<int64_t, 2>{2, 3});
        },
        {2, 4, 8, 9}, dtype, true);
  }
}

MPIGRAD_NN_CUDA_TEST_CASE("activations on CUDA match the CPU") {
  for (core::DType dtype : kDtypes) {
    compare_module(
        "ReLU", [] { return std::make_unique<nn::ReLU>(); }, {5, 9}, dtype, true);
    compare_module(
        "GELU", [] { return std::make_unique<nn::GELU>(); }, {5, 9}, dtype, true);
    compare_module(
        "GELU tanh", [] { return std::make_unique<nn::GELU>(core::GeluApproximation::Tanh); },
        {5, 9}, dtype, true);
    compare_module(
        "SiLU", [] { return std::make_unique<nn::SiLU>(); }, {5, 9}, dtype, true);
    compare_module(
        "Tanh", [] { return std::make_unique<nn::Tanh>(); }, {5, 9}, dtype, true);
    compare_module(
        "Sigmoid", [] { return std::make_unique<nn::Sigmoid>(); }, {5, 9}, dtype, true);
  }
}

MPIGRAD_NN_CUDA_TEST_CASE("Dropout on CUDA keeps 1-p of the elements, scaled by 1/(1-p)") {
  const double p = 0.3;
  nn::Dropout dropout(p, nullptr, 1234);
  dropout.to(core::cuda(0));
  dropout.train();
  const int64_t n = int64_t(1) << 20;
  Tensor x = core::ones({n}, core::TensorOptions(core::kFloat32).device(core::cuda(0)));
  x.set_requires_grad(true);
  Tensor y = dropout.forward(x);
  core::sum(y).backward();
  const auto values = test::host_values(y);
  const auto grads = test::host_values(x.grad());
  int64_t kept = 0;
  bool scaled = true, grad_matches = true;
  for (int64_t i = 0; i < n; ++i) {
    if (values[size_t(i)] != 0.0) {
      ++kept;
      scaled = scaled && std::abs(values[size_t(i)] - 1.0 / (1.0 - p)) < 1e-6;
    }
    grad_matches = grad_matches && values[size_t(i)] == grads[size_t(i)];
  }
  const double fraction = double(kept) / double(n);
  // Binomial standard deviation at n = 2^20 is about 4.5e-4; 5e-3 is over 10 sigma.
  CHECK(std::abs(fraction - (1.0 - p)) < 5e-3);
  CHECK(scaled);
  CHECK(grad_matches);
  dropout.eval();
  Tensor z = dropout.forward(x.detach());
  CHECK(test::mismatch(z, x.detach(), {0, 0}).empty());
}

// A loss on CPU and CUDA: the value and the gradient of the first argument.
void compare_loss(const char* label,
                  const std::function<Tensor(const Tensor&, const Tensor&)>& loss,
                  const Tensor& input, const Tensor& target) {
  INFO(label);
  const test::Tolerance tol = test::tolerance_for(input.dtype());
  Tensor a = input.detach();
  a.set_requires_grad(true);
  Tensor b = input.detach().to(core::cuda(0));
  b.set_requires_grad(true);
  Tensor la = loss(a, target);
  Tensor lb = loss(b, target.to(core::cuda(0)));
  MPIGRAD_CHECK_CLOSE("loss", lb, la, tol);
  core::sum(la).backward();
  core::sum(lb).backward();
  MPIGRAD_CHECK_CLOSE("gradient", b.grad(), a.grad(), tol);
}

MPIGRAD_NN_CUDA_TEST_CASE("losses on CUDA match the CPU") {
  for (core::DType dtype : kDtypes) {
    Tensor logits = test::random_input({12, 7}, dtype, 5);
    Tensor labels = Tensor::from_vector<int64_t>({0, 6, 3, -100, 2, 2, 5, 1, 0, 4, -100, 6}, {12});
    for (double smoothing : {0.0, 0.1}) {
      for (nn::Reduction reduction :
           {nn::Reduction::Mean, nn::Reduction::Sum, nn::Reduction::None}) {
        nn::CrossEntropyOptions options;
        options.label_smoothing = smoothing;
        options.reduction = reduction;
        compare_loss(
            "cross_entropy",
            [&](const Tensor& x, const Tensor& t) { return nn::cross_entropy(x, t, options); },
            logits, labels);
      }
    }
    Tensor target = test::random_input({12, 7}, dtype, 6);
    compare_loss(
        "mse_loss", [](const Tensor& x, const Tensor& t) { return nn::mse_loss(x, t); }, logits,
        target);
    Tensor probabilities = core::sigmoid(target);
    compare_loss(
        "binary_cross_entropy_with_logits",
        [](const Tensor& x, const Tensor& t) { return nn::binary_cross_entropy_with_logits(x, t); },
        logits, probabilities);
  }
}

}  // namespace
