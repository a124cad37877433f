// Batch norm followed by ReLU as one op (functional::batch_norm_relu, BatchNorm::forward_relu and
// Sequential's pairing of the two modules) against the two run one after the other: the output,
// the running statistics and every gradient must match to the bit, at 1 and 2 threads, on shapes
// that take each kernel path. The fused op must run where it should (its node says so) and the
// composition where it should not: eval mode, Float64, a pair that is not exactly BatchNorm then
// ReLU. Without running statistics or affine parameters it must match too. A create_graph
// backward through the fused node must give the composition's first and second derivatives. The
// CNN that make_cnn builds keeps its modules, names and parameter count.
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "../thread_count.h"
#include "batch_norm_test_util.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/core/threads.h"
#include "mpigrad/nn/functional/normalization.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/batch_norm.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/models.h"
#include "mpigrad/nn/resnet.h"

namespace {

using namespace mpigrad;  // NOLINT
using core::Shape;
using core::Tensor;
namespace F = nn::functional;

using test::BatchNormInputs;
using test::make_inputs;
using test::node_name;
using test::normal;
using test::normal_values;
using test::same_bits;

Tensor fused(BatchNormInputs& in, bool training = true) {
  return F::batch_norm_relu(in.x, in.running_mean, in.running_var, in.weight, in.bias, training,
                            0.1, 1e-5);
}

Tensor composed(BatchNormInputs& in, bool training = true) {
  return core::relu(F::batch_norm(in.x, in.running_mean, in.running_var, in.weight, in.bias,
                                  training, 0.1, 1e-5));
}

void check_same_results(BatchNormInputs& a, const Tensor& ya, BatchNormInputs& b, const Tensor& yb,
                        const Tensor& grad) {
  CHECK(same_bits(ya, yb));
  CHECK(same_bits(a.running_mean, b.running_mean));
  CHECK(same_bits(a.running_var, b.running_var));
  ya.backward(grad);
  yb.backward(grad);
  CHECK(same_bits(a.x.grad(), b.x.grad()));
  CHECK(same_bits(a.weight.grad(), b.weight.grad()));
  CHECK(same_bits(a.bias.grad(), b.bias.grad()));
}

}  // namespace

TEST_CASE("batch_norm_relu in training is bitwise batch_norm then relu, forward and backward") {
  test::ThreadCount restore;
  // A Fashion-MNIST feature map (AVX2, rows a multiple of 8), rows with a tail, rows shorter than
  // a vector, BatchNorm1d's [N, C].
  const std::vector<Shape> shapes{{64, 16, 28, 28}, {5, 3, 7, 7}, {4, 3, 2, 2}, {6, 5}};
  for (const Shape& shape : shapes) {
    for (int threads : {1, 2}) {
      CAPTURE(shape);
      CAPTURE(threads);
      core::set_num_threads(threads);
      const BatchNormInputs start = make_inputs(shape);
      BatchNormInputs a = start.copy(), b = start.copy();
      Tensor ya = fused(a), yb = composed(b);
      CHECK(node_name(ya) == std::string("BatchNormReluBackward"));
      CHECK(node_name(yb) == std::string("relu"));
      // ReLU cuts a good part of the output, so its mask matters in the backward.
      const double zeros =
          core::sum(core::eq(ya, core::scalar_like(0.0, ya)).to(core::kFloat64)).item<double>() /
          double(ya.numel());
      CHECK(zeros > 0.2);
      CHECK(zeros < 0.8);
      check_same_results(a, ya, b, yb, normal(shape, 6, 0.0, 1.0));
    }
  }
}

TEST_CASE("batch_norm_relu without running statistics or affine parameters is bitwise the same") {
  const Shape shape{4, 5, 6, 6};
  for (bool affine : {true, false}) {
    CAPTURE(affine);
    const BatchNormInputs start = make_inputs(shape);
    BatchNormInputs a = start.copy(), b = start.copy();
    a.running_mean = a.running_var = b.running_mean = b.running_var = Tensor();
    if (!affine) a.weight = a.bias = b.weight = b.bias = Tensor();
    Tensor ya = fused(a), yb = composed(b);
    CHECK(node_name(ya) == std::string("BatchNormReluBackward"));
    CHECK(same_bits(ya, yb));
    Tensor grad = normal(shape, 11, 0.0, 1.0);
    ya.backward(grad);
    yb.backward(grad);
    CHECK(same_bits(a.x.grad(), b.x.grad()));
    if (affine) {
      CHECK(same_bits(a.weight.grad(), b.weight.grad()));
      CHECK(same_bits(a.bias.grad(), b.bias.grad()));
    }
  }
}

