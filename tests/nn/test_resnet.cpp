// ResNet's residual block (finite-difference gradients in train and eval mode, with and without
// the downsample shortcut) and the ResNet models: torchvision's parameter names, shapes per
// stem, the encoder-only form and the checks on depth.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/nn/layers/basic_block.h"
#include "mpigrad/nn/models.h"

using namespace mpigrad;
using core::Tensor;
using test::fd_input;
using test::gradient_mismatch;

namespace {

std::vector<Tensor> leaves_of(const Tensor& input, nn::Module& module) {
  std::vector<Tensor> leaves{input};
  for (const Tensor& parameter : module.parameters()) leaves.push_back(parameter);
  return leaves;
}

std::vector<std::string> names_of(const nn::Module& module) {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : module.state_dict().tensors()) names.push_back(name);
  return names;
}

bool has(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

TEST_CASE("BasicBlock: gradients in train and eval mode, identity and downsample shortcuts") {
  struct Case {
    int64_t in, out, stride;
    bool downsample;
  };
  for (const Case& c :
       {Case{2, 2, 1, false}, Case{2, 3, 2, true}, Case{2, 3, 1, true}, Case{3, 3, 2, true}}) {
    CAPTURE(c.in);
    CAPTURE(c.out);
    CAPTURE(c.stride);
    core::Generator generator(5);
    nn::BasicBlock block(c.in, c.out, c.stride, generator);
    CHECK(block.has_downsample() == c.downsample);
    block.to(core::kFloat64);
    Tensor x = fd_input({3, c.in, 4, 4}, 11);
    Tensor y = block(x);
    CHECK(y.shape() == core::Shape({3, c.out, 4 / c.stride, 4 / c.stride}));

    std::string mismatch = gradient_mismatch(leaves_of(x, block), [&] { return block(x); });
    CHECK_MESSAGE(mismatch.empty(), "train mode: " << mismatch);

    // Eval mode normalizes with the running statistics the train-mode passes left behind.
    block.eval();
    mismatch = gradient_mismatch(
        leaves_of(x, block), [&] { return block(x); }, 2);
    CHECK_MESSAGE(mismatch.empty(), "eval mode: " << mismatch);
  }
}

TEST_CASE("BasicBlock adds the shortcut: zero conv weights leave relu(shortcut)") {
  core::Generator generator(1);
  nn::BasicBlock block(2, 2, 1, generator);
  block.to(core::kFloat64);
  block.eval();
  {
    core::NoGradGuard no_grad;
    for (auto& [name, parameter] : block.named_parameters()) {
      if (name.ends_with("conv2.weight")) parameter.zero_();
    }
  }
  Tensor x = fd_input({1, 2, 3, 3}, 3);
  const std::vector<double> input = x.to_vector<double>(), output = block(x).to_vector<double>();
  for (size_t i = 0; i < input.size(); ++i) {
    CHECK(output[i] == doctest::Approx(std::max(0.0, input[i])));
  }
}

TEST_CASE("ResNet-18: torchvision's names, the small stem and the encoder-only form") {
  core::Generator generator(0);
  auto model = nn::make_resnet({3, 32, 32}, 18, 8, 10, generator);
  CHECK(model->small_stem());
  const std::vector<std::string> names = names_of(*model);
  for (const char* name :
       {"conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var",
        "bn1.num_batches_tracked", "layer1.0.conv1.weight", "layer1.0.bn1.running_mean",
        "layer1.1.conv2.weight", "layer2.0.downsample.0.weight", "layer2.0.downsample.1.weight",
        "layer2.0.downsample.1.running_var", "layer4.1.bn2.bias", "fc.weight", "fc.bias"}) {
    CHECK_MESSAGE(has(names, name), name);
  }
  CHECK_FALSE(has(names, "layer1.0.downsample.0.weight"));  // stage 1 keeps shape: identity
  CHECK_FALSE(has(names, "conv1.bias"));
  CHECK(model->state_dict().at("conv1.weight").shape() == core::Shape({8, 3, 3, 3}));
  CHECK(model->state_dict().at("layer4.0.downsample.0.weight").shape() ==
        core::Shape({64, 32, 1, 1}));
  CHECK(model->state_dict().at("fc.weight").shape() == core::Shape({10, 64}));
  Tensor x = core::zeros({2, 3, 32, 32});
  CHECK(model->forward(x).shape() == core::Shape({2, 10}));

  core::Generator same(0);
  auto encoder = nn::make_resnet({3, 32, 32}, 18, 8, 0, same);
  CHECK_FALSE(has(names_of(*encoder), "fc.weight"));
  CHECK(encoder->feature_count() == 64);
  CHECK(encoder->forward(x).shape() == core::Shape({2, 64}));
  // Same seed: the encoder's weights are the classifier's, entry by entry.
  for (const auto& [name, tensor] : encoder->state_dict().tensors()) {
    CHECK(tensor.to_vector<double>() == model->state_dict().at(name).to_vector<double>());
  }
}

TEST_CASE("ResNet-34's stages, the 28-pixel small stem and the ImageNet stem") {
  core::Generator generator(0);
  auto deep = nn::make_resnet({1, 28, 28}, 34, 4, 10, generator);
  const std::vector<std::string> names = names_of(*deep);
  CHECK(has(names, "layer3.5.conv2.weight"));
  CHECK_FALSE(has(names, "layer3.6.conv2.weight"));
  CHECK(has(names, "layer4.2.bn1.weight"));
  CHECK(deep->forward(core::zeros({1, 1, 28, 28})).shape() == core::Shape({1, 10}));

  auto large = nn::make_resnet({3, 64, 64}, 18, 4, 5, generator);
  CHECK_FALSE(large->small_stem());
  CHECK(large->state_dict().at("conv1.weight").shape() == core::Shape({4, 3, 7, 7}));
  CHECK(large->forward(core::zeros({1, 3, 64, 64})).shape() == core::Shape({1, 5}));

  CHECK_THROWS_WITH_AS(nn::make_resnet({3, 32, 32}, 50, 8, 10, generator),
                       doctest::Contains("depth must be 18 or 34"), core::Error);
}

TEST_CASE("ResNet: the whole model's gradients (depth 18, width 2, 16 pixels)") {
  core::Generator generator(3);
  auto model = nn::make_resnet({1, 16, 16}, 18, 2, 3, generator);
  model->to(core::kFloat64);
  Tensor x = fd_input({2, 1, 16, 16}, 4);
  // A few leaves only: the input, the stem conv, a downsample conv and fc (the rest are the
  // block's, checked above); every element of each is perturbed.
  std::vector<Tensor> leaves{x};
  for (auto& [name, parameter] : model->named_parameters()) {
    if (name == "layer3.1.conv2.weight" || name == "layer3.0.downsample.0.weight" ||
        name == "fc.weight") {
      leaves.push_back(parameter);
    }
  }
  REQUIRE(leaves.size() == 4);
  const std::string mismatch = gradient_mismatch(
      leaves, [&] { return model->forward(x); }, 3, 1e-6, 1e-5, 1e-4);
  CHECK_MESSAGE(mismatch.empty(), mismatch);
}

TEST_CASE("BasicBlock in float32 agrees with float64: forward and gradients (the training path)") {
  // The gradient checks above run in float64; training runs float32 kernels, checked here
  // against the float64 result on the same weights and input.
  struct Case {
    int64_t in, out, stride, size;
  };
  for (const Case& c :
       {Case{4, 4, 1, 8}, Case{4, 8, 2, 8}, Case{8, 16, 2, 4}, Case{16, 32, 2, 8}}) {
    CAPTURE(c.stride);
    CAPTURE(c.size);
    core::Generator generator(9);
    nn::BasicBlock wide(c.in, c.out, c.stride, generator);
    core::Generator same(9);
    nn::BasicBlock narrow(c.in, c.out, c.stride, same);
    wide.to(core::kFloat64);
    Tensor x64 = fd_input({8, c.in, c.size, c.size}, 5);
    Tensor x32 = x64.to(core::kFloat32).detach();
    x32.set_requires_grad(true);
    x64.set_requires_grad(true);
    Tensor y64 = wide(x64), y32 = narrow(x32);
    const std::vector<double> weights = test::fd_weights(y64.numel(), 4);
    core::sum(y64 * Tensor::from_vector(weights, y64.shape(), core::kFloat64)).backward();
    core::sum(y32 * Tensor::from_vector(weights, y32.shape(), core::kFloat64).to(core::kFloat32))
        .backward();
    auto relative = [](const Tensor& a, const Tensor& b) {
      const std::vector<double> u = a.to(core::kFloat64).to_vector<double>();
      const std::vector<double> v = b.to(core::kFloat64).to_vector<double>();
      double diff = 0, norm = 0;
      for (size_t i = 0; i < u.size(); ++i) {
        diff += (u[i] - v[i]) * (u[i] - v[i]);
        norm += v[i] * v[i];
      }
      return std::sqrt(diff / std::max(norm, 1e-300));
    };
    CHECK(relative(y32, y64) < 1e-5);
    CHECK_MESSAGE(relative(x32.grad(), x64.grad()) < 1e-4, "input gradient");
    const auto p32 = narrow.named_parameters(), p64 = wide.named_parameters();
    for (size_t i = 0; i < p32.size(); ++i) {
      CHECK_MESSAGE(relative(p32[i].second.grad(), p64[i].second.grad()) < 1e-4, p32[i].first);
    }
  }
}

TEST_CASE("ResNet in float32 agrees with float64: every parameter's gradient") {
  core::Generator g64(4), g32(4);
  auto wide = nn::make_resnet({3, 16, 16}, 18, 4, 10, g64);
  auto narrow = nn::make_resnet({3, 16, 16}, 18, 4, 10, g32);
  wide->to(core::kFloat64);
  Tensor x64 = fd_input({8, 3, 16, 16}, 6, 0.0, 1.0);
  Tensor x32 = x64.to(core::kFloat32).detach();
  const std::vector<double> weights = test::fd_weights(80, 2);
  core::sum(wide->forward(x64) * Tensor::from_vector(weights, {8, 10}, core::kFloat64)).backward();
  core::sum(narrow->forward(x32) *
            Tensor::from_vector(weights, {8, 10}, core::kFloat64).to(core::kFloat32))
      .backward();
  const auto p32 = narrow->named_parameters(), p64 = wide->named_parameters();
  for (size_t i = 0; i < p32.size(); ++i) {
    const std::vector<double> u = p32[i].second.grad().to(core::kFloat64).to_vector<double>();
    const std::vector<double> v = p64[i].second.grad().to_vector<double>();
    double diff = 0, norm = 0;
    for (size_t k = 0; k < u.size(); ++k) {
      diff += (u[k] - v[k]) * (u[k] - v[k]);
      norm += v[k] * v[k];
    }
    CHECK_MESSAGE(std::sqrt(diff / std::max(norm, 1e-300)) < 1e-4, p32[i].first, " ",
                  std::sqrt(diff / std::max(norm, 1e-300)));
  }
}

TEST_CASE("BasicBlock: input gradient at wider channel counts (stride 2, 8 pixels)") {
  for (int64_t channels : {8, 16}) {
    CAPTURE(channels);
    core::Generator generator(7);
    nn::BasicBlock block(channels, 2 * channels, 2, generator);
    block.to(core::kFloat64);
    Tensor x = fd_input({2, channels, 8, 8}, 12);
    const std::string mismatch = gradient_mismatch({x}, [&] { return block(x); });
    CHECK_MESSAGE(mismatch.empty(), mismatch);
  }
}
