// Module tests: dotted names in registration order, printing, train/eval, to(), zero_grad,
// parameter counts, and state_dict / load_state_dict strict and non-strict.
#include <doctest/doctest.h>

#include <memory>

#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/batch_norm.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/layers/conv.h"
#include "mpigrad/nn/layers/dropout.h"
#include "mpigrad/nn/layers/linear.h"
#include "mpigrad/nn/layers/pooling.h"

namespace {

using namespace mpigrad;  // NOLINT
using core::Tensor;

// A small CNN shaped like the ones the training program builds: features + classifier.
class SmallNet : public nn::Module {
 public:
  explicit SmallNet(core::Generator& g) {
    features = register_module(
        "features",
        std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
            std::make_shared<nn::Conv2d>(1, 4, 3, g, 1, 1), std::make_shared<nn::BatchNorm2d>(4),
            std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2)}));
    classifier = register_module(
        "classifier",
        std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
            std::make_shared<nn::Flatten>(), std::make_shared<nn::Dropout>(0.5),
            std::make_shared<nn::Linear>(16, 3, g)}));
  }
  Tensor forward(const Tensor& x) override { return (*classifier)((*features)(x)); }
  std::string type_name() const override { return "SmallNet"; }
  std::shared_ptr<nn::Sequential> features, classifier;
};

std::vector<std::string> keys(const nn::StateDict& state) {
  std::vector<std::string> out;
  for (const auto& [key, tensor] : state.tensors()) out.push_back(key);
  return out;
}

}  // namespace

TEST_CASE("module tree: PyTorch names, order, counts and printing") {
  core::Generator g(1);
  SmallNet net(g);
  const std::vector<std::string> expected = {"features.0.weight",
                                             "features.0.bias",
                                             "features.1.weight",
                                             "features.1.bias",
                                             "features.1.running_mean",
                                             "features.1.running_var",
                                             "features.1.num_batches_tracked",
                                             "classifier.2.weight",
                                             "classifier.2.bias"};
  CHECK(keys(net.state_dict()) == expected);
  std::vector<std::string> params;
  for (auto& [name, p] : net.named_parameters()) params.push_back(name);
  CHECK(params == std::vector<std::string>{"features.0.weight", "features.0.bias",
                                           "features.1.weight", "features.1.bias",
                                           "classifier.2.weight", "classifier.2.bias"});
  CHECK(net.num_parameters() == 4 * 9 + 4 + 4 + 4 + 16 * 3 + 3);
  CHECK(net.named_children().size() == 2);
  CHECK(net.named_modules().size() == 10);
  CHECK(net.named_generators().size() == 1);
  CHECK(net.named_generators()[0].first == "classifier.1.generator");
  CHECK(net.str() ==
        "SmallNet(\n"
        "  (features): Sequential(\n"
        "    (0): Conv2d(1, 4, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))\n"
        "    (1): BatchNorm2d(4, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)\n"
        "    (2): ReLU()\n"
        "    (3): MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)\n"
        "  )\n"
        "  (classifier): Sequential(\n"
        "    (0): Flatten(start_dim=1, end_dim=-1)\n"
        "    (1): Dropout(p=0.5, inplace=False)\n"
        "    (2): Linear(in_features=16, out_features=3, bias=True)\n"
        "  )\n"
        ")");
}

TEST_CASE("module: train/eval, to(dtype), zero_grad") {
  core::Generator g(2);
  SmallNet net(g);
  CHECK(net.features->is_training());
  net.eval();
  CHECK_FALSE((*net.features)[1]->is_training());
  net.train();
  CHECK((*net.classifier)[1]->is_training());

  net.to(core::kFloat64);
  for (auto& [name, t] : net.state_dict().tensors()) {
    if (name.find("num_batches_tracked") != std::string::npos) {
      CHECK(t.dtype() == core::kInt64);
    } else {
      CHECK(t.dtype() == core::kFloat64);
    }
  }
  for (auto& p : net.parameters()) CHECK(p.requires_grad());
  Tensor loss = core::sum(net(core::ones({2, 1, 4, 4}, core::kFloat64)));
  loss.backward();
  for (auto& p : net.parameters()) CHECK(p.grad().defined());
  net.zero_grad(false);
  for (auto& p : net.parameters()) CHECK(core::sum(core::abs(p.grad())).item<double>() == 0.0);
  net.zero_grad();
  for (auto& p : net.parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("load_state_dict: values, strict and non-strict key reports, shape errors") {
  core::Generator g1(3), g2(4);
  SmallNet a(g1), b(g2);
  CHECK(a.parameters()[0].to_vector<float>() != b.parameters()[0].to_vector<float>());
  nn::LoadResult result = b.load_state_dict(a.state_dict());
  CHECK(result.missing_keys.empty());
  CHECK(result.unexpected_keys.empty());
  for (size_t i = 0; i < a.parameters().size(); ++i) {
    CHECK(a.parameters()[i].to_vector<float>() == b.parameters()[i].to_vector<float>());
    CHECK_FALSE(a.parameters()[i].is_same(b.parameters()[i]));  // copied, not aliased
  }
  // Loads across dtypes (map_location-like): a float64 state into a float32 model.
  SmallNet c(g2);
  nn::StateDict wide;
  for (auto& [key, t] : a.state_dict().tensors())
    wide.set(key, t.to(core::is_floating(t.dtype()) ? core::kFloat64 : t.dtype()));
  c.load_state_dict(wide);
  CHECK(c.parameters()[0].dtype() == core::kFloat32);
  CHECK(c.parameters()[0].to_vector<float>() == a.parameters()[0].to_vector<float>());

  nn::StateDict partial = a.state_dict();
  nn::StateDict missing_one;
  for (auto& [key, t] : partial.tensors()) {
    if (key != "classifier.2.bias") missing_one.set(key, t);
  }
  missing_one.set("classifier.9.weight", core::zeros({1}));
  CHECK_THROWS_WITH_AS(b.load_state_dict(missing_one),
                       doctest::Contains("missing key(s): 'classifier.2.bias'"), core::Error);
  CHECK_THROWS_WITH_AS(b.load_state_dict(missing_one),
                       doctest::Contains("unexpected key(s): 'classifier.9.weight'"), core::Error);
  result = b.load_state_dict(missing_one, false);
  CHECK(result.missing_keys == std::vector<std::string>{"classifier.2.bias"});
  CHECK(result.unexpected_keys == std::vector<std::string>{"classifier.9.weight"});

  nn::StateDict wrong = a.state_dict();
  wrong.set("features.0.weight", core::zeros({4, 1, 5, 5}));
  CHECK_THROWS_WITH_AS(
      b.load_state_dict(wrong, false),
      doctest::Contains(
          "size mismatch for 'features.0.weight': the model expects shape [4, 1, 3, 3], "
          "the state dict has [4, 1, 5, 5]"),
      core::Error);
  nn::StateDict wrong_type = a.state_dict();
  wrong_type.set("features.1.num_batches_tracked", core::zeros({}, core::kFloat32));
  CHECK_THROWS_WITH_AS(b.load_state_dict(wrong_type),
                       doctest::Contains("dtype mismatch for 'features.1.num_batches_tracked'"),
                       core::Error);
}
