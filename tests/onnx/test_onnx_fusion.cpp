// The GELU rewrite of nn/onnx/onnx_fusion.h: the chains the legacy exporter writes (GPT-2's tanh
// form with its Constant nodes, BERT's erf form) load as one Gelu node each, and the model gives
// the decomposed formula's values, gradients and second derivatives; a chain whose intermediate
// value is read elsewhere, or whose constants differ, is left alone and still right. Likewise
// attention's scaled, masked softmax (Mul or Div, Add, Softmax) as one node.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/ops/softmax.h"
#include "mpigrad/nn/onnx/onnx_model.h"
#include "onnx_graph.h"

using namespace mpigrad;
using test::OnnxGraph;

namespace {

// A Constant node holding one double, as the legacy exporter writes each literal.
std::string constant(OnnxGraph& g, const std::string& name, double value) {
  auto& node = g.node("Constant", {}, {name});
  auto* attribute = node.add_attribute();
  attribute->set_name("value");
  attribute->set_type(onnx::AttributeProto::TENSOR);
  nn::tensor_to_proto(core::Tensor::from_vector(std::vector<double>{value}, core::Shape{}),
                      *attribute->mutable_t());
  return name;
}

// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in transformers' NewGELUActivation order,
// with the factors of the last Mul swapped when `swapped`. `cubic` replaces 0.044715.
OnnxGraph gelu_tanh_graph(bool swapped, double cubic = 0.044715) {
  OnnxGraph g(17);
  g.input("x", {-1, 5}).output("y");
  g.node("Mul", {"x", constant(g, "half", 0.5)}, {"a"});
  g.node("Pow", {"x", constant(g, "three", 3.0)}, {"p"});
  g.node("Mul", {"p", constant(g, "cubic", cubic)}, {"b"});
  g.node("Add", {"x", "b"}, {"c"});
  g.node("Mul", {constant(g, "k", std::sqrt(2.0 / M_PI)), "c"}, {"d"});
  g.node("Tanh", {"d"}, {"t"});
  g.node("Add", {"t", constant(g, "one", 1.0)}, {"e"});
  if (swapped) {
    g.node("Mul", {"e", "a"}, {"y"});
  } else {
    g.node("Mul", {"a", "e"}, {"y"});
  }
  return g;
}

// y = (x (1 + erf(x / sqrt 2))) 0.5, as F.gelu exports.
OnnxGraph gelu_erf_graph(bool tanh_also_output = false) {
  OnnxGraph g(17);
  g.input("x", {-1, 5}).output("y");
  g.node("Div", {"x", constant(g, "root2", std::sqrt(2.0))}, {"v"});
  g.node("Erf", {"v"}, {"r"});
  g.node("Add", {"r", constant(g, "one", 1.0)}, {"f"});
  g.node("Mul", {"x", "f"}, {"m"});
  g.node("Mul", {"m", constant(g, "half", 0.5)}, {"y"});
  if (tanh_also_output) g.output("r");
  return g;
}

int64_t compute_nodes(nn::OnnxModel& model) {
  // extra_repr: "file=..., nodes=N", counting the nodes left after constants are folded.
  const std::string repr = model.extra_repr();
  return std::stoll(repr.substr(repr.rfind('=') + 1));
}

core::Tensor reference(const core::Tensor& x, bool tanh_form) {
  if (tanh_form) {
    const core::Tensor u = (x + core::pow(x, 3.0) * 0.044715) * std::sqrt(2.0 / M_PI);
    return x * 0.5 * (core::tanh(u) + 1.0);
  }
  return x * (core::erf(x / std::sqrt(2.0)) + 1.0) * 0.5;
}

// The model against the reference formula: values, first and second derivatives (double).
void check_against_reference(nn::OnnxModel& model, bool tanh_form) {
  const core::Tensor input =
      core::Tensor::from_vector(std::vector<double>{-7.0, -3.0, -1.2, -0.75, -0.1, 0.0, 0.2, 0.9,
                                                    1.7, 2.5, 4.0, 9.0, -0.4, 0.6, -2.2},
                                {3, 5});
  core::Tensor weights = core::Tensor::from_vector(
      std::vector<double>{1, -2, 0.5, 3, 1, 1, 2, -1, 0.25, 1, 1, 1, -3, 2, 1}, {3, 5});
  core::Tensor x = input.clone().set_requires_grad(true);
  core::Tensor x_ref = input.clone().set_requires_grad(true);
  const core::Tensor y = model.forward(x), y_ref = reference(x_ref, tanh_form);
  const auto values = y.to_vector<double>(), expected = y_ref.to_vector<double>();
  for (size_t i = 0; i < values.size(); ++i) CHECK(values[i] == doctest::Approx(expected[i]));
  core::GradOptions options;
  options.create_graph = true;
  const core::Tensor g = core::grad({core::sum(y * weights)}, {x}, {}, options)[0];
  const core::Tensor g_ref = core::grad({core::sum(y_ref * weights)}, {x_ref}, {}, options)[0];
  const auto grads = g.to_vector<double>(), expected_grads = g_ref.to_vector<double>();
  for (size_t i = 0; i < grads.size(); ++i) CHECK(grads[i] == doctest::Approx(expected_grads[i]));
  const core::Tensor h = core::grad({core::sum(g * g)}, {x})[0];
  const core::Tensor h_ref = core::grad({core::sum(g_ref * g_ref)}, {x_ref})[0];
  const auto second = h.to_vector<double>(), expected_second = h_ref.to_vector<double>();
  for (size_t i = 0; i < second.size(); ++i) {
    CHECK(second[i] == doctest::Approx(expected_second[i]).epsilon(1e-9).scale(1.0));
  }
}

std::filesystem::path scratch(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("mpigrad-test-onnx-fusion-" + name);
}

}  // namespace

