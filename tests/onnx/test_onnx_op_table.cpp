// The ONNX op table (nn/onnx/onnx_op_table.h), one row per op: each row is consistent with
// itself, and what the loader derives from the rows (which ops it accepts, each op's arity,
// which inputs are settings, which nodes run once at load) is what the rows say.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "../error_message.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/nn/onnx/onnx_model.h"
#include "mpigrad/nn/onnx/onnx_op_table.h"
#include "onnx_graph.h"

using namespace mpigrad;
using nn::onnx_ops::kNoSettings;
using nn::onnx_ops::kVariadic;
using nn::onnx_ops::op_table;
using test::error_message;
using test::OnnxGraph;
using test::set_attribute;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The message of loading a one-node graph: `op` over `count` graph inputs x0.. (float [1]).
std::string load_one_node(const std::string& op, int count) {
  OnnxGraph g(17);
  std::vector<std::string> inputs;
  for (int i = 0; i < count; ++i) {
    inputs.push_back(std::string("x").append(std::to_string(i)));
    g.input(inputs.back(), {1}, onnx::TensorProto::FLOAT);
  }
  g.output("y", onnx::TensorProto::FLOAT);
  g.node(op, inputs, {"y"}, "the_node");
  const std::string path =
      g.write(test::scratch_folder(std::string("table-").append(op)), "one.onnx");
  return error_message([&] { nn::OnnxModel::load(path); });
}

}  // namespace

TEST_CASE("ONNX op table: every row is consistent with itself") {
  CHECK(op_table().rows().size() >= 100);
  for (const auto& [name, info] : op_table().rows()) {
    const std::string& op = name;  // doctest's CAPTURE cannot take a structured binding
    const nn::onnx_ops::OpInfo& row = info;
    CAPTURE(op);
    CHECK(std::visit([](const auto& build) { return bool(build); }, row.build));
    CHECK(row.inputs.min >= 0);
    CHECK(row.inputs.min <= row.inputs.max);
    // Setting inputs lie within the op's arity.
    if (row.settings_from != kNoSettings) {
      CHECK(row.settings_from >= 0);
      CHECK(row.settings_from < row.inputs.max);
    }
    // A sequence lives for one forward: no sequence op may run at load.
    if (row.is_sequence_op()) CHECK_FALSE(row.foldable);
    // The importer accepts exactly the ops with a row, at every opset it reads.
    CHECK(nn::onnx_op_supported(op, nn::kOnnxMinOpset));
    CHECK(nn::onnx_op_supported(op, nn::kOnnxMaxOpset));
    CHECK_FALSE(nn::onnx_op_supported(op, nn::kOnnxMaxOpset + 1));
  }
  // Ops whose result depends on train()/eval() or a generator never run at load.
  CHECK_FALSE(op_table().find("Dropout")->foldable);
  CHECK_FALSE(op_table().find("BatchNormalization")->foldable);
  // The old never-fold list named two random ops that the importer never ran: they have no row
  // and stay unsupported (a row for them must say not_foldable()).
  for (const char* op : {"RandomNormal", "RandomUniform", "FancyOp"}) {
    CAPTURE(op);
    CHECK(op_table().find(op) == nullptr);
    CHECK_FALSE(nn::onnx_op_supported(op, 17));
  }
  // Sequence handling comes from the row alone.
  CHECK(op_table().find("SequenceAt")->is_sequence_op());
  CHECK_FALSE(op_table().find("Concat")->is_sequence_op());
}

TEST_CASE("ONNX op table: every row's arity is checked at load, naming the node") {
  for (const auto& [name, info] : op_table().rows()) {
    const std::string& op = name;  // doctest's CAPTURE cannot take a structured binding
    const nn::onnx_ops::OpInfo& row = info;
    CAPTURE(op);
    if (row.inputs.min > 0) {
      const std::string message = load_one_node(op, row.inputs.min - 1);
      CHECK(contains(message, "the_node"));
      CHECK(contains(message, "needs at least " + std::to_string(row.inputs.min)));
    }
    if (row.inputs.max != kVariadic) {
      const std::string message = load_one_node(op, row.inputs.max + 1);
      CHECK(contains(message, "the_node"));
      CHECK(contains(message, "takes at most " + std::to_string(row.inputs.max)));
    }
    // Within the arity, a node may still fail (a missing attribute), but not for its count.
    for (int count : {row.inputs.min, std::min(row.inputs.max, 6)}) {
      const std::string message = load_one_node(op, count);
      CHECK_FALSE(contains(message, "needs at least"));
      CHECK_FALSE(contains(message, "takes at most"));
      CHECK_FALSE(contains(message, "does not support"));
    }
  }
}

