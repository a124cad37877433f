// Every differentiable op OnnxModel runs, through a one-node graph: the forward pass runs and is
// finite, and the gradients (of the inputs, and of initializers, which are parameters) agree with
// float64 finite differences. Values are pinned by the conformance run (onnx_conformance.cpp);
// these cases pin the backward passes, which ONNX's test data does not cover.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "../nn/gradcheck.h"
#include "../second_order_check.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/nn/onnx/onnx_model.h"
#include "onnx_graph.h"

using namespace mpigrad;
using test::OnnxGraph;
using test::set_attribute;

namespace {

struct Input {
  std::vector<int64_t> shape;
  double lo = -1.0, hi = 1.0;
};

struct OpCase {
  std::string name;
  int64_t opset;
  std::vector<Input> inputs;  // graph inputs x0, x1, ...
  // Adds the node (reading x0.., writing y) and any integer initializers.
  std::function<void(OnnxGraph&)> build;
};

core::Tensor int64s(std::vector<int64_t> values) {
  return core::Tensor::from_vector(values, core::Shape{int64_t(values.size())});
}

std::vector<std::string> names(size_t n) {
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) out.push_back(std::string("x").append(std::to_string(i)));
  return out;
}

// A node of `op` over x0..x{n-1} (plus `extra` inputs) with output y.
onnx::NodeProto& simple(OnnxGraph& g, const std::string& op, size_t n,
                        std::vector<std::string> extra = {}) {
  auto inputs = names(n);
  inputs.insert(inputs.end(), extra.begin(), extra.end());
  return g.node(op, inputs, {"y"});
}