TEST_CASE("ONNX GELU fusion: GPT-2's tanh chain is one Gelu node, with the same derivatives") {
  for (bool swapped : {false, true}) {
    INFO("factors swapped ", swapped);
    auto model = nn::OnnxModel::load(gelu_tanh_graph(swapped).write(scratch("tanh")));
    CHECK(compute_nodes(*model) == 1);  // eight nodes and six constants before
    check_against_reference(*model, true);
  }
}

TEST_CASE("ONNX GELU fusion: BERT's erf chain is one Gelu node, with the same derivatives") {
  auto model = nn::OnnxModel::load(gelu_erf_graph().write(scratch("erf")));
  CHECK(compute_nodes(*model) == 1);
  check_against_reference(*model, false);
}

TEST_CASE("ONNX GELU fusion: chains that are not exactly GELU stay as they are") {
  SUBCASE("an intermediate value is also a graph output") {
    auto model = nn::OnnxModel::load(gelu_erf_graph(true).write(scratch("read")));
    CHECK(compute_nodes(*model) == 5);
    check_against_reference(*model, false);
  }
  SUBCASE("another cubic coefficient") {
    auto model = nn::OnnxModel::load(gelu_tanh_graph(false, 0.05).write(scratch("other")));
    CHECK(compute_nodes(*model) == 8);
    const core::Tensor x =
        core::Tensor::from_vector(std::vector<double>{-1.0, 0.5, 2.0, 3.0, 1.0}, {1, 5});
    const core::Tensor u = (x + core::pow(x, 3.0) * 0.05) * std::sqrt(2.0 / M_PI);
    const auto expected = (x * 0.5 * (core::tanh(u) + 1.0)).to_vector<double>();
    const auto values = model->forward(x).to_vector<double>();
    for (size_t i = 0; i < values.size(); ++i) CHECK(values[i] == doctest::Approx(expected[i]));
  }
}

// ---- attention's scaled, masked softmax -------------------------------------------------------