TEST_CASE("batch_norm_relu's results do not depend on the thread count") {
  test::ThreadCount restore;
  const Shape shape{8, 6, 9, 9};
  const BatchNormInputs start = make_inputs(shape);
  core::set_num_threads(1);
  BatchNormInputs a = start.copy();
  Tensor ya = fused(a);
  core::set_num_threads(3);
  BatchNormInputs b = start.copy();
  Tensor yb = fused(b);
  Tensor grad = normal(shape, 7, 0.0, 1.0);
  core::set_num_threads(1);
  ya.backward(grad);
  core::set_num_threads(3);
  yb.backward(grad);
  CHECK(same_bits(ya, yb));
  CHECK(same_bits(a.x.grad(), b.x.grad()));
  CHECK(same_bits(a.weight.grad(), b.weight.grad()));
  CHECK(same_bits(a.bias.grad(), b.bias.grad()));
}

TEST_CASE("batch_norm_relu composes batch_norm and relu where it does not fuse") {
  SUBCASE("eval mode") {
    const BatchNormInputs start = make_inputs({4, 3, 5, 5});
    BatchNormInputs a = start.copy(), b = start.copy();
    Tensor ya = fused(a, /*training=*/false), yb = composed(b, /*training=*/false);
    CHECK(node_name(ya) == std::string("relu"));
    check_same_results(a, ya, b, yb, normal({4, 3, 5, 5}, 8, 0.0, 1.0));
  }
  SUBCASE("Float64") {
    const BatchNormInputs start = make_inputs({4, 3, 5, 5}, core::kFloat64);
    BatchNormInputs a = start.copy(), b = start.copy();
    Tensor ya = fused(a), yb = composed(b);
    CHECK(node_name(ya) == std::string("relu"));
    check_same_results(a, ya, b, yb, normal({4, 3, 5, 5}, 8, 0.0, 1.0, core::kFloat64));
  }
}

TEST_CASE("batch_norm_relu's create_graph backward gives the composition's derivatives") {
  const Shape shape{6, 3, 4, 4};
  test::check_create_graph_matches(
      make_inputs(shape), [](BatchNormInputs& in) { return fused(in); },
      [](BatchNormInputs& in) { return composed(in); }, 9, "BatchNormReluBackward");
}

TEST_CASE("Sequential runs exactly BatchNorm then ReLU as the fused op") {
  const Shape shape{4, 3, 6, 6};
  Tensor x = normal(shape, 10, 0.5, 1.5);
  SUBCASE("BatchNorm2d, ReLU: fused in training, composed in eval") {
    nn::Sequential seq{std::make_shared<nn::BatchNorm2d>(3), std::make_shared<nn::ReLU>()};
    CHECK(node_name(seq.forward(x.detach().clone().set_requires_grad(true))) ==
          std::string("BatchNormReluBackward"));
    seq.eval();
    CHECK(node_name(seq.forward(x.detach().clone().set_requires_grad(true))) ==
          std::string("relu"));
  }
  SUBCASE("something between them, or a subclass of BatchNorm2d: composed") {
    struct ScaledBatchNorm : nn::BatchNorm2d {
      using nn::BatchNorm2d::BatchNorm2d;
      Tensor forward(const Tensor& input) override {
        return core::mul(nn::BatchNorm2d::forward(input), core::scalar_like(2.0, input));
      }
    };
    nn::Sequential apart{std::make_shared<nn::BatchNorm2d>(3), std::make_shared<nn::Identity>(),
                         std::make_shared<nn::ReLU>()};
    CHECK(node_name(apart.forward(x.detach().clone().set_requires_grad(true))) ==
          std::string("relu"));
    nn::Sequential subclass{std::make_shared<ScaledBatchNorm>(3), std::make_shared<nn::ReLU>()};
    Tensor y = subclass.forward(x.detach().clone().set_requires_grad(true));
    CHECK(node_name(y) == std::string("relu"));
    nn::BatchNorm2d plain(3);
    Tensor twice = core::relu(core::mul(plain.forward(x), core::scalar_like(2.0, x)));
    CHECK(same_bits(y, twice));
  }
}

