// The message-passing rewrite of nn/onnx/onnx_fusion.h: the aggregation graph networks export
// (scatter_add of gathered rows times per-edge weights, in the legacy exporter's form with its
// Slice and in the dynamo exporter's with GatherND) loads as one mpigrad.GatherMulScatter node,
// and gives the values, first derivatives and double-backward gradients of the same graph with
// the rewrite defeated (an Identity after the gather, which the matcher does not look through).
// Shapes that core::gather_mul_scatter cannot take run the replaced chain, with the same result.
// The SchNet-like potentials the parity tests train are rewritten, one chain per interaction,
// their filters computed once per pair of atoms; energy, forces and the force loss's gradients
// match the graph as written, with the full neighbor list and with one cut short.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/hdf5.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/nn/onnx/onnx_file.h"
#include "mpigrad/nn/onnx/onnx_fusion.h"
#include "mpigrad/nn/onnx/onnx_model.h"
#include "onnx_graph.h"

using namespace mpigrad;
using test::OnnxGraph;

namespace {

constexpr int64_t kAtoms = 5, kEdges = 9, kFeatures = 4;

std::string constant(OnnxGraph& g, const std::string& name, const core::Tensor& value) {
  auto& node = g.node("Constant", {}, {name});
  auto* attribute = node.add_attribute();
  attribute->set_name("value");
  attribute->set_type(onnx::AttributeProto::TENSOR);
  nn::tensor_to_proto(value, *attribute->mutable_t());
  return name;
}

std::string ints(OnnxGraph& g, const std::string& name, std::vector<int64_t> values,
                 core::Shape shape) {
  return constant(g, name, core::Tensor::from_vector(values, shape));
}

void set_int(onnx::NodeProto& node, const char* name, int64_t value) {
  auto* attribute = node.add_attribute();
  attribute->set_name(name);
  attribute->set_type(onnx::AttributeProto::INT);
  attribute->set_i(value);
}

enum class Form {
  Legacy,       // Gather, Mul, Slice to Shape(index), zeros from ConstantOfShape
  ThreeFactor,  // the legacy form with (rows * w) * c, c [E, 1]
  Dynamo,       // GatherND under an identity Transpose, no Slice, zeros from Expand
  Broadcast,    // w [E, 1]: a product core::gather_mul_scatter cannot take
  ExpandAs,     // the three-factor form with the index expanded to Shape(product), a second
                // Shape(product)[1:] output
};

// y[V, F] = sum over edges e of x[src e] * weight[e] at row dst e, edge_index = [src; dst].
// Inputs x [V, F], w [E, F] (or [E, 1]), (c [E, 1],) edge_index [2, E].
OnnxGraph message_graph(Form form, bool defeated) {
  OnnxGraph g(17);
  g.input("x", {-1, kFeatures});
  g.input("w", {-1, form == Form::Broadcast ? 1 : kFeatures});
  const bool three = form == Form::ThreeFactor || form == Form::ExpandAs;
  if (three) g.input("c", {-1, 1});
  g.input("edge_index", {2, -1}, onnx::TensorProto::INT64);
  g.output("y");
  if (form == Form::ExpandAs) g.output("width", onnx::TensorProto::INT64);
  g.node("Gather", {"edge_index", ints(g, "zero", {0}, core::Shape{})}, {"src"});
  g.node("Gather", {"edge_index", ints(g, "one", {1}, core::Shape{})}, {"dst"});
  std::string rows = "rows";
  if (form == Form::Dynamo) {
    g.node("Unsqueeze", {"src", ints(g, "last", {-1}, {1})}, {"src_tuples"});
    set_int(g.node("GatherND", {"x", "src_tuples"}, {"picked"}), "batch_dims", 0);
    auto& transpose = g.node("Transpose", {"picked"}, {rows});
    auto* perm = transpose.add_attribute();
    perm->set_name("perm");
    perm->set_type(onnx::AttributeProto::INTS);
    perm->add_ints(0);
    perm->add_ints(1);
  } else {
    set_int(g.node("Gather", {"x", "src"}, {rows}), "axis", 0);
  }
  if (defeated) {
    g.node("Identity", {rows}, {"rows_again"});
    rows = "rows_again";
  }
  std::string product = "product";
  if (three) {
    g.node("Mul", {"w", rows}, {"partial"});
    g.node("Mul", {"partial", "c"}, {product});
  } else {
    g.node("Mul", {rows, "w"}, {product});
  }
  g.node("Unsqueeze", {"dst", ints(g, "axis1", {1}, {1})}, {"dst_column"});
  if (form == Form::ExpandAs) {
    g.node("Shape", {product}, {"product_shape"});
    g.node("Expand", {"dst_column", "product_shape"}, {"index"});
    set_int(g.node("Shape", {product}, {"width"}), "start", -1);
  } else {
    g.node("Expand", {"dst_column", ints(g, "row_shape", {1, kFeatures}, {2})}, {"index"});
  }
  g.node("Shape", {"x"}, {"x_shape"});
  std::string updates = product;
  if (form != Form::Dynamo) {
    g.node("Shape", {"index"}, {"index_shape"});
    g.node("Slice", {product, ints(g, "starts", {0, 0}, {2}), "index_shape"}, {"updates"});
    updates = "updates";
    auto& zeros = g.node("ConstantOfShape", {"x_shape"}, {"zeros"});
    auto* value = zeros.add_attribute();
    value->set_name("value");
    value->set_type(onnx::AttributeProto::TENSOR);
    nn::tensor_to_proto(core::Tensor::from_vector(std::vector<double>{0.0}, {1}),
                        *value->mutable_t());
  } else {
    const core::Tensor zero = core::Tensor::from_vector(std::vector<double>{0.0}, core::Shape{});
    g.node("Expand", {constant(g, "zero_value", zero), "x_shape"}, {"zeros"});
  }
  auto& scatter = g.node("ScatterElements", {"zeros", "index", updates}, {"y"});
  set_int(scatter, "axis", 0);
  auto* reduction = scatter.add_attribute();
  reduction->set_name("reduction");
  reduction->set_type(onnx::AttributeProto::STRING);
  reduction->set_s("add");
  return g;
}

int64_t compute_nodes(nn::OnnxModel& model) {
  const std::string repr = model.extra_repr();
  return std::stoll(repr.substr(repr.rfind('=') + 1));
}

std::vector<double> values(const core::Tensor& t) {
  return t.to_vector<double>();
}

void check_close(const core::Tensor& got, const core::Tensor& expected, const char* what) {
  INFO(what);
  REQUIRE(got.shape() == expected.shape());
  const auto a = values(got), b = values(expected);
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-12));
}

