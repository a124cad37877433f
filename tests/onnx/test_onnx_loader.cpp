// OnnxModel's loading: PyTorch's parameter names, BatchNorm layers with their buffers, train and
// eval modes, external data, and one clear error for each kind of bad file.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "../error_message.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/nn/layers/batch_norm.h"
#include "mpigrad/nn/onnx/onnx_model.h"
#include "onnx_graph.h"

using namespace mpigrad;
using test::error_message;
using test::OnnxGraph;
using test::set_attribute;

namespace {

core::Tensor values(std::vector<float> v, core::Shape shape) {
  return core::Tensor::from_vector(v, shape);
}

// x [N, 2, 3, 3] -> Conv (features.0) -> BatchNormalization (features.1) -> Relu -> Flatten
// -> Gemm (head) -> y [N, 2], in float32 with a free batch dim.
OnnxGraph conv_bn_graph() {
  OnnxGraph g(17);
  g.input("x", {-1, 2, 3, 3}, onnx::TensorProto::FLOAT).output("y", onnx::TensorProto::FLOAT);
  core::Generator generator(7);
  g.initializer("features.0.weight", core::rand({2, 2, 3, 3}, generator) - 0.5);
  g.initializer("features.0.bias", core::zeros({2}));
  g.initializer("features.1.weight", values({1.0f, 2.0f}, {2}));
  g.initializer("features.1.bias", values({0.5f, -0.5f}, {2}));
  g.initializer("features.1.running_mean", values({0.1f, 0.2f}, {2}));
  g.initializer("features.1.running_var", values({1.5f, 0.5f}, {2}));
  g.initializer("head.weight", core::rand({2, 18}, generator) - 0.5);
  g.initializer("head.bias", core::zeros({2}));
  set_attribute(g.node("Conv", {"x", "features.0.weight", "features.0.bias"}, {"c"}, "conv"),
                "pads", {1, 1, 1, 1});
  g.node("BatchNormalization",
         {"c", "features.1.weight", "features.1.bias", "features.1.running_mean",
          "features.1.running_var"},
         {"b"}, "bn");
  g.node("Relu", {"b"}, {"r"});
  g.node("Flatten", {"r"}, {"f"});
  set_attribute(g.node("Gemm", {"f", "head.weight", "head.bias"}, {"y"}, "head"), "transB",
                int64_t(1));
  return g;
}

nn::Module& module_named(nn::Module& root, const std::string& name) {
  for (auto& [module_name, module] : root.named_modules())
    if (module_name == name) return *module;
  FAIL("no module " << name);
  return root;
}

std::map<std::string, core::Shape> shapes_of(
    const std::vector<std::pair<std::string, core::Tensor>>& named) {
  std::map<std::string, core::Shape> out;
  for (const auto& [name, tensor] : named) out[name] = tensor.shape();
  return out;
}

}  // namespace

TEST_CASE("OnnxModel: parameters and buffers carry PyTorch's dotted names") {
  auto model = nn::OnnxModel::load(conv_bn_graph().write(test::scratch_folder("names")));
  const auto parameters = shapes_of(model->named_parameters());
  CHECK(parameters.size() == 6);
  CHECK(parameters.at("features.0.weight") == core::Shape{2, 2, 3, 3});
  CHECK(parameters.at("features.1.weight") == core::Shape{2});
  CHECK(parameters.at("head.weight") == core::Shape{2, 18});
  const auto buffers = shapes_of(model->named_buffers());
  CHECK(buffers.size() == 3);
  CHECK(buffers.count("features.1.running_mean") == 1);
  CHECK(buffers.count("features.1.running_var") == 1);
  CHECK(buffers.count("features.1.num_batches_tracked") == 1);
  // The state dict is what a checkpoint holds: the same keys as the torch module's.
  CHECK(model->state_dict().size() == 9);
  CHECK(model->type_name() == "OnnxModel");
  REQUIRE(model->graph_inputs().size() == 1);
  CHECK(model->graph_inputs()[0].shape == std::vector<int64_t>{-1, 2, 3, 3});
  CHECK(model->graph_inputs()[0].dtype == core::kFloat32);
  for (const auto& [name, p] : model->named_parameters()) CHECK(p.requires_grad());
}