std::vector<OpCase> op_cases() {
  std::vector<OpCase> c;
  auto unary = [&](const std::string& op, double lo = -1.0, double hi = 1.0, int64_t opset = 17) {
    c.push_back({op, opset, {{{2, 3}, lo, hi}}, [op](OnnxGraph& g) { simple(g, op, 1); }});
  };
  auto binary = [&](const std::string& op, double lo = -1.0, double hi = 1.0) {
    c.push_back({op + " (broadcast)", 17, {{{2, 3}, lo, hi}, {{3}, lo, hi}}, [op](OnnxGraph& g) {
                   simple(g, op, 2);
                 }});
  };
  binary("Add");
  binary("Sub");
  binary("Mul");
  binary("Div", 0.5, 2.0);
  binary("Pow", 0.5, 2.0);
  binary("Max");
  binary("Min");
  c.push_back({"Pow (constant exponent)", 17, {{{2, 3}, 0.5, 2.0}}, [](OnnxGraph& g) {
                 g.initializer("e", core::Tensor::scalar(3.0, core::kFloat64));
                 simple(g, "Pow", 1, {"e"});
               }});
  c.push_back({"Mod (fmod)", 17, {{{2, 3}, 1.1, 4.0}}, [](OnnxGraph& g) {
                 g.initializer("d", core::Tensor::scalar(0.7, core::kFloat64));
                 set_attribute(simple(g, "Mod", 1, {"d"}), "fmod", int64_t(1));
               }});
  for (const char* op : {"Neg", "Exp", "Erf", "Sin", "Cos", "Abs", "Relu", "Sigmoid", "Tanh",
                         "Softplus", "HardSwish", "Elu", "Selu", "HardSigmoid", "Identity"})
    unary(op, -2.0, 2.0);
  unary("Sqrt", 0.5, 2.0);
  unary("Log", 0.5, 2.0);
  unary("Reciprocal", 0.5, 2.0);
  c.push_back({"LeakyRelu", 17, {{{2, 3}, -1, 1}}, [](OnnxGraph& g) {
                 set_attribute(simple(g, "LeakyRelu", 1), "alpha", 0.2);
               }});
  c.push_back({"Gelu (none)", 20, {{{2, 3}, -2, 2}}, [](OnnxGraph& g) { simple(g, "Gelu", 1); }});
  c.push_back({"Gelu (tanh)", 20, {{{2, 3}, -2, 2}}, [](OnnxGraph& g) {
                 set_attribute(simple(g, "Gelu", 1), "approximate", std::string("tanh"));
               }});
  c.push_back({"Clip (inputs)", 13, {{{2, 3}, -2, 2}}, [](OnnxGraph& g) {
                 g.initializer("lo", core::Tensor::scalar(-0.5, core::kFloat64));
                 g.initializer("hi", core::Tensor::scalar(0.7, core::kFloat64));
                 simple(g, "Clip", 1, {"lo", "hi"});
               }});
  c.push_back({"Clip (opset 7 attributes)", 7, {{{2, 3}, -2, 2}}, [](OnnxGraph& g) {
                 auto& n = simple(g, "Clip", 1);
                 set_attribute(n, "min", -0.5);
                 set_attribute(n, "max", 0.7);
               }});
  c.push_back({"Gemm (transB, alpha, beta, C)", 17, {{{2, 3}}, {{4, 3}}, {{4}}}, [](OnnxGraph& g) {
                 auto& n = simple(g, "Gemm", 3);
                 set_attribute(n, "transB", int64_t(1));
                 set_attribute(n, "alpha", 0.5);
                 set_attribute(n, "beta", 2.0);
               }});
  c.push_back({"Gemm (transA)", 17, {{{3, 2}}, {{3, 4}}}, [](OnnxGraph& g) {
                 set_attribute(simple(g, "Gemm", 2), "transA", int64_t(1));
               }});
  c.push_back({"MatMul (batched)", 17, {{{2, 2, 3}}, {{3, 4}}}, [](OnnxGraph& g) {
                 simple(g, "MatMul", 2);
               }});
  c.push_back({"Conv (stride, asymmetric pads, dilation)",
               17,
               {{{1, 2, 6, 5}}, {{3, 2, 2, 3}}, {{3}}},
               [](OnnxGraph& g) {
                 auto& n = simple(g, "Conv", 3);
                 set_attribute(n, "strides", {2, 1});
                 set_attribute(n, "pads", {1, 0, 0, 2});
                 set_attribute(n, "dilations", {1, 2});
               }});
  c.push_back({"Conv (groups, SAME_UPPER)", 17, {{{1, 4, 5, 5}}, {{4, 2, 3, 3}}}, [](OnnxGraph& g) {
                 auto& n = simple(g, "Conv", 2);
                 set_attribute(n, "group", int64_t(2));
                 set_attribute(n, "auto_pad", std::string("SAME_UPPER"));
                 set_attribute(n, "strides", {2, 2});
               }});
  c.push_back({"Conv (1-d)", 17, {{{2, 2, 7}}, {{3, 2, 3}}}, [](OnnxGraph& g) {
                 set_attribute(simple(g, "Conv", 2), "pads", {1, 1});
               }});
  c.push_back({"ConvTranspose (stride 2, pads, output_padding)",
               17,
               {{{1, 2, 3, 3}}, {{2, 3, 3, 2}}, {{3}}},
               [](OnnxGraph& g) {
                 auto& n = simple(g, "ConvTranspose", 3);
                 set_attribute(n, "strides", {2, 2});
                 set_attribute(n, "pads", {1, 0, 1, 0});
                 set_attribute(n, "output_padding", {1, 1});
               }});
  c.push_back({"ConvTranspose (groups)", 17, {{{1, 4, 3, 3}}, {{4, 1, 2, 2}}}, [](OnnxGraph& g) {
                 set_attribute(simple(g, "ConvTranspose", 2), "group", int64_t(2));
               }});
  c.push_back({"MaxPool (pads, strides)", 17, {{{1, 2, 5, 5}}}, [](OnnxGraph& g) {
                 auto& n = simple(g, "MaxPool", 1);
                 set_attribute(n, "kernel_shape", {3, 3});
                 set_attribute(n, "strides", {2, 2});
                 set_attribute(n, "pads", {1, 1, 1, 1});
               }});
  c.push_back(
      {"AveragePool (asymmetric pads, exclude pad, ceil)", 17, {{{1, 2, 5, 6}}}, [](OnnxGraph& g) {
         auto& n = simple(g, "AveragePool", 1);
         set_attribute(n, "kernel_shape", {2, 3});
         set_attribute(n, "strides", {2, 2});
         set_attribute(n, "pads", {1, 0, 0, 1});
         set_attribute(n, "ceil_mode", int64_t(1));
       }});
  c.push_back({"GlobalAveragePool", 17, {{{2, 3, 4, 4}}}, [](OnnxGraph& g) {
                 simple(g, "GlobalAveragePool", 1);
               }});
  c.push_back({"BatchNormalization (graph inputs, eval)",
               15,
               {{{2, 3, 2, 2}}, {{3}}, {{3}}, {{3}}, {{3}, 0.5, 1.5}},
               [](OnnxGraph& g) { simple(g, "BatchNormalization", 5); }});
  c.push_back({"LayerNormalization", 17, {{{2, 3, 4}}, {{4}}, {{4}}}, [](OnnxGraph& g) {
                 simple(g, "LayerNormalization", 3);
               }});
  c.push_back({"LayerNormalization (axis 1)", 17, {{{2, 3, 4}}, {{3, 4}}}, [](OnnxGraph& g) {
                 set_attribute(simple(g, "LayerNormalization", 2), "axis", int64_t(1));
               }});
  c.push_back({"InstanceNormalization", 17, {{{2, 3, 4}}, {{3}}, {{3}}}, [](OnnxGraph& g) {
                 simple(g, "InstanceNormalization", 3);
               }});
  c.push_back({"GroupNormalization (opset 18)", 18, {{{2, 4, 3}}, {{2}}, {{2}}}, [](OnnxGraph& g) {
                 set_attribute(simple(g, "GroupNormalization", 3), "num_groups", int64_t(2));
               }});
  c.push_back({"Softmax (opset 13, axis 1)", 13, {{{2, 3, 4}}}, [](OnnxGraph& g) {
                 set_attribute(simple(g, "Softmax", 1), "axis", int64_t(1));
               }});
  c.push_back({"Softmax (opset 11, coerced to 2-d)", 11, {{{2, 3, 4}}}, [](OnnxGraph& g) {
                 simple(g, "Softmax", 1);
               }});
  c.push_back({"LogSoftmax", 13, {{{2, 5}}}, [](OnnxGraph& g) { simple(g, "LogSoftmax", 1); }});
  c.push_back({"ReduceMean (opset 13 axes attribute)", 13, {{{2, 3, 4}}}, [](OnnxGraph& g) {
                 set_attribute(simple(g, "ReduceMean", 1), "axes", {1, -1});
               }});
  c.push_back(
      {"ReduceMean (opset 18 axes input, no keepdims)", 18, {{{2, 3, 4}}}, [](OnnxGraph& g) {
         g.initializer("axes", int64s({0, 2}));
         set_attribute(simple(g, "ReduceMean", 1, {"axes"}), "keepdims", int64_t(0));
       }});
  c.push_back({"ReduceSum (opset 13 axes input)", 13, {{{2, 3, 4}}}, [](OnnxGraph& g) {
                 g.initializer("axes", int64s({1}));
                 simple(g, "ReduceSum", 1, {"axes"});
               }});
  c.push_back({"ReduceMax (two axes)", 17, {{{2, 3, 4}}}, [](OnnxGraph& g) {
                 auto& n = simple(g, "ReduceMax", 1);
                 set_attribute(n, "axes", {0, 2});
                 set_attribute(n, "keepdims", int64_t(0));
               }});
  for (const char* op : {"ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp"})
    c.push_back({op, 13, {{{2, 3, 4}}}, [op](OnnxGraph& g) {
                   set_attribute(simple(g, op, 1), "axes", {0, 2});
                 }});
  c.push_back({"ReduceLogSum (opset 18 axes input)", 18, {{{2, 3, 4}, 0.5, 2.0}}, [](OnnxGraph& g) {
                 g.initializer("axes", int64s({1}));
                 simple(g, "ReduceLogSum", 1, {"axes"});
               }});
  c.push_back({"Celu", 17, {{{2, 3}, -2, 2}}, [](OnnxGraph& g) {
                 set_attribute(simple(g, "Celu", 1), "alpha", 0.7);
               }});
  c.push_back({"ThresholdedRelu", 17, {{{2, 3}, -2, 2}}, [](OnnxGraph& g) {
                 set_attribute(simple(g, "ThresholdedRelu", 1), "alpha", 0.3);
               }});
  c.push_back({"Shrink", 17, {{{2, 3}, -2, 2}}, [](OnnxGraph& g) {
                 auto& n = simple(g, "Shrink", 1);
                 set_attribute(n, "lambd", 0.3);
                 set_attribute(n, "bias", 0.1);
               }});
  c.push_back({"GatherElements (negative indices)", 13, {{{3, 4}}}, [](OnnxGraph& g) {
                 g.initializer("index", core::Tensor::from_vector(
                                            std::vector<int64_t>{0, -1, 2, 1, 1, 0}, {3, 2}));
                 set_attribute(simple(g, "GatherElements", 1, {"index"}), "axis", int64_t(1));
               }});
  c.push_back(
      {"SplitToSequence, SequenceAt, SequenceConstruct, ConcatFromSequence",
       17,
       {{{2, 5}}},
       [](OnnxGraph& g) {
         g.initializer("two", core::Tensor::from_vector(std::vector<int64_t>{2}, core::Shape{}));
         g.initializer("first", core::Tensor::from_vector(std::vector<int64_t>{0}, core::Shape{}));
         g.initializer("last", core::Tensor::from_vector(std::vector<int64_t>{-1}, core::Shape{}));
         set_attribute(g.node("SplitToSequence", {"x0", "two"}, {"pieces"}), "axis", int64_t(1));
         g.node("SequenceAt", {"pieces", "first"}, {"a"});
         g.node("SequenceAt", {"pieces", "last"}, {"b"});
         g.node("SequenceConstruct", {"b", "a", "b"}, {"list"});
         set_attribute(g.node("ConcatFromSequence", {"list"}, {"y"}), "axis", int64_t(1));
       }});
  c.push_back({"Reshape (0 and -1)", 17, {{{2, 3, 4}}}, [](OnnxGraph& g) {
                 g.initializer("shape", int64s({0, -1}));
                 simple(g, "Reshape", 1, {"shape"});
               }});
  c.push_back({"Flatten", 17, {{{2, 3, 2}}}, [](OnnxGraph& g) { simple(g, "Flatten", 1); }});
  c.push_back({"Transpose", 17, {{{2, 3, 4}}}, [](OnnxGraph& g) {
                 set_attribute(simple(g, "Transpose", 1), "perm", {2, 0, 1});
               }});
  c.push_back({"Squeeze (axes input) then Unsqueeze", 13, {{{2, 1, 3}}}, [](OnnxGraph& g) {
                 g.initializer("axes", int64s({1}));
                 g.initializer("new_axes", int64s({0, 3}));
                 g.node("Squeeze", {"x0", "axes"}, {"s"});
                 g.node("Unsqueeze", {"s", "new_axes"}, {"y"});
               }});
  c.push_back({"Unsqueeze (opset 11 attribute)", 11, {{{2, 3}}}, [](OnnxGraph& g) {
                 set_attribute(simple(g, "Unsqueeze", 1), "axes", {-1});
               }});
  c.push_back({"Concat", 17, {{{2, 3}}, {{2, 1}}}, [](OnnxGraph& g) {
                 set_attribute(simple(g, "Concat", 2), "axis", int64_t(-1));
               }});
  c.push_back({"Split (num_outputs, opset 18) into Mul", 18, {{{5, 2}}}, [](OnnxGraph& g) {
                 auto& n = g.node("Split", {"x0"}, {"a", "b"});
                 set_attribute(n, "num_outputs", int64_t(2));
                 g.node("Slice", {"a", "start", "stop"}, {"a2"});
                 g.initializer("start", int64s({0}));
                 g.initializer("stop", int64s({2}));
                 g.node("Mul", {"a2", "b"}, {"y"});
               }});
  c.push_back({"Slice (negative step, axes, steps)", 13, {{{4, 5}}}, [](OnnxGraph& g) {
                 g.initializer("starts", int64s({-1, 1}));
                 g.initializer("ends", int64s({-100, 5}));
                 g.initializer("axes", int64s({0, 1}));
                 g.initializer("steps", int64s({-2, 2}));
                 simple(g, "Slice", 1, {"starts", "ends", "axes", "steps"});
               }});
  c.push_back({"Gather (negative indices, 2-d index)", 13, {{{4, 3}}}, [](OnnxGraph& g) {
                 g.initializer(
                     "index", core::Tensor::from_vector(std::vector<int64_t>{0, -1, 2, 2}, {2, 2}));
                 simple(g, "Gather", 1, {"index"});
               }});
  c.push_back({"Expand", 13, {{{3, 1}}}, [](OnnxGraph& g) {
                 g.initializer("shape", int64s({2, 3, 4}));
                 simple(g, "Expand", 1, {"shape"});
               }});
  c.push_back({"Where (Equal)", 16, {{{2, 3}}, {{2, 3}}}, [](OnnxGraph& g) {
                 g.initializer("mask", core::Tensor::from_vector(
                                           std::vector<int64_t>{1, 0, 1, 1, 0, 0}, {2, 3}));
                 g.initializer("one", int64s({1}));
                 g.node("Equal", {"mask", "one"}, {"cond"});
                 g.node("Where", {"cond", "x0", "x1"}, {"y"});
               }});
  c.push_back({"Trilu (lower, k = 1)", 14, {{{2, 3, 4}}}, [](OnnxGraph& g) {
                 g.initializer("k",
                               core::Tensor::from_vector(std::vector<int64_t>{1}, core::Shape{}));
                 set_attribute(simple(g, "Trilu", 1, {"k"}), "upper", int64_t(0));
               }});
  c.push_back({"Tile", 13, {{{2, 3}}}, [](OnnxGraph& g) {
                 g.initializer("repeats", int64s({2, 3}));
                 simple(g, "Tile", 1, {"repeats"});
               }});
  for (const char* mode : {"constant", "reflect", "edge"}) {
    c.push_back(
        {std::string("Pad (").append(mode).append(")"), 13, {{{1, 2, 4, 5}}}, [mode](OnnxGraph& g) {
           g.initializer("pads", int64s({0, 0, 2, 1, 0, 0, 1, -1}));
           set_attribute(simple(g, "Pad", 1, {"pads"}), "mode", std::string(mode));
         }});
  }
  c.push_back(
      {"Resize (nearest, scales)", 13, {{{1, 1, 2, 3}}}, [](OnnxGraph& g) {
         g.initializer("scales", core::Tensor::from_vector(std::vector<float>{1, 1, 2, 1.5}, {4}));
         simple(g, "Resize", 1, {"", "scales"});
       }});
  c.push_back({"Resize (linear, sizes, align_corners)", 13, {{{1, 1, 3, 3}}}, [](OnnxGraph& g) {
                 g.initializer("sizes", int64s({1, 1, 5, 2}));
                 auto& n = simple(g, "Resize", 1, {"", "", "sizes"});
                 set_attribute(n, "mode", std::string("linear"));
                 set_attribute(n, "coordinate_transformation_mode", std::string("align_corners"));
               }});
  c.push_back(
      {"Cast to float64 and back", 13, {{{2, 3}}}, [](OnnxGraph& g) {
         set_attribute(g.node("Cast", {"x0"}, {"f"}), "to", int64_t(onnx::TensorProto::FLOAT));
         set_attribute(g.node("Cast", {"f"}, {"y"}), "to", int64_t(onnx::TensorProto::DOUBLE));
       }});
  c.push_back(
      {"Shape arithmetic into Reshape", 13, {{{2, 3, 4}}}, [](OnnxGraph& g) {
         g.node("Shape", {"x0"}, {"shape"});
         g.initializer("zero", core::Tensor::from_vector(std::vector<int64_t>{0}, core::Shape{}));
         g.initializer("minus_one", int64s({-1}));
         g.node("Gather", {"shape", "zero"}, {"batch"});
         g.initializer("axes0", int64s({0}));
         g.node("Unsqueeze", {"batch", "axes0"}, {"batch1"});
         set_attribute(g.node("Concat", {"batch1", "minus_one"}, {"target"}), "axis", int64_t(0));
         g.node("Reshape", {"x0", "target"}, {"y"});
       }});
  // Gathering and scattering by index (graph networks): repeated positions add up.
  c.push_back(
      {"ScatterElements (add, repeated indices)", 16, {{{4, 3}}, {{5, 3}}}, [](OnnxGraph& g) {
         std::vector<int64_t> rows;
         for (int64_t r : {0, 2, 0, 3, 2}) rows.insert(rows.end(), {r, r, r});
         g.initializer("index", core::Tensor::from_vector(rows, {5, 3}));
         set_attribute(g.node("ScatterElements", {"x0", "index", "x1"}, {"y"}), "reduction",
                       std::string("add"));
       }});
  c.push_back(
      {"ScatterElements (no reduction, axis 1)", 16, {{{3, 4}}, {{3, 2}}}, [](OnnxGraph& g) {
         g.initializer("index",
                       core::Tensor::from_vector(std::vector<int64_t>{3, 0, -1, 1, 2, 0}, {3, 2}));
         set_attribute(g.node("ScatterElements", {"x0", "index", "x1"}, {"y"}), "axis", int64_t(1));
       }});
  for (const char* reduction : {"mul", "max", "min"}) {
    c.push_back({std::string("ScatterElements (") + reduction + ", repeated indices)",
                 18,
                 {{{4, 3}}, {{5, 3}}},
                 [reduction](OnnxGraph& g) {
                   std::vector<int64_t> rows;
                   for (int64_t r : {0, 2, 0, 3, 2}) rows.insert(rows.end(), {r, r, r});
                   g.initializer("index", core::Tensor::from_vector(rows, {5, 3}));
                   set_attribute(g.node("ScatterElements", {"x0", "index", "x1"}, {"y"}),
                                 "reduction", std::string(reduction));
                 }});
  }
  c.push_back({"ScatterND (min, repeated rows)", 18, {{{4, 3}}, {{5, 3}}}, [](OnnxGraph& g) {
                 g.initializer("index", core::Tensor::from_vector(
                                            std::vector<int64_t>{1, 3, 1, 0, -1}, {5, 1}));
                 set_attribute(g.node("ScatterND", {"x0", "index", "x1"}, {"y"}), "reduction",
                               std::string("min"));
               }});
  c.push_back({"ScatterND (add, repeated rows)", 16, {{{4, 3}}, {{5, 3}}}, [](OnnxGraph& g) {
                 g.initializer("index", core::Tensor::from_vector(
                                            std::vector<int64_t>{1, 3, 1, 0, -1}, {5, 1}));
                 set_attribute(g.node("ScatterND", {"x0", "index", "x1"}, {"y"}), "reduction",
                               std::string("add"));
               }});
  c.push_back({"ScatterND (no reduction, pairs)", 16, {{{2, 3, 4}}, {{2, 4}}}, [](OnnxGraph& g) {
                 g.initializer("index",
                               core::Tensor::from_vector(std::vector<int64_t>{1, 2, 0, 1}, {2, 2}));
                 g.node("ScatterND", {"x0", "index", "x1"}, {"y"});
               }});
  c.push_back({"GatherND", 13, {{{3, 4, 2}}}, [](OnnxGraph& g) {
                 g.initializer("index", core::Tensor::from_vector(
                                            std::vector<int64_t>{2, 3, 0, -1, 2, 3}, {3, 2}));
                 simple(g, "GatherND", 1, {"index"});
               }});
  c.push_back({"GatherND (batch_dims 1)", 13, {{{2, 3, 4}}}, [](OnnxGraph& g) {
                 g.initializer("index", core::Tensor::from_vector(std::vector<int64_t>{2, 0, 1, 1},
                                                                  {2, 2, 1}));
                 set_attribute(simple(g, "GatherND", 1, {"index"}), "batch_dims", int64_t(1));
               }});
  c.push_back({"Dropout (eval is the identity)", 13, {{{2, 3}}}, [](OnnxGraph& g) {
                 simple(g, "Dropout", 1);
               }});
  return c;
}