// One model's output, its gradients as an energy's (create_graph, like forces), and the
// gradients of the squared first derivatives (a force loss's double backward).
struct Derivatives {
  core::Tensor y, first_x, first_w, second_x, second_w, second_c;
};

Derivatives run(nn::OnnxModel& model, Form form) {
  std::vector<double> x_values, w_values, c_values;
  for (int64_t i = 0; i < kAtoms * kFeatures; ++i) x_values.push_back(0.3 * double(i % 7) - 0.8);
  const int64_t w_width = form == Form::Broadcast ? 1 : kFeatures;
  for (int64_t i = 0; i < kEdges * w_width; ++i) w_values.push_back(0.2 * double(i % 5) - 0.3);
  for (int64_t i = 0; i < kEdges; ++i) c_values.push_back(1.0 + 0.1 * double(i));
  // Repeated targets, an atom with no edges in (4), and a negative source (-1 is atom 4).
  const std::vector<int64_t> edges = {0, 1, 2, 3, -1, 1, 0, 2, 3,  //
                                      1, 0, 0, 2, 3,  3, 2, 1, 1};
  core::Tensor x = core::Tensor::from_vector(x_values, {kAtoms, kFeatures}).set_requires_grad(true);
  core::Tensor w = core::Tensor::from_vector(w_values, {kEdges, w_width}).set_requires_grad(true);
  core::Tensor c = core::Tensor::from_vector(c_values, {kEdges, 1}).set_requires_grad(true);
  const core::Tensor edge_index = core::Tensor::from_vector(edges, {2, kEdges});
  std::vector<core::Tensor> inputs = {x, w};
  const bool three = form == Form::ThreeFactor || form == Form::ExpandAs;
  if (three) inputs.push_back(c);
  inputs.push_back(edge_index);
  Derivatives d;
  const std::vector<core::Tensor> outputs = model.forward_all(inputs);
  d.y = outputs[0];
  if (form == Form::ExpandAs) CHECK(outputs[1].to_vector<int64_t>() == std::vector<int64_t>{4});
  core::Tensor mix = core::Tensor::from_vector(x_values, {kAtoms, kFeatures});
  core::GradOptions options;
  options.create_graph = true;
  std::vector<core::Tensor> wrt = {x, w};
  const auto first = core::grad({core::sum(d.y * d.y * mix)}, wrt, {}, options);
  d.first_x = first[0];
  d.first_w = first[1];
  if (three) wrt.push_back(c);
  const auto second =
      core::grad({core::sum(d.first_x * d.first_x) + core::sum(d.first_w * d.first_w)}, wrt);
  d.second_x = second[0];
  d.second_w = second[1];
  if (three) d.second_c = second[2];
  return d;
}