namespace {

constexpr int64_t kTokens = 5;

// A Constant node holding a [T, T] causal mask: 0 on and below the diagonal, -1e4 above.
std::string causal_mask(OnnxGraph& g, const std::string& name) {
  std::vector<double> values(size_t(kTokens * kTokens));
  for (int64_t i = 0; i < kTokens; ++i) {
    for (int64_t j = 0; j < kTokens; ++j) values[size_t(i * kTokens + j)] = j > i ? -1e4 : 0.0;
  }
  auto& node = g.node("Constant", {}, {name});
  auto* attribute = node.add_attribute();
  attribute->set_name("value");
  attribute->set_type(onnx::AttributeProto::TENSOR);
  nn::tensor_to_proto(core::Tensor::from_vector(values, {kTokens, kTokens}),
                      *attribute->mutable_t());
  return name;
}

enum class Scaling { Mul, MulConstantFirst, DivByEight, DivByThree };

// Softmax(axis -1) of Add(Mul(x, 0.125), mask), as GPT-2's exporter writes it, or of the scaled
// scores alone (BERT); the scale as a Mul either way round or a Div.
OnnxGraph attention_softmax_graph(Scaling scaling, bool masked, bool scaled_also_output = false) {
  OnnxGraph g(17);
  g.input("x", {-1, 2, kTokens, kTokens}).output("y");
  switch (scaling) {
    case Scaling::Mul:
      g.node("Mul", {"x", constant(g, "c", 0.125)}, {"s"});
      break;
    case Scaling::MulConstantFirst:
      g.node("Mul", {constant(g, "c", 0.125), "x"}, {"s"});
      break;
    case Scaling::DivByEight:
      g.node("Div", {"x", constant(g, "c", 8.0)}, {"s"});
      break;
    case Scaling::DivByThree:
      g.node("Div", {"x", constant(g, "c", 3.0)}, {"s"});
      break;
  }
  std::string scores = "s";
  if (masked) {
    g.node("Add", {"s", causal_mask(g, "mask")}, {"m"});
    scores = "m";
  }
  auto& softmax = g.node("Softmax", {scores}, {"y"});
  auto* axis = softmax.add_attribute();
  axis->set_name("axis");
  axis->set_type(onnx::AttributeProto::INT);
  axis->set_i(-1);
  if (scaled_also_output) g.output("s");
  return g;
}

core::Tensor attention_reference(const core::Tensor& x, double scale, bool masked) {
  core::Tensor s = x * scale;
  if (masked) {
    std::vector<double> values(size_t(kTokens * kTokens));
    for (int64_t i = 0; i < kTokens; ++i) {
      for (int64_t j = 0; j < kTokens; ++j) values[size_t(i * kTokens + j)] = j > i ? -1e4 : 0.0;
    }
    s = s + core::Tensor::from_vector(values, {kTokens, kTokens});
  }
  return core::softmax(s, -1);
}

// Values, first and second derivatives of the model's y against the reference formula's.
void check_attention(nn::OnnxModel& model, double scale, bool masked) {
  std::vector<double> values(size_t(3 * 2 * kTokens * kTokens)), weights(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = std::sin(double(i) * 0.7) * 9.0;
    weights[i] = std::cos(double(i) * 0.3);
  }
  const core::Shape shape{3, 2, kTokens, kTokens};
  const core::Tensor w = core::Tensor::from_vector(weights, shape);
  core::Tensor x = core::Tensor::from_vector(values, shape).set_requires_grad(true);
  core::Tensor x_ref = core::Tensor::from_vector(values, shape).set_requires_grad(true);
  const core::Tensor y = model.forward(x), y_ref = attention_reference(x_ref, scale, masked);
  const auto got = y.to_vector<double>(), expected = y_ref.to_vector<double>();
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(expected[i]));
  core::GradOptions options;
  options.create_graph = true;
  const core::Tensor g = core::grad({core::sum(y * w)}, {x}, {}, options)[0];
  const core::Tensor g_ref = core::grad({core::sum(y_ref * w)}, {x_ref}, {}, options)[0];
  const auto grads = g.to_vector<double>(), expected_grads = g_ref.to_vector<double>();
  for (size_t i = 0; i < grads.size(); ++i) CHECK(grads[i] == doctest::Approx(expected_grads[i]));
  const auto second = core::grad({core::sum(g * g)}, {x})[0].to_vector<double>();
  const auto second_ref = core::grad({core::sum(g_ref * g_ref)}, {x_ref})[0].to_vector<double>();
  for (size_t i = 0; i < second.size(); ++i) {
    CHECK(second[i] == doctest::Approx(second_ref[i]).epsilon(1e-9).scale(1.0));
  }
}

}  // namespace

TEST_CASE("ONNX attention softmax fusion: GPT-2's Mul, Add and Softmax are one node") {
  for (const Scaling scaling : {Scaling::Mul, Scaling::MulConstantFirst, Scaling::DivByEight}) {
    INFO("scaling ", int(scaling));
    auto model = nn::OnnxModel::load(attention_softmax_graph(scaling, true).write(scratch("gpt2")));
    CHECK(compute_nodes(*model) == 1);  // Mul (or Div), Add and Softmax before
    check_attention(*model, 0.125, true);
  }
}

TEST_CASE("ONNX attention softmax fusion: BERT's Mul and Softmax (no mask) are one node") {
  auto model =
      nn::OnnxModel::load(attention_softmax_graph(Scaling::Mul, false).write(scratch("bert")));
  CHECK(compute_nodes(*model) == 1);
  check_attention(*model, 0.125, false);
}

TEST_CASE("ONNX attention softmax fusion: chains it cannot fuse exactly stay as they are") {
  SUBCASE("a Div by a constant whose reciprocal is not exact") {
    auto model = nn::OnnxModel::load(
        attention_softmax_graph(Scaling::DivByThree, true).write(scratch("div3")));
    CHECK(compute_nodes(*model) == 3);
    check_attention(*model, 1.0 / 3.0, true);
  }
  SUBCASE("the scaled scores are also a graph output") {
    auto model = nn::OnnxModel::load(
        attention_softmax_graph(Scaling::Mul, true, true).write(scratch("read")));
    CHECK(compute_nodes(*model) == 3);
  }
}