TEST_CASE("ONNX op table: an unknown op is one error listing every such node") {
  OnnxGraph g(17);
  g.input("x", {1}, onnx::TensorProto::FLOAT).output("y", onnx::TensorProto::FLOAT);
  g.node("FancyOp", {"x"}, {"a"}, "fancy");
  g.node("RandomNormal", {}, {"b"}, "random");
  g.node("Relu", {"x"}, {"c"}, "other_domain").set_domain("com.example");
  g.node("Relu", {"x"}, {"y"}, "fine");
  const std::string path = g.write(test::scratch_folder("table-unknown"), "unknown.onnx");
  const std::string message = error_message([&] { nn::OnnxModel::load(path); });
  CHECK(contains(message, "unknown.onnx (opset 17): 3 node(s) use ops mpigrad does not support"));
  CHECK(contains(message, "FancyOp in node 'fancy'"));
  CHECK(contains(message, "RandomNormal in node 'random'"));
  CHECK(contains(message, "Relu (domain com.example) in node 'other_domain'"));
  CHECK_FALSE(contains(message, "'fine'"));
}

TEST_CASE("ONNX op table: a floating initializer read only at setting inputs is no parameter") {
  OnnxGraph g(17);
  g.input("x", {-1, 3}, onnx::TensorProto::FLOAT).output("y", onnx::TensorProto::FLOAT);
  g.initializer("scale", core::full({3}, 2.0));
  g.initializer("low", core::Tensor::scalar(-0.5, core::kFloat32));
  g.initializer("high", core::Tensor::scalar(0.5, core::kFloat32));
  g.node("Mul", {"x", "scale"}, {"m"});
  g.node("Clip", {"m", "low", "high"}, {"y"});  // inputs 1 and 2 are settings
  auto model = nn::OnnxModel::load(g.write(test::scratch_folder("table-settings")));
  std::vector<std::string> names;
  for (const auto& [name, value] : model->named_parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"scale"});
  const core::Tensor y =
      model->forward(core::Tensor::from_vector(std::vector<float>{-1.0f, 0.1f, 1.0f}, {1, 3}));
  CHECK(y.to_vector<float>() == std::vector<float>{-0.5f, 0.2f, 0.5f});
}

TEST_CASE("ONNX op table: a not-foldable op on constants still runs at every forward") {
  // Dropout reads only a Constant: were it folded at load (in eval), train() would not drop.
  OnnxGraph g(17);
  g.output("y", onnx::TensorProto::FLOAT);
  auto* value = g.node("Constant", {}, {"c"}).add_attribute();
  value->set_name("value");
  value->set_type(onnx::AttributeProto::TENSOR);
  nn::tensor_to_proto(core::ones({1000}), *value->mutable_t());
  g.node("Dropout", {"c"}, {"y"});
  auto model = nn::OnnxModel::load(g.write(test::scratch_folder("table-fold")));
  model->train();
  const double kept = core::sum(model->forward_all({}).at(0)).item<double>();
  CHECK(kept > 0.0);
  CHECK(kept < 1000.0 * 2.0 * 0.9);  // about half dropped, the rest scaled by 2
  CHECK(kept != doctest::Approx(1000.0));
  model->eval();
  CHECK(core::sum(model->forward_all({}).at(0)).item<double>() == doctest::Approx(1000.0));
}

TEST_CASE("ONNX op table: sequence ops take the inputs ONNX gives them") {
  // SequenceEmpty takes no input (ONNX's own test_sequence_model1 starts with one); the table
  // used to ask for one.
  OnnxGraph g(17);
  g.input("x", {2, 3}, onnx::TensorProto::FLOAT).output("y", onnx::TensorProto::FLOAT);
  g.node("SequenceEmpty", {}, {"empty"});
  g.node("SequenceInsert", {"empty", "x"}, {"one"});
  g.node("SequenceInsert", {"one", "x"}, {"two"});
  set_attribute(g.node("ConcatFromSequence", {"two"}, {"y"}), "axis", int64_t(0));
  auto model = nn::OnnxModel::load(g.write(test::scratch_folder("table-sequence")));
  const core::Tensor x = core::Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  const core::Tensor y = model->forward(x);
  CHECK(y.shape() == core::Shape{4, 3});
  CHECK(y.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6});
  // SequenceAt without its position is an error at load naming the node, not at a forward.
  const std::string message = load_one_node("SequenceAt", 1);
  CHECK(contains(message, "the_node"));
  CHECK(contains(message, "needs at least 2"));
}
