// fuzz_make_onnx_seeds DIR: writes the seed models of fuzz_onnx (small graphs that exercise the
// loader's paths: parameters and a BatchNorm layer, shape arithmetic, settings inputs, external
// data that is not there), built with ONNX's protobuf classes as the loader's tests build theirs.
#include <cstdio>
#include <string>

#include "../tests/onnx/onnx_graph.h"
#include "mpigrad/core/ops/elementwise.h"

using namespace mpigrad;
using test::OnnxGraph;
using test::set_attribute;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  auto floats = [](int64_t n) { return core::arange(0.0, double(n), 1.0, core::kFloat32) * 0.1; };
  {
    OnnxGraph g(17);
    g.input("x", {-1, 1, 4, 4}, onnx::TensorProto::FLOAT).output("y", onnx::TensorProto::FLOAT);
    g.initializer("c.weight", floats(18).reshape({2, 1, 3, 3}));
    g.initializer("c.bias", floats(2));
    for (const char* name : {"bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"})
      g.initializer(name, floats(2) + 1.0);
    g.initializer("fc.weight", floats(24).reshape({3, 8}));
    set_attribute(g.node("Conv", {"x", "c.weight", "c.bias"}, {"a"}), "pads", {1, 1, 1, 1});
    g.node("BatchNormalization", {"a", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"},
           {"b"});
    g.node("Relu", {"b"}, {"r"});
    auto& pool = g.node("MaxPool", {"r"}, {"p"});
    set_attribute(pool, "kernel_shape", {2, 2});
    set_attribute(pool, "strides", {2, 2});
    g.node("Flatten", {"p"}, {"f"});
    set_attribute(g.node("Gemm", {"f", "fc.weight"}, {"y"}), "transB", int64_t(1));
    g.write(dir, "conv_bn.onnx");
  }
  {
    OnnxGraph g(18, 10);
    g.input("x", {-1, 3, 4}, onnx::TensorProto::FLOAT).output("y", onnx::TensorProto::FLOAT);
    g.initializer("axes", core::Tensor::from_vector(std::vector<int64_t>{-1}, {1}));
    g.initializer("minus_one", core::Tensor::from_vector(std::vector<int64_t>{-1}, {1}));
    g.initializer("zero", core::Tensor::from_vector(std::vector<int64_t>{0}, core::Shape{}));
    g.node("Shape", {"x"}, {"s"});
    g.node("Gather", {"s", "zero"}, {"n"});
    g.node("Unsqueeze", {"n", "axes"}, {"n1"});
    set_attribute(g.node("Concat", {"n1", "minus_one"}, {"t"}), "axis", int64_t(0));
    g.node("Reshape", {"x", "t"}, {"flat"});
    g.node("ReduceMean", {"flat", "axes"}, {"m"});
    g.node("Softmax", {"flat"}, {"sm"});
    g.node("Mul", {"sm", "m"}, {"y"});
    g.write(dir, "shape_arithmetic.onnx");
  }
  {
    OnnxGraph g(13);
    g.input("x", {1, 1, 3, 3}, onnx::TensorProto::FLOAT).output("y", onnx::TensorProto::FLOAT);
    g.initializer("scales", core::Tensor::from_vector(std::vector<float>{1, 1, 2, 2}, {4}));
    g.initializer("pads",
                  core::Tensor::from_vector(std::vector<int64_t>{0, 0, 1, 1, 0, 0, 1, 1}, {8}));
    set_attribute(g.node("Resize", {"x", "", "scales"}, {"u"}), "mode", std::string("linear"));
    set_attribute(g.node("Pad", {"u", "pads"}, {"y"}), "mode", std::string("reflect"));
    g.write(dir, "resize_pad.onnx");
  }
  {
    OnnxGraph g(18, 10);
    g.input("x", {-1, 2}, onnx::TensorProto::FLOAT).output("y", onnx::TensorProto::FLOAT);
    g.initializer("fc.weight", floats(4).reshape({2, 2}));
    auto* weight = g.proto().mutable_graph()->mutable_initializer(0);
    weight->clear_raw_data();
    weight->set_data_location(onnx::TensorProto::EXTERNAL);
    auto* location = weight->add_external_data();
    location->set_key("location");
    location->set_value("absent.onnx.data");
    g.node("MatMul", {"x", "fc.weight"}, {"y"});
    g.write(dir, "external_data.onnx");
  }
  {
    OnnxGraph g(18, 10);
    g.input("x", {-1, 4}, onnx::TensorProto::FLOAT).output("y", onnx::TensorProto::FLOAT);
    g.initializer("two", core::Tensor::from_vector(std::vector<int64_t>{2}, core::Shape{}));
    g.initializer("last", core::Tensor::from_vector(std::vector<int64_t>{-1}, core::Shape{}));
    set_attribute(g.node("SplitToSequence", {"x", "two"}, {"pieces"}), "axis", int64_t(1));
    g.node("SequenceAt", {"pieces", "last"}, {"b"});
    g.node("SequenceInsert", {"pieces", "b"}, {"more"});
    set_attribute(g.node("ConcatFromSequence", {"more"}, {"y"}), "axis", int64_t(1));
    g.write(dir, "sequences.onnx");
  }
  return 0;
}
