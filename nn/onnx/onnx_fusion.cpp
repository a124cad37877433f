// The GELU and attention-softmax rewrites of onnx_fusion.h: a matcher over value names (who
// produces a value, how many nodes read it, which values are one-element constants), then an
// in-place edit of the node list that keeps the file's topological order.
#include "mpigrad/nn/onnx/onnx_fusion.h"

#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "mpigrad/kernels/scalar.h"
#include "mpigrad/nn/onnx/onnx_file.h"

namespace mpigrad::nn::onnx_ops {

namespace {

class GraphIndex {
 public:
  explicit GraphIndex(const onnx::GraphProto& graph) : graph_(graph) {
    for (int n = 0; n < graph.node_size(); ++n) {
      const auto& node = graph.node(n);
      for (const auto& output : node.output()) producer_[output] = n;
      for (const auto& input : node.input()) ++readers_[input];
    }
    for (const auto& output : graph.output()) ++readers_[output.name()];  // never fused away
  }

  // The node that writes `value` if it has op type `op`; null otherwise.
  const onnx::NodeProto* produced_by(const std::string& value, const char* op) const {
    const auto it = producer_.find(value);
    if (it == producer_.end()) return nullptr;
    const auto& node = graph_.node(it->second);
    return node.op_type() == op && node.domain().empty() ? &node : nullptr;
  }
  int index_of(const onnx::NodeProto& node) const { return producer_.at(node.output(0)); }
  // Read by exactly one node input and not a graph output: fusing its producer loses nothing.
  bool read_once(const std::string& value) const {
    const auto it = readers_.find(value);
    return it != readers_.end() && it->second == 1;
  }