TEST_CASE("make_cnn fuses its BatchNorm-ReLU pairs and keeps its modules, names and results") {
  const auto build = [] {
    core::Generator generator(5);
    return nn::make_cnn({1, 28, 28}, {16, 32}, {128}, 10, 0.0, generator);
  };
  auto fused_model = build(), reference = build();
  // The modules and state_dict names of an unfused model: checkpoints load either way.
  std::vector<std::string> types;
  for (const auto& [name, child] : fused_model->named_children())
    types.push_back(child->type_name());
  CHECK(types == std::vector<std::string>{"Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d", "Conv2d",
                                          "BatchNorm2d", "ReLU", "MaxPool2d", "Flatten", "Linear",
                                          "ReLU", "Linear"});
  std::vector<std::string> keys;
  for (const auto& [key, tensor] : fused_model->state_dict().tensors()) keys.push_back(key);
  CHECK(keys == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias",
                                         "1.running_mean", "1.running_var", "1.num_batches_tracked",
                                         "4.weight", "4.bias", "5.weight", "5.bias",
                                         "5.running_mean", "5.running_var", "5.num_batches_tracked",
                                         "9.weight", "9.bias", "11.weight", "11.bias"});
  // conv 16*9+16, bn 2*16, conv 32*16*9+32, bn 2*32, linear 1568*128+128, linear 128*10+10.
  CHECK(fused_model->num_parameters() == 207018);

  // Two training steps' forward and backward: the fused model against its children run one by
  // one, to the bit.
  for (int step = 0; step < 2; ++step) {
    CAPTURE(step);
    Tensor x = normal({8, 1, 28, 28}, 20 + uint32_t(step), 0.0, 1.0);
    Tensor weights = normal({8, 10}, 30 + uint32_t(step), 0.0, 1.0);
    Tensor out = fused_model->forward(x);
    Tensor ref = x;
    for (const auto& [name, child] : reference->named_children()) ref = child->forward(ref);
    CHECK(same_bits(out, ref));
    core::sum(core::mul(out, weights)).backward();
    core::sum(core::mul(ref, weights)).backward();
    const auto a = fused_model->named_parameters(), b = reference->named_parameters();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      CAPTURE(a[i].first);
      CHECK(same_bits(a[i].second.grad(), b[i].second.grad()));
    }
    const auto buffers_a = fused_model->named_buffers(), buffers_b = reference->named_buffers();
    for (size_t i = 0; i < buffers_a.size(); ++i) {
      CAPTURE(buffers_a[i].first);
      CHECK(same_bits(buffers_a[i].second, buffers_b[i].second));
    }
  }
}

TEST_CASE("the built-in ResNet runs its stem's and each block's first BatchNorm-ReLU fused") {
  core::Generator generator(9);
  nn::ResNet model({3, 16, 16}, {.depth = 18, .width = 8, .outputs = 10}, generator);
  Tensor x = normal({2, 3, 16, 16}, 40, 0.0, 1.0);
  // The graph's nodes by name, each node once.
  const auto node_names = [](const Tensor& y) {
    std::map<std::string, int> names;
    std::set<const core::Node*> seen;
    std::vector<const core::Node*> stack{y.grad_fn().get()};
    while (!stack.empty()) {
      const core::Node* node = stack.back();
      stack.pop_back();
      if (node == nullptr || !seen.insert(node).second) continue;
      ++names[node->name()];
      for (const auto& next : node->next) stack.push_back(next.get());
    }
    return names;
  };
  std::map<std::string, int> names = node_names(model.forward(x));
  CHECK(names["BatchNormReluBackward"] == 9);  // the stem and 8 blocks' bn1
  CHECK(names["BatchNormBackward"] == 8 + 3);  // the blocks' bn2 and 3 downsample paths
  model.eval();  // running statistics: batch norm and ReLU are composed
  names = node_names(model.forward(x));
  CHECK(names["BatchNormReluBackward"] == 0);
  CHECK(names["relu"] == 9 + 8);  // and the 8 blocks' ReLU after the residual add
}