// Checks the case's graph in float64: forward finite, gradients equal to finite differences.
void check_case(const OpCase& op) {
  OnnxGraph g(op.opset);
  for (size_t i = 0; i < op.inputs.size(); ++i)
    g.input(std::string("x").append(std::to_string(i)), op.inputs[i].shape);
  g.output("y");
  op.build(g);
  auto model = nn::OnnxModel::load(g.write(test::scratch_folder("ops")));
  model->eval();
  std::vector<core::Tensor> inputs;
  for (size_t i = 0; i < op.inputs.size(); ++i)
    inputs.push_back(
        test::fd_input(core::Shape(op.inputs[i].shape), 100 + i, op.inputs[i].lo, op.inputs[i].hi));
  const core::Tensor y = model->forward_all(inputs)[0];
  REQUIRE(y.numel() > 0);
  for (double v : y.to_vector<double>()) REQUIRE(std::isfinite(v));
  std::vector<core::Tensor> leaves = inputs;
  if (op.name.rfind("Where", 0) == 0 || op.name.rfind("BatchNormalization", 0) == 0) {
    leaves.resize(op.name.rfind("Where", 0) == 0 ? 2 : 3);  // no gradient for BN's statistics
  }
  if (op.name.rfind("Mod", 0) == 0) leaves.resize(1);
  // A float32 round trip leaves float32's precision to the finite differences.
  const bool float32 = op.name.rfind("Cast", 0) == 0;
  CHECK(test::gradient_mismatch(
            leaves, [&] { return model->forward_all(inputs)[0]; }, 1, float32 ? 1e-3 : 1e-6,
            float32 ? 1e-3 : 1e-6, float32 ? 1e-3 : 1e-5) == "");
}

