// ResNet's residual block (finite-difference gradients in train and eval mode, with and without
// the downsample shortcut) and the ResNet models: torchvision's parameter names, shapes per
// stem, the encoder-only form and the checks on depth.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
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
  for (const Case& c : {Case{2, 2, 1, false}, Case{2, 3, 2, true}, Case{2, 3, 1, true},
                        Case{3, 3, 2, true}}) {
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
    mismatch = gradient_mismatch(leaves_of(x, block), [&] { return block(x); }, 2);
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
  for (size_t i = 0; i < input.size(); ++i) CHECK(output[i] == doctest::Approx(std::max(0.0, input[i])));
}

TEST_CASE("ResNet-18: torchvision's names, the small stem and the encoder-only form") {
  core::Generator generator(0);
  auto model = nn::make_resnet({3, 32, 32}, 18, 8, 10, generator);
  CHECK(model->small_stem());
  const std::vector<std::string> names = names_of(*model);
  for (const char* name : {"conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean",
                           "bn1.running_var", "bn1.num_batches_tracked", "layer1.0.conv1.weight",
                           "layer1.0.bn1.running_mean", "layer1.1.conv2.weight",
                           "layer2.0.downsample.0.weight", "layer2.0.downsample.1.weight",
                           "layer2.0.downsample.1.running_var", "layer4.1.bn2.bias", "fc.weight",
                           "fc.bias"}) {
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

TEST_CASE("ResNet: the whole model's gradients (depth 18, width 2, 8 pixels)") {
  core::Generator generator(3);
  auto model = nn::make_resnet({1, 8, 8}, 18, 2, 3, generator);
  model->to(core::kFloat64);
  Tensor x = fd_input({2, 1, 8, 8}, 4);
  // A few leaves only: the input, the stem conv, a downsample conv and fc (the rest are the
  // block's, checked above); every element of each is perturbed.
  std::vector<Tensor> leaves{x};
  for (auto& [name, parameter] : model->named_parameters()) {
    if (name == "conv1.weight" || name == "layer3.0.downsample.0.weight" || name == "fc.weight") {
      leaves.push_back(parameter);
    }
  }
  REQUIRE(leaves.size() == 4);
  const std::string mismatch = gradient_mismatch(leaves, [&] { return model->forward(x); }, 3,
                                                 1e-6, 1e-5, 1e-4);
  CHECK_MESSAGE(mismatch.empty(), mismatch);
}