TEST_CASE("OnnxModel: deep dotted names become a tree of child modules") {
  OnnxGraph g(17);
  // A fixed batch of 2 as the legacy exporter writes it: the batch dim stays free.
  g.input("x", {2, 3}, onnx::TensorProto::FLOAT).output("y", onnx::TensorProto::FLOAT);
  g.initializer("enc.layers.1.linear1.weight", core::ones({4, 3}));
  g.initializer("enc.layers.1.linear1.bias", core::zeros({4}));
  set_attribute(
      g.node("Gemm", {"x", "enc.layers.1.linear1.weight", "enc.layers.1.linear1.bias"}, {"y"}),
      "transB", int64_t(1));
  auto model = nn::OnnxModel::load(g.write(test::scratch_folder("tree")));
  const auto names = shapes_of(model->named_parameters());
  CHECK(names.count("enc.layers.1.linear1.weight") == 1);
  CHECK(names.count("enc.layers.1.linear1.bias") == 1);
  REQUIRE(model->named_children().size() == 1);
  CHECK(model->named_children()[0].first == "enc");
  const core::Tensor y = model->forward(core::ones({5, 3}));
  CHECK(y.shape() == core::Shape{5, 4});
  CHECK(y.to_vector<float>()[0] == doctest::Approx(3.0));
}

TEST_CASE("OnnxModel: BatchNorm follows train()/eval() and is a replaceable child layer") {
  auto model = nn::OnnxModel::load(conv_bn_graph().write(test::scratch_folder("bn")));
  core::Generator generator(3);
  const core::Tensor x = core::randn({4, 2, 3, 3}, generator);
  core::Tensor& running_mean = module_named(*model, "features.1").buffer("running_mean");
  const auto before = running_mean.to_vector<float>();

  model->eval();
  const core::Tensor eval_1 = model->forward(x);
  CHECK(running_mean.to_vector<float>() == before);

  model->train();
  const core::Tensor train_out = model->forward(x);
  CHECK(running_mean.to_vector<float>() != before);  // updated with the batch statistics
  CHECK(module_named(*model, "features.1").buffer("num_batches_tracked").item<int64_t>() == 1);

  // The BN layer is found by name at every forward: a replacement (as convert_sync_batchnorm
  // makes) is the one the graph then runs.
  nn::Module* features = &module_named(*model, "features");
  auto replacement = std::make_shared<nn::BatchNorm2d>(2);
  auto old = features->replace_child("1", replacement);
  CHECK(dynamic_cast<nn::BatchNorm*>(old.get()) != nullptr);
  model->eval();
  const core::Tensor eval_2 = model->forward(x);
  // Identity statistics and affine now: a different result from the file's BN.
  CHECK(core::max(core::abs(eval_2 - eval_1)).item<float>() > 1e-4f);
  CHECK(model->named_buffers().size() == 3);
}

