// The message-passing rewrite of onnx_fusion.h: finds the sum of gathered rows times per-edge
// weights that graph networks export (SchNet's interaction, PaiNN's messages), and replaces the
// nodes that hold [E, ...] data (the gathered rows, the products, the Slice, the scatter) with
// one mpigrad.GatherMulScatter node. The index side (Unsqueeze, Expand, shape arithmetic) stays
// in the graph: it is views and host integers, and the fused node reads its shapes to decide at
// each forward whether core::gather_mul_scatter computes the same thing (onnx_ops_scatter.cpp).
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "mpigrad/nn/onnx/onnx_file.h"
#include "mpigrad/nn/onnx/onnx_fusion.h"

namespace mpigrad::nn::onnx_ops {

namespace {

const onnx::AttributeProto* attribute(const onnx::NodeProto& node, const char* name) {
  for (const auto& a : node.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

int64_t int_attribute(const onnx::NodeProto& node, const char* name, int64_t fallback) {
  const auto* a = attribute(node, name);
  return a != nullptr && a->type() == onnx::AttributeProto::INT ? a->i() : fallback;
}

class Graph {
 public:
  explicit Graph(const onnx::GraphProto& graph) : graph_(graph) {
    for (int n = 0; n < graph.node_size(); ++n) {
      for (const auto& output : graph.node(n).output()) producer_[output] = n;
      for (const auto& input : graph.node(n).input()) readers_[input].push_back(n);
    }
    for (const auto& output : graph.output()) readers_[output.name()].push_back(-1);
  }

  // The index of the node writing `value` if it is a default-domain `op`; -1 otherwise.
  int produced_by(const std::string& value, const char* op) const {
    const auto it = producer_.find(value);
    if (it == producer_.end()) return -1;
    const auto& node = graph_.node(it->second);
    return node.op_type() == op && node.domain().empty() && node.output_size() == 1 ? it->second
                                                                                    : -1;
  }
  const onnx::NodeProto& node(int n) const { return graph_.node(n); }
  // Read by exactly one node input, and not a graph output.
  // The nodes reading `value` (-1 for a graph output), one entry per input that reads it.
  std::vector<int> readers(const std::string& value) const {
    const auto it = readers_.find(value);
    return it == readers_.end() ? std::vector<int>{} : it->second;
  }
  bool read_once(const std::string& value) const {
    const auto it = readers_.find(value);
    return it != readers_.end() && it->second.size() == 1 && it->second[0] >= 0;
  }

 private:
  const onnx::GraphProto& graph_;
  std::map<std::string, int> producer_;
  std::map<std::string, std::vector<int>> readers_;
};

// One chain found: the scatter at `scatter`, and the nodes whose [E, ...] values it replaces.
struct MessageMatch {
  int scatter = -1;
  std::string data, x, src, index, column;
  bool src_tuple = false;            // src is GatherND's [E, 1] index tuples, not Gather's [E] rows
  bool zero_base = false;            // data is a ConstantOfShape of zeros
  std::vector<std::string> factors;  // the weight: their product
  std::string gathered;              // x's rows at src: the chain's one [E, ...] gather
  int slice = -1;
  std::vector<int> gather_nodes;  // what computes `gathered`, in file order
  std::vector<int> product_nodes;
  std::vector<int> shape_readers;  // Shape nodes of the product (torch's expand_as)
};

class MessageMatcher {
 public:
  explicit MessageMatcher(const Graph& graph) : graph_(graph) {}

  std::optional<MessageMatch> match(int n) const {
    const onnx::NodeProto& scatter = graph_.node(n);
    if (scatter.op_type() != "ScatterElements" || !scatter.domain().empty() ||
        scatter.input_size() != 3 || int_attribute(scatter, "axis", 0) != 0)
      return std::nullopt;
    const auto* reduction = attribute(scatter, "reduction");
    if (reduction == nullptr || reduction->s() != "add") return std::nullopt;
    MessageMatch found;
    found.scatter = n;
    found.data = scatter.input(0);
    found.index = scatter.input(1);
    // The index: Expand(column, shape), or the column itself, where at run time the column must
    // be [E, 1, ..., 1] (Unsqueeze or Reshape of the targets).
    found.column = found.index;
    if (const int expand = graph_.produced_by(found.index, "Expand"); expand >= 0)
      found.column = graph_.node(expand).input(0);
    // The updates: the product, or a Slice of it (the legacy exporter's scatter_add).
    std::string product = scatter.input(2);
    if (const int slice = graph_.produced_by(product, "Slice"); slice >= 0) {
      const onnx::NodeProto& node = graph_.node(slice);
      if (!graph_.read_once(product) || node.input_size() < 3 || node.attribute_size() != 0)
        return std::nullopt;  // opset < 10 has attributes
      found.slice = slice;
      product = node.input(0);
    }
    // Read once, or also by Shape nodes, which a node computing its shape replaces.
    int other_readers = 0;
    for (int reader : graph_.readers(product)) {
      const bool shape = reader >= 0 && graph_.node(reader).op_type() == "Shape" &&
                         graph_.node(reader).domain().empty();
      if (shape) {
        found.shape_readers.push_back(reader);
      } else {
        ++other_readers;
      }
    }
    if (other_readers != 1) return std::nullopt;
    if (!split_product(product, found, 0) || found.factors.empty()) return std::nullopt;
    if (const int constant = graph_.produced_by(found.data, "ConstantOfShape"); constant >= 0)
      found.zero_base = is_zero_fill(graph_.node(constant));
    return found;
  }

 private:
  // `value` = gathered * factor * ...: Mul nodes over exactly one gathered leaf, each inner
  // value read once.
  bool split_product(const std::string& value, MessageMatch& found, int depth) const {
    const int mul = graph_.produced_by(value, "Mul");
    if (mul < 0 || depth > 4) return false;
    const onnx::NodeProto& node = graph_.node(mul);
    if (node.input_size() != 2 || node.input(0) == node.input(1)) return false;
    for (int side = 0; side < 2; ++side) {
      const std::string& leaf = node.input(side);
      if (graph_.read_once(leaf) && rows(leaf, found)) {
        found.gathered = leaf;
        found.factors.push_back(node.input(1 - side));
        found.product_nodes.push_back(mul);
        return true;
      }
    }
    for (int side = 0; side < 2; ++side) {
      const std::string& inner = node.input(side);
      if (graph_.read_once(inner) && split_product(inner, found, depth + 1)) {
        found.factors.push_back(node.input(1 - side));
        found.product_nodes.push_back(mul);
        return true;
      }
    }
    return false;
  }

  // `value` = rows of x: Gather(x, src) on axis 0, GatherND(x, [E, 1] tuples) without batch
  // dims, or either under a Transpose that keeps the order of dims (the dynamo exporter's).
  bool rows(const std::string& value, MessageMatch& found) const {
    if (const int transpose = graph_.produced_by(value, "Transpose"); transpose >= 0) {
      const onnx::NodeProto& node = graph_.node(transpose);
      const auto* perm = attribute(node, "perm");
      if (perm == nullptr || !graph_.read_once(node.input(0))) return false;
      for (int d = 0; d < perm->ints_size(); ++d)
        if (perm->ints(d) != d) return false;
      if (!rows(node.input(0), found)) return false;
      found.gather_nodes.push_back(transpose);
      return true;
    }
    const int gather = graph_.produced_by(value, "Gather");
    const int gather_nd = graph_.produced_by(value, "GatherND");
    const int n = gather >= 0 ? gather : gather_nd;
    if (n < 0) return false;
    const onnx::NodeProto& node = graph_.node(n);
    if (node.input_size() != 2) return false;
    if (gather >= 0 ? int_attribute(node, "axis", 0) != 0
                    : int_attribute(node, "batch_dims", 0) != 0)
      return false;
    found.x = node.input(0);
    found.src = node.input(1);
    found.src_tuple = gather_nd >= 0;
    found.gather_nodes.push_back(n);
    return true;
  }

  // ConstantOfShape fills with its `value` attribute, zero when absent.
  static bool is_zero_fill(const onnx::NodeProto& node) {
    const auto* value = attribute(node, "value");
    if (value == nullptr) return true;
    if (value->type() != onnx::AttributeProto::TENSOR) return false;
    try {
      const core::Tensor t = tensor_from_proto(value->t(), "ConstantOfShape value");
      return t.numel() == 1 && t.to(core::kFloat64).reshape({1}).to_vector<double>()[0] == 0.0;
    } catch (const std::exception&) {
      return false;
    }
  }

  const Graph& graph_;
};

void add_int(onnx::NodeProto& node, const char* name, int64_t value) {
  auto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(value);
}

// ---- Filters shared by the two directions of a pair of atoms ------------------------------

// The constants of a graph with their ranks: initializers, Constant nodes, and Cast, CastLike
// or Identity of one. Broadcasting a constant of at most one dim against values of rank 2 or more
// keeps their rows apart.
class Constants {
 public:
  explicit Constants(const onnx::GraphProto& graph) {
    for (const auto& tensor : graph.initializer()) rank_[tensor.name()] = tensor.dims_size();
    for (const auto& node : graph.node()) {
      if (!node.domain().empty() || node.output_size() != 1) continue;
      if (node.op_type() == "Constant") {
        for (const auto& a : node.attribute()) {
          if (a.name() == "value" && a.type() == onnx::AttributeProto::TENSOR) {
            rank_[node.output(0)] = a.t().dims_size();
            tensors_[node.output(0)] = &a.t();
          }
          if (a.name() == "value_float" || a.name() == "value_int") rank_[node.output(0)] = 0;
          if (a.name() == "value_floats" || a.name() == "value_ints") rank_[node.output(0)] = 1;
        }
      } else if ((node.op_type() == "Cast" || node.op_type() == "Identity" ||
                  node.op_type() == "CastLike") &&
                 rank_.count(node.input(0))) {
        rank_[node.output(0)] = rank_[node.input(0)];
      }
    }
  }
  bool is_constant(const std::string& value) const { return rank_.count(value) > 0; }
  bool small(const std::string& value) const {
    const auto it = rank_.find(value);
    return it != rank_.end() && it->second <= 1;
  }
  int rank(const std::string& value) const {
    const auto it = rank_.find(value);
    return it == rank_.end() ? -1 : it->second;
  }
  // The integers of a Constant node's tensor.
  std::optional<std::vector<int64_t>> ints(const std::string& value) const {
    const auto it = tensors_.find(value);
    if (it == tensors_.end()) return std::nullopt;
    const int type = it->second->data_type();
    if (type != onnx::TensorProto::INT64 && type != onnx::TensorProto::INT32) return std::nullopt;
    try {
      const core::Tensor t = tensor_from_proto(*it->second, "constant '" + value + "'");
      return t.to(core::kInt64).reshape({t.numel()}).to_vector<int64_t>();
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

 private:
  std::map<std::string, int> rank_;
  std::map<std::string, const onnx::TensorProto*> tensors_;
};

// A squared edge length: ReduceSum(v * v) over dims other than the first, keepdims, where
//   v = (positions[edge_index[r]] - positions[edge_index[1 - r]]) +- shifts     (either order)
// Edge e and its reverse (edge_index rows swapped, shifts negated) have v and -v, bit for bit,
// so the same squared length: everything computed from it row by row is a function of the
// pair, which nn::pair_reverse_edges finds from edge_index and shifts.
struct PairRoot {
  int reduce = -1;
  std::string value, edge_index, shifts;
};

class PairRootMatcher {
 public:
  PairRootMatcher(const Graph& graph, const Constants& constants)
      : graph_(graph), constants_(constants) {}

  std::optional<PairRoot> match(int n) const {
    const onnx::NodeProto& reduce = graph_.node(n);
    if (reduce.op_type() != "ReduceSum" || !reduce.domain().empty() || reduce.output_size() != 1 ||
        int_attribute(reduce, "keepdims", 1) != 1)
      return std::nullopt;
    std::optional<std::vector<int64_t>> axes;  // an input from opset 13, an attribute before
    if (reduce.input_size() == 2) {
      axes = constants_.ints(reduce.input(1));
    } else if (const auto* a = attribute(reduce, "axes")) {
      axes = std::vector<int64_t>(a->ints().begin(), a->ints().end());
    }
    if (!axes || axes->empty()) return std::nullopt;
    for (int64_t axis : *axes)
      if (axis == 0 || axis < -1) return std::nullopt;  // -1: v has at least 2 dims (checked later)
    const std::string& square = reduce.input(0);
    std::string v;
    if (const int mul = graph_.produced_by(square, "Mul"); mul >= 0) {
      const onnx::NodeProto& node = graph_.node(mul);
      if (node.input_size() == 2 && node.input(0) == node.input(1)) v = node.input(0);
    }
    if (v.empty()) return std::nullopt;
    PairRoot root;
    root.reduce = n;
    root.value = reduce.output(0);
    for (const char* op : {"Add", "Sub"}) {
      const int combine = graph_.produced_by(v, op);
      if (combine < 0) continue;
      const onnx::NodeProto& node = graph_.node(combine);
      for (int side = 0; side < 2 && node.input_size() == 2; ++side) {
        if (difference(node.input(side), root)) {
          root.shifts = node.input(1 - side);
          return root;
        }
      }
    }
    return std::nullopt;
  }

 private:
  // positions[edge_index[r]] - positions[edge_index[1 - r]].
  bool difference(const std::string& value, PairRoot& root) const {
    const int sub = graph_.produced_by(value, "Sub");
    if (sub < 0 || graph_.node(sub).input_size() != 2) return false;
    const auto a = edge_row(graph_.node(sub).input(0));
    const auto b = edge_row(graph_.node(sub).input(1));
    if (!a || !b || a->positions != b->positions || a->edge_index != b->edge_index ||
        a->row == b->row)
      return false;
    root.edge_index = a->edge_index;
    return true;
  }

  struct EdgeRow {
    std::string positions, edge_index;
    int64_t row = 0;
  };
  // Gather(positions, Gather(edge_index, r)) on axis 0, r a constant 0 or 1; or the dynamo
  // exporter's GatherND(positions, Unsqueeze(Gather(edge_index, r), -1)) under an identity
  // Transpose, with its no-op Transpose, Expand and single-input Max and Concat.
  std::optional<EdgeRow> edge_row(const std::string& value) const {
    const std::string rows_value = same(value);
    std::string positions, picked;
    if (const int gather = graph_.produced_by(rows_value, "Gather"); gather >= 0) {
      if (int_attribute(graph_.node(gather), "axis", 0) != 0) return std::nullopt;
      positions = graph_.node(gather).input(0);
      picked = graph_.node(gather).input(1);
    } else if (const int nd = graph_.produced_by(rows_value, "GatherND"); nd >= 0) {
      const onnx::NodeProto& node = graph_.node(nd);
      const int unsqueeze = graph_.produced_by(same(node.input(1)), "Unsqueeze");
      if (int_attribute(node, "batch_dims", 0) != 0 || unsqueeze < 0) return std::nullopt;
      const onnx::NodeProto& column = graph_.node(unsqueeze);
      std::optional<std::vector<int64_t>> axes;
      if (column.input_size() == 2) axes = constants_.ints(column.input(1));
      if (!axes || axes->size() != 1 || ((*axes)[0] != -1 && (*axes)[0] != 1)) return std::nullopt;
      positions = node.input(0);
      picked = column.input(0);
    } else {
      return std::nullopt;
    }
    const int pick = graph_.produced_by(same(picked), "Gather");
    if (pick < 0 || int_attribute(graph_.node(pick), "axis", 0) != 0) return std::nullopt;
    const onnx::NodeProto& inner = graph_.node(pick);
    if (constants_.rank(inner.input(1)) != 0) return std::nullopt;
    const auto row = constants_.ints(inner.input(1));
    if (!row || row->size() != 1) return std::nullopt;
    const int64_t r = (*row)[0] < 0 ? (*row)[0] + 2 : (*row)[0];
    if (r != 0 && r != 1) return std::nullopt;
    return EdgeRow{same(positions), same(inner.input(0)), r};
  }

  // The value `value` equals by construction: through Identity, an identity Transpose, a
  // single-input Max, Min or Concat, and Expand(x, Shape(y)) with y equal to x.
  std::string same(const std::string& value) const {
    std::string current = value;
    for (int step = 0; step < 16; ++step) {
      const std::string next = same_once(current);
      if (next.empty()) return current;
      current = next;
    }
    return current;
  }
  std::string same_once(const std::string& value) const {
    for (const char* op : {"Identity", "Max", "Min", "Concat"}) {
      const int n = graph_.produced_by(value, op);
      if (n >= 0 && graph_.node(n).input_size() == 1) return graph_.node(n).input(0);
    }
    if (const int n = graph_.produced_by(value, "Transpose"); n >= 0) {
      const auto* perm = attribute(graph_.node(n), "perm");
      if (perm == nullptr) return "";
      for (int d = 0; d < perm->ints_size(); ++d)
        if (perm->ints(d) != d) return "";
      return graph_.node(n).input(0);
    }
    if (const int n = graph_.produced_by(value, "Expand"); n >= 0) {
      const onnx::NodeProto& expand = graph_.node(n);
      const int shape = graph_.produced_by(expand.input(1), "Shape");
      if (shape < 0 || int_attribute(graph_.node(shape), "start", 0) != 0 ||
          attribute(graph_.node(shape), "end") != nullptr)
        return "";
      if (same(graph_.node(shape).input(0)) == same(expand.input(0))) return expand.input(0);
    }
    return "";
  }

  const Graph& graph_;
  const Constants& constants_;
};

bool is_unary_row_op(const std::string& op) {
  static const std::set<std::string> ops = {
      "Sqrt", "Exp",      "Log",  "Cos",  "Sin",       "Tanh", "Sigmoid",    "Softplus",
      "Relu", "Neg",      "Abs",  "Erf",  "Identity",  "Gelu", "Reciprocal", "Elu",
      "Selu", "Softsign", "Cast", "Silu", "LeakyRelu", "Mish", "HardSigmoid"};
  return ops.count(op) > 0;
}

bool is_binary_row_op(const std::string& op) {
  static const std::set<std::string> ops = {"Add",
                                            "Sub",
                                            "Mul",
                                            "Div",
                                            "Pow",
                                            "Max",
                                            "Min",
                                            "Greater",
                                            "Less",
                                            "Equal",
                                            "GreaterOrEqual",
                                            "LessOrEqual"};
  return ops.count(op) > 0;
}

// Whether `node` computes its output row by row from values in `rows` (at least one) and
// constants that keep rows apart, so that on the pairs' rows it gives the pairs' outputs.
bool row_wise(const onnx::NodeProto& node, const std::set<std::string>& rows,
              const Constants& constants) {
  if (!node.domain().empty() || node.output_size() != 1 || node.input_size() == 0) return false;
  const std::string& op = node.op_type();
  const auto in_rows = [&](int i) { return rows.count(node.input(i)) > 0; };
  const auto optional_small = [&](int i) {
    return i >= node.input_size() || node.input(i).empty() || constants.small(node.input(i));
  };
  if (is_unary_row_op(op)) return node.input_size() == 1 && in_rows(0);
  if (op == "Clip") return in_rows(0) && optional_small(1) && optional_small(2);
  // CastLike reads only the dtype of its second input.
  if (op == "CastLike")
    return node.input_size() == 2 && in_rows(1) && (in_rows(0) || constants.small(node.input(0)));
  if (op == "Where") {
    if (node.input_size() != 3) return false;
    for (int i = 0; i < 3; ++i)
      if (!in_rows(i) && !constants.small(node.input(i))) return false;
    return in_rows(0) || in_rows(1) || in_rows(2);
  }
  if (is_binary_row_op(op)) {
    if (node.input_size() != 2 || (!in_rows(0) && !in_rows(1))) return false;
    return (in_rows(0) || constants.small(node.input(0))) &&
           (in_rows(1) || constants.small(node.input(1)));
  }
  if (op == "Gemm")
    return in_rows(0) && int_attribute(node, "transA", 0) == 0 && node.input_size() >= 2 &&
           constants.rank(node.input(1)) == 2 && optional_small(2);
  if (op == "MatMul")
    return node.input_size() == 2 && in_rows(0) && constants.rank(node.input(1)) == 2;
  return false;
}

onnx::NodeProto make_node(const char* op, const std::string& name,
                          const std::vector<std::string>& inputs,
                          const std::vector<std::string>& outputs) {
  onnx::NodeProto node;
  node.set_op_type(op);
  node.set_name(name);
  for (const auto& input : inputs) node.add_input(input);
  for (const auto& output : outputs) node.add_output(output);
  return node;
}

// Rewrites the row-wise functions of one squared edge length to run on one row per pair of
// atoms. Returns false (and leaves the graph) unless one of them is a fused node's weight.
bool share_pairs(onnx::GraphProto& graph, const PairRoot& root, int serial) {
  const Constants constants(graph);
  std::set<std::string> rows = {root.value};
  std::set<int> cone;
  for (int n = root.reduce + 1; n < graph.node_size(); ++n) {
    if (row_wise(graph.node(n), rows, constants)) {
      cone.insert(n);
      rows.insert(graph.node(n).output(0));
    }
  }
  const std::string prefix = "mpigrad_pairs_" + std::to_string(serial) + "_";
  const std::string first = prefix + "first", pair = prefix + "pair";
  const auto on_pairs = [&](const std::string& value) { return value + "/" + prefix + "rows"; };
  // Readers outside the cone: a fused node's weight reads the pairs' rows with weight_index
  // `pair`; any other reader gets the edges' rows back, gathered by `pair`.
  std::set<std::string> expand_back;
  bool feeds_fused = false;
  for (int n = 0; n < graph.node_size(); ++n) {
    if (cone.count(n)) continue;
    const onnx::NodeProto& node = graph.node(n);
    for (int i = 0; i < node.input_size(); ++i) {
      if (!rows.count(node.input(i)) || node.input(i) == root.value) continue;
      if (node.op_type() == kGatherMulScatterOp && i == 3) {
        feeds_fused = true;
      } else {
        expand_back.insert(node.input(i));
      }
    }
  }
  if (!feeds_fused) return false;
  for (const auto& output : graph.output())
    if (rows.count(output.name()) && output.name() != root.value) expand_back.insert(output.name());

  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  for (int n = 0; n < graph.node_size(); ++n) {
    onnx::NodeProto node = graph.node(n);
    if (cone.count(n)) {
      for (int i = 0; i < node.input_size(); ++i)
        if (rows.count(node.input(i))) node.set_input(i, on_pairs(node.input(i)));
      node.set_output(0, on_pairs(node.output(0)));
    } else if (node.op_type() == kGatherMulScatterOp && rows.count(node.input(3)) &&
               node.input(3) != root.value) {
      node.set_input(3, on_pairs(node.input(3)));
      while (node.input_size() < 10) node.add_input("");
      node.add_input(pair);
    }
    const std::string produced = node.output_size() == 1 ? graph.node(n).output(0) : "";
    *nodes.Add() = std::move(node);
    if (n == root.reduce) {
      *nodes.Add() = make_node(kEdgePairsOp, prefix + "edges",
                               {root.edge_index, root.shifts, root.value}, {first, pair});
      *nodes.Add() =
          make_node("Gather", prefix + "rows", {root.value, first}, {on_pairs(root.value)});
    }
    if (cone.count(n) && expand_back.count(produced))
      *nodes.Add() =
          make_node("Gather", prefix + "back_" + produced, {on_pairs(produced), pair}, {produced});
  }
  graph.mutable_node()->Swap(&nodes);
  return true;
}

int share_pair_filters(onnx::GraphProto& graph) {
  int shared = 0;
  std::set<std::string> tried;
  for (bool found = true; found;) {
    found = false;
    const Graph index(graph);
    const Constants constants(graph);
    const PairRootMatcher matcher(index, constants);
    for (int n = 0; n < graph.node_size() && !found; ++n) {
      const auto root = matcher.match(n);
      if (!root || !tried.insert(root->value).second) continue;
      found = true;
      if (share_pairs(graph, *root, shared)) ++shared;
    }
  }
  return shared;
}

}  // namespace

int fuse_message_passing(onnx::GraphProto& graph) {
  // A subgraph (If, Loop, Scan) may read any outer value by name, unseen by the reader counts.
  for (const auto& node : graph.node())
    for (const auto& a : node.attribute())
      if (a.type() == onnx::AttributeProto::GRAPH || a.type() == onnx::AttributeProto::GRAPHS)
        return 0;
  std::vector<MessageMatch> matches;
  {
    const Graph index(graph);
    const MessageMatcher matcher(index);
    for (int n = 0; n < graph.node_size(); ++n)
      if (auto found = matcher.match(n)) matches.push_back(std::move(*found));
  }
  if (matches.empty()) return 0;
  // Each scatter node becomes the fused node. Mul nodes that multiply the weight's factors take
  // the place of the outermost product, whose Shape readers become nodes computing its shape
  // from x, src and the weight; every input of the chain is computed before its first node, so
  // the order stays valid.
  std::set<int> removed;
  std::map<int, std::vector<onnx::NodeProto>> inserted_before;
  std::vector<std::pair<int, onnx::NodeProto>> replaced;
  for (size_t m = 0; m < matches.size(); ++m) {
    const MessageMatch& match = matches[m];
    onnx::NodeProto& scatter = *graph.mutable_node(match.scatter);
    const std::string prefix = "mpigrad_message_" + std::to_string(m) + "_";
    std::string weight = match.factors[0];
    for (size_t f = 1; f < match.factors.size(); ++f) {
      onnx::NodeProto mul;
      mul.set_op_type("Mul");
      mul.set_name(prefix + "weight_" + std::to_string(f));
      mul.add_input(weight);
      mul.add_input(match.factors[f]);
      weight = prefix + "weight_" + std::to_string(f);
      mul.add_output(weight);
      inserted_before[match.product_nodes.back()].push_back(std::move(mul));
    }
    // What the fused node runs when the shapes do not fit core::gather_mul_scatter: the
    // original chain with the product as one Mul by the weight (the same value up to rounding).
    onnx::GraphProto chain;
    for (int n : match.gather_nodes) *chain.add_node() = graph.node(n);
    std::string product = graph.node(match.product_nodes.back()).output(0);
    onnx::NodeProto& mul = *chain.add_node();
    mul.set_op_type("Mul");
    mul.set_name(prefix + "product");
    mul.add_input(match.gathered);
    mul.add_input(weight);
    mul.add_output(product);
    if (match.slice >= 0) *chain.add_node() = graph.node(match.slice);
    *chain.add_node() = scatter;
    for (int n : match.gather_nodes) removed.insert(n);
    for (int n : match.product_nodes) removed.insert(n);
    if (match.slice >= 0) removed.insert(match.slice);

    for (int reader : match.shape_readers) {
      const onnx::NodeProto& shape = graph.node(reader);
      onnx::NodeProto node =
          make_node(kProductShapeOp, shape.name(), {match.x, match.src, weight}, {shape.output(0)});
      for (const auto& a : shape.attribute()) *node.add_attribute() = a;  // start, end
      add_int(node, "src_tuple", match.src_tuple ? 1 : 0);
      replaced.emplace_back(reader, std::move(node));
    }
    const onnx::NodeProto* slice = match.slice >= 0 ? &graph.node(match.slice) : nullptr;
    const std::string output = scatter.output(0);
    const std::string name = scatter.name();
    scatter.Clear();
    scatter.set_op_type(kGatherMulScatterOp);
    scatter.set_name(name);
    scatter.add_output(output);
    for (const std::string& input :
         {match.data, match.x, match.src, weight, match.column, match.index})
      scatter.add_input(input);
    for (int i = 1; i < 5; ++i)
      scatter.add_input(slice != nullptr && i < slice->input_size() ? slice->input(i) : "");
    while (scatter.input_size() > 6 && scatter.input(scatter.input_size() - 1).empty())
      scatter.mutable_input()->RemoveLast();
    add_int(scatter, "src_tuple", match.src_tuple ? 1 : 0);
    add_int(scatter, "zero_base", match.zero_base ? 1 : 0);
    auto* fallback = scatter.add_attribute();
    fallback->set_name("chain");
    fallback->set_type(onnx::AttributeProto::GRAPH);
    *fallback->mutable_g() = std::move(chain);
  }
  for (auto& [n, node] : replaced) *graph.mutable_node(n) = std::move(node);
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  for (int n = 0; n < graph.node_size(); ++n) {
    if (const auto it = inserted_before.find(n); it != inserted_before.end())
      for (auto& mul : it->second) *nodes.Add() = std::move(mul);
    if (!removed.count(n)) *nodes.Add() = std::move(*graph.mutable_node(n));
  }
  graph.mutable_node()->Swap(&nodes);
  share_pair_filters(graph);
  return int(matches.size());
}

}  // namespace mpigrad::nn::onnx_ops