std::filesystem::path scratch(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("mpigrad-test-onnx-message-" + name);
}

void check_form(Form form, const std::string& name) {
  auto fused = nn::OnnxModel::load(message_graph(form, false).write(scratch(name)));
  auto plain = nn::OnnxModel::load(message_graph(form, true).write(scratch(name + "-plain")));
  // The gather (with the dynamo form's Transpose), the product's Mul nodes and the Slice go;
  // the plain graph also has its Identity. The three-factor form multiplies c into w first.
  const bool three = form == Form::ThreeFactor || form == Form::ExpandAs;
  const int64_t replaced = three ? 6 : 5;
  const int64_t added = three ? 2 : 1;
  CHECK(compute_nodes(*plain) - compute_nodes(*fused) == replaced - added);
  const Derivatives a = run(*fused, form), b = run(*plain, form);
  check_close(a.y, b.y, "y");
  check_close(a.first_x, b.first_x, "dy/dx");
  check_close(a.first_w, b.first_w, "dy/dw");
  check_close(a.second_x, b.second_x, "second derivatives in x");
  check_close(a.second_w, b.second_w, "second derivatives in w");
  if (three) check_close(a.second_c, b.second_c, "second derivatives in c");
}

const std::string kAtomistic = std::string(MPIGRAD_SOURCE_DIR) + "/tests/data/atomistic/";

// `file` as it is, or (`plain`) with each ScatterElements' updates also a graph output, which
// keeps every chain, and so every filter, as the exporter wrote it.
onnx::ModelProto potential_proto(const std::string& file, bool plain) {
  onnx::ModelProto proto = nn::read_onnx_model(kAtomistic + file);
  if (plain) {
    std::vector<std::string> updates;
    for (const auto& node : proto.graph().node())
      if (node.op_type() == "ScatterElements") updates.push_back(node.input(2));
    for (const std::string& name : updates) {
      auto* output = proto.mutable_graph()->add_output();
      output->set_name(name);
      output->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
    }
  }
  return proto;
}

std::shared_ptr<nn::OnnxModel> load_potential(const std::string& file, bool plain) {
  return nn::OnnxModel::load_from_bytes(potential_proto(file, plain).SerializeAsString(), file);
}

// Energy [B], forces, and the gradients in the parameters of energy + 10 x |forces|^2 (a
// training step's double backward), on reference.h5's batch with its first `edges` edges.
struct PotentialDerivatives {
  core::Tensor energy, forces;
  std::vector<core::Tensor> parameters;
};

PotentialDerivatives evaluate(nn::OnnxModel& model, int64_t edges) {
  const core::hdf5::File file = core::hdf5::File::open(kAtomistic + "reference.h5");
  core::Tensor positions = file.read_tensor("positions").to(core::kFloat32).set_requires_grad(true);
  const core::Tensor edge_index = file.read_tensor("edge_index").narrow(1, 0, edges).contiguous();
  const core::Tensor shifts =
      file.read_tensor("edge_shifts").to(core::kFloat32).narrow(0, 0, edges).contiguous();
  PotentialDerivatives d;
  d.energy = model.forward_all({positions, file.read_tensor("atomic_numbers"), edge_index, shifts,
                                file.read_tensor("batch"),
                                file.read_tensor("cell").to(core::kFloat32)})[0];
  core::GradOptions options;
  options.create_graph = true;
  d.forces = -core::grad({core::sum(d.energy)}, {positions}, {}, options)[0];
  const core::Tensor loss = core::sum(d.energy) + core::sum(d.forces * d.forces) * 10.0;
  d.parameters = core::grad({loss}, model.parameters());
  return d;
}