TEST_CASE("OnnxModel: a BatchNormalization that only a Relu reads runs fused, same results") {
  // x -> BatchNormalization (bn) -> Relu -> y; the twin also reads the batch norm's output
  // elsewhere (an Identity), and a third makes it a graph output: those two run unfused.
  auto graph = [](int variant) {
    OnnxGraph g(17);
    g.input("x", {-1, 3, 4, 4}, onnx::TensorProto::FLOAT).output("y", onnx::TensorProto::FLOAT);
    if (variant == 2) g.output("b", onnx::TensorProto::FLOAT);
    g.initializer("bn.weight", values({1.0f, 2.0f, -0.5f}, {3}));
    g.initializer("bn.bias", values({0.5f, -0.5f, 0.25f}, {3}));
    g.initializer("bn.running_mean", values({0.1f, 0.2f, 0.0f}, {3}));
    g.initializer("bn.running_var", values({1.5f, 0.5f, 1.0f}, {3}));
    g.node("BatchNormalization", {"x", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"},
           {"b"}, "bn");
    g.node("Relu", {"b"}, {"y"}, "relu");
    if (variant == 1) g.node("Identity", {"b"}, {"unused"}, "other_reader");
    return g;
  };
  auto fused = nn::OnnxModel::load(graph(0).write(test::scratch_folder("bn_relu_fused")));
  auto apart = nn::OnnxModel::load(graph(1).write(test::scratch_folder("bn_relu_apart")));
  auto output = nn::OnnxModel::load(graph(2).write(test::scratch_folder("bn_relu_output")));
  core::Generator generator(5);
  const core::Tensor x0 = core::randn({4, 3, 4, 4}, generator);
  const core::Tensor upstream = core::randn({4, 3, 4, 4}, generator);
  std::vector<std::vector<float>> grads;
  std::vector<std::string> nodes;
  for (nn::OnnxModel* model : {fused.get(), apart.get(), output.get()}) {
    model->train();
    core::Tensor x = x0.detach().set_requires_grad(true);
    core::Tensor y = model->forward(x);
    nodes.push_back(y.grad_fn() ? y.grad_fn()->name() : "(leaf)");
    core::sum(y * upstream).backward();
    grads.push_back(y.to_vector<float>());
    grads.push_back(x.grad().to_vector<float>());
    grads.push_back(model->named_parameters()[0].second.grad().to_vector<float>());
    grads.push_back(model->named_buffers()[0].second.to_vector<float>());  // running mean
  }
  CHECK(nodes[0] == "BatchNormReluBackward");
  CHECK(nodes[1] != "BatchNormReluBackward");
  CHECK(nodes[2] != "BatchNormReluBackward");
  for (size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(grads[i] == grads[4 + i]);  // bitwise
    CHECK(grads[i] == grads[8 + i]);
  }
  // Replaced by another module (as convert_sync_batchnorm does), the layer runs, then the ReLU.
  fused->replace_child("bn", std::make_shared<nn::BatchNorm2d>(3));
  const core::Tensor replaced = fused->forward(x0);
  CHECK(core::min(replaced).item<float>() >= 0.0f);
  CHECK(core::max(replaced).item<float>() > 0.0f);
}

TEST_CASE("OnnxModel: Dropout is active in train() only, from the module's generator") {
  OnnxGraph g(17);
  g.input("x", {-1, 1000}, onnx::TensorProto::FLOAT).output("y", onnx::TensorProto::FLOAT);
  g.initializer("ratio", core::Tensor::scalar(0.5));
  g.initializer("training", core::Tensor::from_vector(std::vector<bool>{false}, core::Shape{}));
  g.node("Dropout", {"x", "ratio", "training"}, {"y"});
  auto model = nn::OnnxModel::load(g.write(test::scratch_folder("dropout")));
  const core::Tensor x = core::ones({2, 1000});
  model->eval();
  CHECK(core::sum(model->forward(x)).item<float>() == doctest::Approx(2000.0));
  model->train();  // the file's training_mode = false does not matter
  const auto y = model->forward(x).to_vector<float>();
  int zeros = 0;
  for (float v : y) {
    CHECK((v == 0.0f || v == doctest::Approx(2.0)));
    zeros += v == 0.0f;
  }
  CHECK(zeros > 800);
  CHECK(zeros < 1200);
  REQUIRE(model->named_generators().size() == 1);
  CHECK(model->named_generators()[0].first == "dropout");
}

TEST_CASE("OnnxModel: int64 inputs stay int64 for Gather (an embedding)") {
  OnnxGraph g(17);
  g.input("tokens", {-1, 3}, onnx::TensorProto::INT64).output("y", onnx::TensorProto::FLOAT);
  g.initializer("embed.weight", core::arange(0.0, 8.0, 1.0, core::kFloat32).reshape({4, 2}));
  g.node("Gather", {"embed.weight", "tokens"}, {"y"});
  auto model = nn::OnnxModel::load(g.write(test::scratch_folder("gather")));
  CHECK(model->graph_inputs()[0].dtype == core::kInt64);
  const core::Tensor tokens =
      core::Tensor::from_vector(std::vector<int64_t>{3, 0, 1, 1, 2, 3}, {2, 3});
  const core::Tensor y = model->forward(tokens);
  CHECK(y.shape() == core::Shape{2, 3, 2});
  CHECK(y.to_vector<float>()[0] == 6.0f);
  core::sum(y).backward();
  CHECK(model->named_parameters()[0].second.grad().to_vector<float>()[2] == 2.0f);  // row 1 twice
}

TEST_CASE("OnnxModel: weights in an external data file beside the model") {
  auto folder = test::scratch_folder("external");
  OnnxGraph g(18, 10);
  g.input("x", {-1, 2}, onnx::TensorProto::FLOAT).output("y", onnx::TensorProto::FLOAT);
  g.initializer("fc.weight", values({1, 2, 3, 4, 5, 6}, {3, 2}));
  auto* weight = g.proto().mutable_graph()->mutable_initializer(0);
  const std::string bytes = weight->raw_data();
  weight->clear_raw_data();
  weight->set_data_location(onnx::TensorProto::EXTERNAL);
  auto add = [&](const std::string& key, const std::string& value) {
    auto* entry = weight->add_external_data();
    entry->set_key(key);
    entry->set_value(value);
  };
  add("location", "model.onnx.data");
  add("offset", "8");
  add("length", std::to_string(bytes.size()));
  {
    std::ofstream out(folder / "model.onnx.data", std::ios::binary);
    out << std::string(8, '\0') << bytes;
  }
  set_attribute(g.node("Gemm", {"x", "fc.weight"}, {"y"}), "transB", int64_t(1));
  const std::string path = g.write(folder);
  auto model = nn::OnnxModel::load(path);
  const auto y = model->forward(values({1, 1}, {1, 2})).to_vector<float>();
  CHECK(y == std::vector<float>{3, 7, 11});

  std::filesystem::remove(folder / "model.onnx.data");
  const std::string message = error_message([&] { nn::OnnxModel::load(path); });
  CHECK(message.find("model.onnx.data") != std::string::npos);
  CHECK(message.find("fc.weight") != std::string::npos);
  CHECK(message.find("missing") != std::string::npos);
}

TEST_CASE("OnnxModel: each bad file is one error naming the file and what is wrong") {
  auto folder = test::scratch_folder("bad");
  const std::string good = conv_bn_graph().write(folder, "good.onnx");
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream out(folder / name, std::ios::binary);
    out << content;
    return (folder / name).string();
  };

  SUBCASE("missing file") {
    const std::string message =
        error_message([&] { nn::OnnxModel::load((folder / "nope.onnx").string()); });
    CHECK(message.find("nope.onnx") != std::string::npos);
  }
  SUBCASE("truncated file") {
    const std::string path = write("truncated.onnx", bytes.substr(0, bytes.size() / 2));
    const std::string message = error_message([&] { nn::OnnxModel::load(path); });
    CHECK(message.find("truncated.onnx") != std::string::npos);
  }
  SUBCASE("corrupt file") {
    std::string corrupt = bytes;
    for (size_t i = 0; i < corrupt.size(); i += 7) corrupt[i] = char(0xff);
    const std::string path = write("corrupt.onnx", corrupt);
    const std::string message = error_message([&] { nn::OnnxModel::load(path); });
    CHECK(message.find("corrupt.onnx") != std::string::npos);
  }
  SUBCASE("unknown op: type, node, opset and file, before anything runs") {
    OnnxGraph g = conv_bn_graph();
    g.node("FancyOp", {"y"}, {"z"}, "my_fancy_node");
    const std::string path = g.write(folder, "unknown.onnx");
    const std::string message = error_message([&] { nn::OnnxModel::load(path); });
    CHECK(message.find("FancyOp") != std::string::npos);
    CHECK(message.find("my_fancy_node") != std::string::npos);
    CHECK(message.find("opset 17") != std::string::npos);
    CHECK(message.find("unknown.onnx") != std::string::npos);
  }
  SUBCASE("missing initializer") {
    OnnxGraph g = conv_bn_graph();
    g.proto().mutable_graph()->mutable_initializer()->RemoveLast();  // head.bias
    const std::string path = g.write(folder, "missing.onnx");
    const std::string message = error_message([&] { nn::OnnxModel::load(path); });
    CHECK(message.find("head.bias") != std::string::npos);
    CHECK(message.find("'head'") != std::string::npos);
    CHECK(message.find("missing.onnx") != std::string::npos);
  }
  SUBCASE("opset outside 7..20") {
    for (int64_t opset : {6, 21}) {
      OnnxGraph g = conv_bn_graph();
      g.proto().mutable_opset_import(0)->set_version(opset);
      const std::string path = g.write(folder, "opset.onnx");
      const std::string message = error_message([&] { nn::OnnxModel::load(path); });
      CHECK(message.find("opset " + std::to_string(opset)) != std::string::npos);
      CHECK(message.find("opset.onnx") != std::string::npos);
    }
  }
  SUBCASE("IR version above 10") {
    OnnxGraph g = conv_bn_graph();
    g.proto().set_ir_version(11);
    const std::string path = g.write(folder, "ir.onnx");
    CHECK(error_message([&] { nn::OnnxModel::load(path); }).find("IR version 11") !=
          std::string::npos);
  }
  SUBCASE("input whose shape does not fit the data") {
    auto model = nn::OnnxModel::load(good);
    const std::string message = error_message([&] { model->forward(core::zeros({4, 3, 3, 3})); });
    CHECK(message.find("good.onnx") != std::string::npos);
    CHECK(message.find("'x'") != std::string::npos);
    CHECK(message.find("[4, 3, 3, 3]") != std::string::npos);
    CHECK(message.find("[?, 2, 3, 3]") != std::string::npos);
    CHECK(model->forward(core::zeros({7, 2, 3, 3})).shape() == core::Shape{7, 2});
    CHECK(error_message([&] { model->forward_all({}); }).find("1 input") != std::string::npos);
  }
  SUBCASE("an op failing at run time names its node") {
    OnnxGraph g(17);
    g.input("x", {-1, -1}, onnx::TensorProto::FLOAT).output("y", onnx::TensorProto::FLOAT);
    g.initializer("shape", core::Tensor::from_vector(std::vector<int64_t>{7, -1}, {2}));
    g.node("Reshape", {"x", "shape"}, {"y"}, "reshape_node");
    auto model = nn::OnnxModel::load(g.write(folder, "runtime.onnx"));
    const std::string message = error_message([&] { model->forward(core::zeros({2, 3})); });
    CHECK(message.find("reshape_node") != std::string::npos);
    CHECK(message.find("runtime.onnx") != std::string::npos);
  }
}
