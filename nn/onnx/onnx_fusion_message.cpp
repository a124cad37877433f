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
    if (!graph_.read_once(product)) return std::nullopt;
    if (const int slice = graph_.produced_by(product, "Slice"); slice >= 0) {
      const onnx::NodeProto& node = graph_.node(slice);
      if (node.input_size() < 3 || node.attribute_size() != 0) return std::nullopt;  // opset < 10
      found.slice = slice;
      product = node.input(0);
      if (!graph_.read_once(product)) return std::nullopt;
    }
    if (!split_product(product, found, 0) || found.factors.empty()) return std::nullopt;
    if (const int constant = graph_.produced_by(found.data, "ConstantOfShape"); constant >= 0)
      found.zero_base = is_zero_fill(graph_.node(constant));
    return found;
  }

 private:
  // `value` (read once) = gathered * factor * ...: Mul nodes over exactly one gathered leaf.
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

}  // namespace

int fuse_message_passing(onnx::GraphProto& graph) {
  std::vector<MessageMatch> matches;
  {
    const Graph index(graph);
    const MessageMatcher matcher(index);
    for (int n = 0; n < graph.node_size(); ++n)
      if (auto found = matcher.match(n)) matches.push_back(std::move(*found));
  }
  if (matches.empty()) return 0;
  // Each scatter node becomes the fused node, after Mul nodes that multiply the weight's factors:
  // every input of the chain is computed before its first node, so the order stays valid.
  std::set<int> removed;
  std::map<int, std::vector<onnx::NodeProto>> inserted_before;
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
      inserted_before[match.scatter].push_back(std::move(mul));
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
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  for (int n = 0; n < graph.node_size(); ++n) {
    if (removed.count(n)) continue;
    if (const auto it = inserted_before.find(n); it != inserted_before.end())
      for (auto& mul : it->second) *nodes.Add() = std::move(mul);
    *nodes.Add() = std::move(*graph.mutable_node(n));
  }
  graph.mutable_node()->Swap(&nodes);
  return int(matches.size());
}

}  // namespace mpigrad::nn::onnx_ops