  // The value of a one-element floating Constant node. Initializers do not count: the loader
  // makes a floating initializer a trainable parameter, which a fused node would drop.
  std::optional<double> scalar(const std::string& value) const {
    const onnx::TensorProto* tensor = nullptr;
    if (const auto* constant = produced_by(value, "Constant")) {
      for (const auto& attribute : constant->attribute()) {
        if (attribute.name() == "value_float") return double(attribute.f());
        if (attribute.name() == "value" && attribute.type() == onnx::AttributeProto::TENSOR)
          tensor = &attribute.t();
      }
    }
    if (tensor == nullptr) return std::nullopt;
    const int type = tensor->data_type();
    if (type != onnx::TensorProto::FLOAT && type != onnx::TensorProto::DOUBLE &&
        type != onnx::TensorProto::FLOAT16 && type != onnx::TensorProto::BFLOAT16) {
      return std::nullopt;
    }
    try {
      const core::Tensor t = tensor_from_proto(*tensor, "constant '" + value + "'");
      if (t.numel() != 1) return std::nullopt;
      return t.to(core::kFloat64).reshape({1}).to_vector<double>()[0];
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

 private:
  const onnx::GraphProto& graph_;
  std::map<std::string, int> producer_;
  std::map<std::string, int> readers_;
};

// Equal to float rounding: the exporter writes the constants as float32.
bool near(std::optional<double> value, double expected) {
  return value && std::abs(*value - expected) <= 1e-6 * std::abs(expected);
}

// One GELU chain found: its input, the nodes it replaces (by index), and its form.
struct GeluMatch {
  std::string x;
  std::vector<int> nodes;
  bool tanh = false;
};

// A binary node `op` reading a constant equal to `constant` and one other value, returned. For
// commutative ops either side may hold the constant; otherwise only the second.
std::optional<std::string> other_than_constant(const GraphIndex& index, const onnx::NodeProto* node,
                                               double constant, bool commutative) {
  if (node == nullptr || node->input_size() != 2) return std::nullopt;
  if (near(index.scalar(node->input(1)), constant)) return node->input(0);
  if (commutative && near(index.scalar(node->input(0)), constant)) return node->input(1);
  return std::nullopt;
}

class GeluMatcher {
 public:
  explicit GeluMatcher(const GraphIndex& index) : index_(index) {}

  // `last` as the final Mul of a GELU chain:
  //   Mul(Mul(x, 0.5), F) or Mul(Mul(x, F), 0.5), factors in either order,
  // where F = Add(Tanh(...) or Erf(...), 1) computes 1 + tanh(u(x)) or 1 + erf(x / sqrt 2).
  std::optional<GeluMatch> match(const onnx::NodeProto& last) {
    if (last.op_type() != "Mul" || last.input_size() != 2 || !last.domain().empty())
      return std::nullopt;
    for (int side = 0; side < 2; ++side) {
      const std::string& a = last.input(side);
      const std::string& b = last.input(1 - side);
      // (x * 0.5) * F
      const auto* half = index_.produced_by(a, "Mul");
      if (half != nullptr && index_.read_once(a)) {
        if (const auto x = other_than_constant(index_, half, 0.5, true)) {
          if (auto found = one_plus(b, *x)) {
            found->nodes.push_back(index_.index_of(*half));
            found->nodes.push_back(index_.index_of(last));
            return found;
          }
        }
      }
      // (x * F) * 0.5
      if (near(index_.scalar(b), 0.5)) {
        const auto* product = index_.produced_by(a, "Mul");
        if (product == nullptr || !index_.read_once(a) || product->input_size() != 2) continue;
        for (int inner = 0; inner < 2; ++inner) {
          if (auto found = one_plus(product->input(1 - inner), product->input(inner))) {
            found->nodes.push_back(index_.index_of(*product));
            found->nodes.push_back(index_.index_of(last));
            return found;
          }
        }
      }
    }
    return std::nullopt;
  }

 private:
  // `value` = Add(r, 1) with r = Tanh(u(x)) or Erf(x / sqrt 2), each read once.
  std::optional<GeluMatch> one_plus(const std::string& value, const std::string& x) {
    const auto* add = index_.produced_by(value, "Add");
    if (add == nullptr || !index_.read_once(value)) return std::nullopt;
    const auto r = other_than_constant(index_, add, 1.0, true);
    if (!r || !index_.read_once(*r)) return std::nullopt;
    GeluMatch found;
    found.x = x;
    if (const auto* tanh = index_.produced_by(*r, "Tanh")) {
      if (!tanh_argument(tanh->input(0), x, found.nodes)) return std::nullopt;
      found.nodes.push_back(index_.index_of(*tanh));
      found.tanh = true;
    } else if (const auto* erf = index_.produced_by(*r, "Erf")) {
      if (!erf_argument(erf->input(0), x, found.nodes)) return std::nullopt;
      found.nodes.push_back(index_.index_of(*erf));
    } else {
      return std::nullopt;
    }
    found.nodes.push_back(index_.index_of(*add));
    return found;
  }

  // u = Mul(Add(x, Mul(Pow(x, 3), 0.044715)), sqrt(2/pi)).
  bool tanh_argument(const std::string& u, const std::string& x, std::vector<int>& nodes) {
    const auto* scale = index_.produced_by(u, "Mul");
    if (!index_.read_once(u)) return false;
    const auto sum = other_than_constant(index_, scale, kernels::kSqrt2OverPi, true);
    const auto* add = sum ? index_.produced_by(*sum, "Add") : nullptr;
    if (add == nullptr || !index_.read_once(*sum) || add->input_size() != 2) return false;
    for (int side = 0; side < 2; ++side) {
      if (add->input(side) != x) continue;
      const std::string& cubic_term = add->input(1 - side);
      const auto* times = index_.produced_by(cubic_term, "Mul");
      const auto cube = other_than_constant(index_, times, kernels::kGeluCubic, true);
      const auto* pow = cube ? index_.produced_by(*cube, "Pow") : nullptr;
      if (pow == nullptr || !index_.read_once(cubic_term) || !index_.read_once(*cube) ||
          pow->input_size() != 2 || pow->input(0) != x || !near(index_.scalar(pow->input(1)), 3.0))
        continue;
      nodes.insert(nodes.end(), {index_.index_of(*pow), index_.index_of(*times),
                                 index_.index_of(*add), index_.index_of(*scale)});
      return true;
    }
    return false;
  }

  // Div(x, sqrt 2) or Mul(x, 1 / sqrt 2).
  bool erf_argument(const std::string& v, const std::string& x, std::vector<int>& nodes) {
    if (!index_.read_once(v)) return false;
    const auto* div = index_.produced_by(v, "Div");
    if (div != nullptr && other_than_constant(index_, div, std::sqrt(2.0), false) == x) {
      nodes.push_back(index_.index_of(*div));
      return true;
    }
    const auto* mul = index_.produced_by(v, "Mul");
    if (mul != nullptr && other_than_constant(index_, mul, kernels::kSqrtHalf, true) == x) {
      nodes.push_back(index_.index_of(*mul));
      return true;
    }
    return false;
  }

  const GraphIndex& index_;
};

// Deletes the nodes at `removed`, keeping the others in their order.
void remove_nodes(onnx::GraphProto& graph, const std::set<int>& removed) {
  int kept = 0;
  for (int n = 0; n < graph.node_size(); ++n) {
    if (removed.count(n)) continue;
    if (kept != n) graph.mutable_node()->SwapElements(kept, n);
    ++kept;
  }
  graph.mutable_node()->DeleteSubrange(kept, graph.node_size() - kept);
}

// One attention softmax found: its scores x, scale and mask ("" for none), the Softmax node and
// the nodes it absorbs.
struct SoftmaxMatch {
  std::string x, mask;
  double scale = 1.0;
  int softmax = -1;
  std::vector<int> absorbed;
};

// `value` = Mul(x, c) or Mul(c, x), or Div(x, c) with 1/c exact, read once; c a float constant.
std::optional<SoftmaxMatch> scaled_scores(const GraphIndex& index, const std::string& value) {
  if (!index.read_once(value)) return std::nullopt;
  // A float attribute must hold c exactly, for the fused op to round as the Mul did.
  auto exact = [](std::optional<double> c) { return c && double(float(*c)) == *c && *c != 0; };
  SoftmaxMatch found;
  if (const auto* mul = index.produced_by(value, "Mul"); mul != nullptr && mul->input_size() == 2) {
    for (int side = 0; side < 2; ++side) {
      const auto c = index.scalar(mul->input(side));
      if (!exact(c)) continue;
      found.x = mul->input(1 - side);
      found.scale = *c;
      found.absorbed.push_back(index.index_of(*mul));
      return found;
    }
  }
  if (const auto* div = index.produced_by(value, "Div"); div != nullptr && div->input_size() == 2) {
    const auto c = index.scalar(div->input(1));
    int exponent = 0;
    if (exact(c) && std::abs(std::frexp(*c, &exponent)) == 0.5) {  // a power of two
      found.x = div->input(0);
      found.scale = 1.0 / *c;
      found.absorbed.push_back(index.index_of(*div));
      return found;
    }
  }
  return std::nullopt;
}

std::optional<SoftmaxMatch> match_attention_softmax(const GraphIndex& index,
                                                    const onnx::NodeProto& softmax) {
  if (softmax.op_type() != "Softmax" || !softmax.domain().empty() || softmax.input_size() != 1)
    return std::nullopt;
  // The last axis, said explicitly: before opset 13 the default axis is 1.
  bool last_axis = false;
  for (const auto& attribute : softmax.attribute()) {
    if (attribute.name() == "axis") last_axis = attribute.i() == -1;
  }
  if (!last_axis) return std::nullopt;
  const std::string& scores = softmax.input(0);
  std::optional<SoftmaxMatch> found;
  if (const auto* add = index.produced_by(scores, "Add")) {
    if (!index.read_once(scores) || add->input_size() != 2) return std::nullopt;
    for (int side = 0; side < 2 && !found; ++side) {
      found = scaled_scores(index, add->input(side));
      if (found) {
        found->mask = add->input(1 - side);
        found->absorbed.push_back(index.index_of(*add));
      }
    }
  } else {
    found = scaled_scores(index, scores);
  }
  if (found) found->softmax = index.index_of(softmax);
  return found;
}

}  // namespace

int fuse_attention_softmax(onnx::GraphProto& graph) {
  std::vector<SoftmaxMatch> matches;
  {
    const GraphIndex index(graph);
    for (const auto& node : graph.node()) {
      if (auto found = match_attention_softmax(index, node)) matches.push_back(std::move(*found));
    }
  }
  // The Softmax node becomes the fused one, keeping its name, output and place: x and the mask
  // are computed before the Mul and Add that read them, which come before the Softmax.
  std::set<int> removed;
  for (const auto& match : matches) {
    onnx::NodeProto& node = *graph.mutable_node(match.softmax);
    node.set_op_type(kSoftmaxScaleMaskOp);
    node.clear_input();
    node.add_input(match.x);
    if (!match.mask.empty()) node.add_input(match.mask);
    node.clear_attribute();
    auto* scale = node.add_attribute();
    scale->set_name("scale");
    scale->set_type(onnx::AttributeProto::FLOAT);
    scale->set_f(float(match.scale));
    removed.insert(match.absorbed.begin(), match.absorbed.end());
  }
  if (!matches.empty()) remove_nodes(graph, removed);
  return int(matches.size());
}

int fuse_gelu(onnx::GraphProto& graph) {
  std::vector<GeluMatch> matches;
  {
    const GraphIndex index(graph);
    GeluMatcher matcher(index);
    std::set<int> taken;
    for (const auto& node : graph.node()) {
      auto found = matcher.match(node);
      if (!found) continue;
      bool overlaps = false;
      for (int n : found->nodes) overlaps = overlaps || taken.count(n) > 0;
      if (overlaps) continue;
      taken.insert(found->nodes.begin(), found->nodes.end());
      matches.push_back(std::move(*found));
    }
  }
  if (matches.empty()) return 0;
  // The chain's last node (its final Mul, last in file order) becomes the Gelu node, keeping its
  // name and output: x is computed before every node of the chain, so the order stays valid.
  std::set<int> removed;
  for (const auto& match : matches) {
    const int last = match.nodes.back();
    onnx::NodeProto& node = *graph.mutable_node(last);
    node.set_op_type("Gelu");
    node.clear_input();
    node.add_input(match.x);
    node.clear_attribute();
    auto* approximate = node.add_attribute();
    approximate->set_name("approximate");
    approximate->set_type(onnx::AttributeProto::STRING);
    approximate->set_s(match.tanh ? "tanh" : "none");
    removed.insert(match.nodes.begin(), match.nodes.end() - 1);
  }
  remove_nodes(graph, removed);
  return int(matches.size());
}

}  // namespace mpigrad::nn::onnx_ops