// The case's graph differentiated twice (tests/second_order_check.h), in float64, with respect to
// its graph inputs.
std::string second_order_mismatch(const OpCase& op) {
  OnnxGraph g(op.opset);
  for (size_t i = 0; i < op.inputs.size(); ++i)
    g.input(std::string("x").append(std::to_string(i)), op.inputs[i].shape);
  g.output("y");
  op.build(g);
  auto model = nn::OnnxModel::load(g.write(test::scratch_folder("ops2")));
  model->eval();
  test::SecondOrderCheck check;
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    check.inputs.push_back(
        test::fd_input(core::Shape(op.inputs[i].shape), 100 + i, op.inputs[i].lo, op.inputs[i].hi));
    check.differentiable.push_back(true);
  }
  if (op.name.rfind("Where", 0) == 0) check.differentiable.back() = false;
  if (op.name.rfind("BatchNormalization", 0) == 0) {
    for (size_t i = 3; i < check.differentiable.size(); ++i) check.differentiable[i] = false;
  }
  if (op.name.rfind("Mod", 0) == 0) check.differentiable[1] = false;
  check.build = [&](const std::vector<core::Tensor>& in) { return model->forward_all(in)[0]; };
  return test::check_second_order(check);
}

}  // namespace

TEST_CASE("OnnxModel ops: second derivatives of each differentiable op match finite differences") {
  for (const OpCase& op : op_cases()) {
    // Through float32 and back, finite differences of a gradient are float32's noise.
    if (op.name.rfind("Cast", 0) == 0) continue;
    CAPTURE(op.name);
    CHECK(second_order_mismatch(op) == "");
  }
}

TEST_CASE("a scatter without a reduction names its node when an index repeats") {
  OnnxGraph g(16);
  g.input("x0", {4, 3});
  g.input("x1", {2, 3});
  g.output("y");
  g.initializer("index", core::Tensor::from_vector(std::vector<int64_t>{1, 1, 1, 1, 1, 1}, {2, 3}));
  g.node("ScatterElements", {"x0", "index", "x1"}, {"y"}).set_name("index_add_0");
  auto model = nn::OnnxModel::load(g.write(test::scratch_folder("scatter")));
  try {
    model->forward_all({test::fd_input({4, 3}, 1), test::fd_input({2, 3}, 2)});
    FAIL("a repeated index was written silently");
  } catch (const core::Error& error) {
    const std::string message = error.what();
    CHECK(message.find("index_add_0") != std::string::npos);
    CHECK(message.find("repeated index") != std::string::npos);
    CHECK(message.find("scatter_add") != std::string::npos);
  }
}

TEST_CASE("OnnxModel ops: forward and finite-difference gradients of each differentiable op") {
  for (const OpCase& op : op_cases()) {
    CAPTURE(op.name);
    check_case(op);
  }
}