// Float32 values against the unshared graph's, to a part in 1e-4 of the largest.
void check_near(const core::Tensor& got, const core::Tensor& expected, const std::string& what) {
  INFO(what);
  REQUIRE(got.shape() == expected.shape());
  const auto a = got.to(core::kFloat64).to_vector<double>();
  const auto b = expected.to(core::kFloat64).to_vector<double>();
  double scale = 1e-6;
  for (double v : b) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(a[i] - b[i]) <= 1e-4 * scale);
  }
}

}  // namespace

TEST_CASE("ONNX message fusion: the legacy exporter's scatter_add, values and double backward") {
  check_form(Form::Legacy, "legacy");
}

TEST_CASE("ONNX message fusion: a product of several factors multiplies the weight first") {
  check_form(Form::ThreeFactor, "three");
}

TEST_CASE("ONNX message fusion: the index expanded as the product, its Shape computed apart") {
  check_form(Form::ExpandAs, "expand-as");
}

TEST_CASE("ONNX message fusion: the dynamo exporter's GatherND under a Transpose") {
  check_form(Form::Dynamo, "dynamo");
}

TEST_CASE("ONNX message fusion: a broadcast weight runs the replaced chain, with its result") {
  check_form(Form::Broadcast, "broadcast");
}

TEST_CASE("ONNX message fusion: a product read elsewhere, or maybe by a subgraph, is left alone") {
  OnnxGraph g = message_graph(Form::Legacy, false);
  g.output("product");
  CHECK(nn::onnx_ops::fuse_message_passing(*g.proto().mutable_graph()) == 0);
  OnnxGraph sliced = message_graph(Form::Legacy, false);
  CHECK(nn::onnx_ops::fuse_message_passing(*sliced.proto().mutable_graph()) == 1);
  // Nor in a graph with a subgraph, which may read the product by name.
  OnnxGraph branching = message_graph(Form::Legacy, false);
  auto& branch = branching.node("If", {"zero"}, {"unused"});
  auto* then_branch = branch.add_attribute();
  then_branch->set_name("then_branch");
  then_branch->set_type(onnx::AttributeProto::GRAPH);
  CHECK(nn::onnx_ops::fuse_message_passing(*branching.proto().mutable_graph()) == 0);
}

TEST_CASE("ONNX message fusion: the exported SchNet-like potentials, one chain per interaction") {
  // The parity potentials have two interactions; make_models.py's one, with its messages times
  // a cutoff and its index expanded as the messages (a Shape of the product).
  for (const auto& [file, chains] :
       std::vector<std::pair<std::string, int>>{{"parity.legacy.onnx", 2},
                                                {"parity.dynamo.onnx", 2},
                                                {"potential.scatter_add.onnx", 1}}) {
    INFO(file);
    onnx::ModelProto proto = nn::read_onnx_model(kAtomistic + file);
    CHECK(nn::onnx_ops::fuse_message_passing(*proto.mutable_graph()) == chains);
    // One pairing of the edges, read by both interactions' fused nodes as their weight_index.
    int pairings = 0, shared = 0;
    for (const auto& node : proto.graph().node()) {
      pairings += node.op_type() == nn::onnx_ops::kEdgePairsOp;
      shared += node.op_type() == nn::onnx_ops::kGatherMulScatterOp && node.input_size() == 11;
    }
    CHECK(pairings == 1);
    CHECK(shared == chains);
  }
}

TEST_CASE("ONNX message fusion: shared pair filters give the exported potential's derivatives") {
  for (const std::string file :
       {"parity.legacy.onnx", "parity.dynamo.onnx", "potential.scatter_add.onnx"}) {
    auto fused = load_potential(file, false);
    auto plain = load_potential(file, true);
    onnx::ModelProto as_written = potential_proto(file, true);
    CHECK(nn::onnx_ops::fuse_message_passing(*as_written.mutable_graph()) == 0);
    // All 32 edges come in reverse pairs; the first 27 leave some edges without a partner.
    for (int64_t edges : {32, 27}) {
      INFO(file, ", ", edges, " edges");
      const PotentialDerivatives a = evaluate(*fused, edges), b = evaluate(*plain, edges);
      check_near(a.energy, b.energy, "energy");
      check_near(a.forces, b.forces, "forces");
      REQUIRE(a.parameters.size() == b.parameters.size());
      for (size_t p = 0; p < a.parameters.size(); ++p)
        check_near(a.parameters[p], b.parameters[p], "parameter " + std::to_string(p));
    }
  }
}
