#include "mpigrad/nn/onnx/onnx_model.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <variant>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/profiler.h"
#include "mpigrad/nn/layers/batch_norm.h"
#include "mpigrad/nn/onnx/onnx_file.h"
#include "mpigrad/nn/onnx/onnx_fusion.h"
#include "mpigrad/nn/onnx/onnx_op_table.h"

namespace mpigrad::nn {

namespace {

// A level of the dotted-name tree ("enc" in "enc.layers.1.linear1.bias"): holds what the
// exporter put under that prefix and does nothing of its own.
class OnnxScope : public Module {
 public:
  Tensor forward(const Tensor&) override {
    core::fail("OnnxModel: its submodules hold weights only; call the OnnxModel itself");
  }
  std::string type_name() const override { return "Module"; }
  using Module::add_child;
  using Module::register_buffer;
  using Module::register_parameter;
};

std::vector<std::string> split_dotted(const std::string& name) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(name);
  while (std::getline(in, part, '.')) parts.push_back(part);
  if (!name.empty() && name.back() == '.') parts.emplace_back();
  const bool clean = !parts.empty() && std::none_of(parts.begin(), parts.end(),
                                                    [](const std::string& p) { return p.empty(); });
  // A name that does not split cleanly stays one flat name, its dots replaced.
  if (!clean) {
    std::string flat = name;
    std::replace(flat.begin(), flat.end(), '.', '_');
    return {flat.empty() ? std::string("_") : flat};
  }
  return parts;
}

Module* find_child(Module& parent, const std::string& name) {
  for (auto& [child_name, child] : parent.named_children())
    if (child_name == name) return child.get();
  return nullptr;
}

OnnxValueInfo value_info(const onnx::ValueInfoProto& info, const std::string& file) {
  OnnxValueInfo out;
  out.name = info.name();
  const auto& type = info.type();
  if (type.has_tensor_type()) {
    const auto& tensor_type = type.tensor_type();
    if (tensor_type.elem_type() != 0)
      out.dtype =
          dtype_from_onnx(tensor_type.elem_type(), file + ": graph value '" + out.name + "'");
    if (tensor_type.has_shape()) {
      for (const auto& dim : tensor_type.shape().dim())
        out.shape.push_back(dim.has_dim_value() && dim.dim_value() > 0 ? dim.dim_value() : -1);
    }
  }
  return out;
}

}  // namespace

struct OnnxModel::Graph {
  struct Node {
    std::string where;
    std::string name;          // the node's name (its op type and index when it has none), and
    std::string op_type;       // its op type: the profiler's span (core/profiler.h)
    std::vector<int> inputs;   // value ids; -1 for an empty optional input
    std::vector<int> outputs;  // value ids; -1 for an unused optional output
    onnx_ops::OpFunction run;
    onnx_ops::SequenceFunction run_sequence;  // set instead of run for sequence ops
    bool foldable = false;                    // its op's row allows running it at load
  };

  std::string file;
  int64_t opset = 0;
  std::vector<OnnxValueInfo> inputs, outputs;
  std::vector<int> input_ids, output_ids;
  std::vector<std::string> value_names;
  std::vector<Tensor> constants;                     // per value id; undefined if not constant
  std::vector<std::pair<int, Tensor*>> slot_values;  // parameters and buffers read by nodes
  Tensor* first_float_slot = nullptr;  // to see whether to() changed the parameters' dtype
  core::DType loaded_float_dtype = core::kFloat32;
  std::vector<Node> nodes;
  std::vector<std::vector<int>> release_after;  // per node: values no later node reads
  std::vector<Tensor> device_constants;         // `constants` on device_
  core::Device device = core::kCPU;
  std::shared_ptr<core::Generator> dropout_generator;  // registered as "dropout"

  // Rewrites proto's fusable chains (onnx_fusion.h) first.
  static void build(OnnxModel& model, onnx::ModelProto& proto, const std::string& file);
  class Builder;  // the steps of build

  // Each input checked against its declaration and in the dtype the graph computes in.
  std::vector<Tensor> bind_inputs(const std::vector<Tensor>& given,
                                  std::optional<core::DType> float_dtype) const;
  // `device_constants` moved to `to` (once per change of device).
  void move_constants(core::Device to);
};

namespace {

// Value names to dense ids.
struct ValueIds {
  std::map<std::string, int> ids;
  std::vector<std::string> names;
  int get(const std::string& name) {
    auto [it, added] = ids.emplace(name, int(names.size()));
    if (added) names.push_back(name);
    return it->second;
  }
};

// Called inside a catch block: every failure inside a node (a core op's shape check, an index
// out of range) becomes one core::Error that names the node, unless it already names the file.
[[noreturn]] void rethrow_naming_node(const std::exception& error, const std::string& where,
                                      const std::string& file) {
  const std::string what = error.what();
  if (dynamic_cast<const core::Error*>(&error) && what.rfind(file, 0) == 0) throw;
  core::fail(where, ": ", what);
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() > suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

// Graph::build in named steps, run in the order build lists them. The builder holds what the
// steps share while they turn the file's graph into the model's: the value ids, the
// initializers and how each is used, and the BatchNormalization nodes that become
// nn::BatchNorm children.
class OnnxModel::Graph::Builder {
 public:
  Builder(OnnxModel& model, const onnx::ModelProto& proto, const std::string& file)
      : model_(model), graph_(*model.graph_), onnx_graph_(proto.graph()), file_(file) {
    graph_.file = file;
    graph_.opset = onnx_default_opset(proto);
  }

  void check_ops_supported() const;
  void index_initializers();
  void count_uses();
  void find_owned_batch_norms();
  void pair_batch_norms_with_relus();
  void load_initializers();
  void declare_inputs_and_outputs();
  void compile_nodes();
  void resolve_outputs();
  void fold_constants();
  void plan_releases();
  void add_dropout_generator();

 private:
  std::string node_where(const onnx::NodeProto& node) const;
  Module& scope_for(const std::vector<std::string>& path, const std::string& name);
  Tensor& register_slot(const std::string& name, Tensor value, bool buffer);
  void create_batch_norm(const onnx::NodeProto& node);
  Node compile_node(const onnx::NodeProto& node);
  void compile_op(const onnx::NodeProto& node, Node& compiled) const;

  OnnxModel& model_;
  Graph& graph_;
  const onnx::GraphProto& onnx_graph_;
  const std::string& file_;
  ValueIds ids_;
  std::map<std::string, const onnx::TensorProto*> initializers_;
  std::map<std::string, int> uses_, trainable_uses_;
  // BatchNormalization nodes an nn::BatchNorm child owns, by the prefix of its initializers.
  std::map<const onnx::NodeProto*, std::string> owned_batch_norms_;
  std::set<std::string> owned_names_, buffer_names_;
  std::map<std::string, const onnx::NodeProto*> owned_by_;
  std::map<const onnx::NodeProto*, std::pair<Module*, std::string>> batch_norm_layers_;
  // Owned BatchNormalization nodes that apply the ReLU reading them, and those Relu nodes, which
  // then pass their input through (pair_batch_norms_with_relus).
  std::set<const onnx::NodeProto*> batch_norms_with_relu_, absorbed_relus_;
  std::set<int> known_;  // values defined so far (inputs, initializers, earlier outputs)
};

void OnnxModel::Graph::build(OnnxModel& model, onnx::ModelProto& proto, const std::string& file) {
  onnx_ops::fuse_gelu(*proto.mutable_graph());
  onnx_ops::fuse_attention_softmax(*proto.mutable_graph());
  onnx_ops::fuse_message_passing(*proto.mutable_graph());
  Builder builder(model, proto, file);
  builder.check_ops_supported();
  builder.index_initializers();
  builder.count_uses();
  builder.find_owned_batch_norms();
  builder.pair_batch_norms_with_relus();
  builder.load_initializers();
  builder.declare_inputs_and_outputs();
  builder.compile_nodes();
  builder.resolve_outputs();
  builder.fold_constants();
  builder.plan_releases();
  builder.add_dropout_generator();
}

std::string OnnxModel::Graph::Builder::node_where(const onnx::NodeProto& node) const {
  std::ostringstream out;
  out << file_ << ": node '" << node.name() << "' (" << node.op_type() << ", opset " << graph_.opset
      << ")";
  return out.str();
}

// Every op first, so an unknown one stops the load before anything is built, and the error
// lists every unknown op at once.
void OnnxModel::Graph::Builder::check_ops_supported() const {
  std::vector<std::string> unsupported;
  for (const auto& node : onnx_graph_.node()) {
    const bool default_domain = node.domain().empty() || node.domain() == "ai.onnx";
    if (!default_domain || onnx_ops::op_table().find(node.op_type()) == nullptr) {
      unsupported.push_back(node.op_type() +
                            (default_domain ? "" : " (domain " + node.domain() + ")") +
                            " in node '" + node.name() + "'");
    }
  }
  if (unsupported.empty()) return;
  std::ostringstream out;
  out << file_ << " (opset " << graph_.opset << "): " << unsupported.size()
      << " node(s) use ops mpigrad does not support: ";
  for (size_t i = 0; i < unsupported.size() && i < 8; ++i) out << (i ? "; " : "") << unsupported[i];
  if (unsupported.size() > 8) out << "; ...";
  core::fail(out.str());
}

// Initializers by name, so that nodes and the BatchNorm search can look them up.
void OnnxModel::Graph::Builder::index_initializers() {
  for (const auto& tensor : onnx_graph_.initializer()) {
    MPIGRAD_CHECK(!tensor.name().empty(), file_, ": an initializer has no name");
    MPIGRAD_CHECK(initializers_.emplace(tensor.name(), &tensor).second, file_, ": initializer '",
                  tensor.name(), "' is defined twice");
  }
}

// Uses of each value, and those at a differentiable input: a floating initializer read only
// as settings (Resize scales, Clip bounds, Dropout ratio) stays a constant, not a parameter.
void OnnxModel::Graph::Builder::count_uses() {
  for (const auto& node : onnx_graph_.node()) {
    const onnx_ops::OpInfo& op = *onnx_ops::op_table().find(node.op_type());
    for (int i = 0; i < node.input_size(); ++i) {
      ++uses_[node.input(i)];
      if (!op.is_setting_input(i)) ++trainable_uses_[node.input(i)];
    }
  }
}

// BatchNormalization nodes an nn::BatchNorm child can own: prefix P with P.weight, P.bias,
// P.running_mean, P.running_var as initializers that nothing else reads. Such a child keeps
// PyTorch's names and num_batches_tracked, and convert_sync_batchnorm can replace it.
void OnnxModel::Graph::Builder::find_owned_batch_norms() {
  for (const auto& node : onnx_graph_.node()) {
    if (node.op_type() != "BatchNormalization" || node.input_size() < 5) continue;
    buffer_names_.insert(node.input(3));
    buffer_names_.insert(node.input(4));
    const std::string& scale = node.input(1);
    if (!ends_with(scale, ".weight")) continue;
    const std::string prefix = scale.substr(0, scale.size() - std::string(".weight").size());
    const bool owned = node.input(2) == prefix + ".bias" &&
                       node.input(3) == prefix + ".running_mean" &&
                       node.input(4) == prefix + ".running_var";
    bool only_here = owned;
    for (int i = 1; i < 5 && only_here; ++i)
      only_here = initializers_.count(node.input(i)) && uses_[node.input(i)] == 1 &&
                  owned_names_.count(node.input(i)) == 0;
    if (!only_here) continue;
    owned_batch_norms_[&node] = prefix;
    for (int i = 1; i < 5; ++i) owned_names_.insert(node.input(i));
  }
  for (const auto& [node, prefix] : owned_batch_norms_)
    for (int i = 1; i < 5; ++i) owned_by_[node->input(i)] = node;
}

// The module for a dotted prefix, creating OnnxScope levels on the way.
Module& OnnxModel::Graph::Builder::scope_for(const std::vector<std::string>& path,
                                             const std::string& name) {
  Module* current = &model_;
  for (const std::string& part : path) {
    Module* child = find_child(*current, part);
    if (child == nullptr) {
      auto scope = std::make_shared<OnnxScope>();
      if (current == &model_) {
        model_.add_child(part, scope);
      } else {
        auto* parent_scope = dynamic_cast<OnnxScope*>(current);
        MPIGRAD_CHECK(parent_scope != nullptr, file_, ": cannot place '", name, "' under '", part,
                      "'");
        parent_scope->add_child(part, scope);
      }
      child = scope.get();
    }
    current = child;
  }
  return *current;
}

// A parameter or buffer under the initializer's dotted name (PyTorch's).
Tensor& OnnxModel::Graph::Builder::register_slot(const std::string& name, Tensor value,
                                                 bool buffer) {
  std::vector<std::string> path = split_dotted(name);
  const std::string leaf = path.back();
  path.pop_back();
  Module& owner = scope_for(path, name);
  try {
    if (&owner == &model_)
      return buffer ? model_.register_buffer(leaf, value) : model_.register_parameter(leaf, value);
    auto& scope = dynamic_cast<OnnxScope&>(owner);
    return buffer ? scope.register_buffer(leaf, value) : scope.register_parameter(leaf, value);
  } catch (const std::bad_cast&) {
    core::fail(file_, ": initializer '", name, "' falls inside a layer module");
  } catch (const core::Error& error) {
    core::fail(file_, ": initializer '", name, "': ", error.what());
  }
}

// An owned BatchNormalization whose output only a Relu reads (not a graph output) runs the pair
// as BatchNorm::forward_relu: one op where the backend fuses it (the CPU in float32 training),
// writing the activation once; bitwise the composition's values, gradients and statistics. Not
// in a graph with subgraphs (If, Loop, Scan), which may read any value by name unseen.
void OnnxModel::Graph::Builder::pair_batch_norms_with_relus() {
  std::map<std::string, const onnx::NodeProto*> reader;  // of values read exactly once
  for (const auto& node : onnx_graph_.node()) {
    for (const auto& attribute : node.attribute()) {
      if (attribute.type() == onnx::AttributeProto::GRAPH ||
          attribute.type() == onnx::AttributeProto::GRAPHS)
        return;
    }
    for (const auto& input : node.input())
      if (uses_[input] == 1) reader[input] = &node;
  }
  std::set<std::string> graph_outputs;
  for (const auto& output : onnx_graph_.output()) graph_outputs.insert(output.name());
  for (const auto& [node, prefix] : owned_batch_norms_) {
    if (node->output_size() < 1 || node->output(0).empty()) continue;
    const std::string& y = node->output(0);
    auto found = reader.find(y);
    if (found == reader.end() || graph_outputs.count(y)) continue;
    const onnx::NodeProto& relu = *found->second;
    if (relu.op_type() != "Relu" || relu.input_size() != 1) continue;
    batch_norms_with_relu_.insert(node);
    absorbed_relus_.insert(&relu);
  }
}

// Builds the nn::BatchNorm child for an owned node, where its first initializer comes, so the
// children keep the exporter's (PyTorch's) order.
void OnnxModel::Graph::Builder::create_batch_norm(const onnx::NodeProto& node) {
  if (batch_norm_layers_.count(&node)) return;
  const std::string& prefix = owned_batch_norms_.at(&node);
  const std::string where = node_where(node);
  onnx_ops::NodeView view(node, graph_.opset, where);
  std::vector<std::string> path = split_dotted(prefix);
  const std::string leaf = path.back();
  path.pop_back();
  Module& parent = scope_for(path, prefix);
  const Tensor scale = tensor_from_proto(*initializers_[node.input(1)], where + " scale");
  BatchNormConfig config;
  MPIGRAD_CHECK(scale.dim() == 1 && scale.numel() >= 1, where, ": scale must be 1-d, got ",
                scale.shape());
  config.num_features = scale.numel();
  config.eps = view.get_float("epsilon", 1e-5);
  config.momentum = 1.0 - view.get_float("momentum", 0.9);
  auto batch_norm = std::make_shared<BatchNorm>(config, "BatchNorm", 2, 8);
  batch_norm->to(scale.dtype());
  {
    core::NoGradGuard no_grad;
    const char* names[] = {"weight", "bias", "running_mean", "running_var"};
    for (int i = 0; i < 4; ++i) {
      const Tensor value = tensor_from_proto(*initializers_[node.input(i + 1)], where);
      Tensor& slot = i < 2 ? batch_norm->parameter(names[i]) : batch_norm->buffer(names[i]);
      MPIGRAD_CHECK(value.shape() == slot.shape(), where, ": ", node.input(i + 1), " has shape ",
                    value.shape(), ", expected ", slot.shape());
      slot.copy_(value);
    }
    auto tracked = initializers_.find(prefix + ".num_batches_tracked");
    if (tracked != initializers_.end())
      batch_norm->buffer("num_batches_tracked")
          .copy_(tensor_from_proto(*tracked->second, where).reshape({}));
  }
  if (&parent == &model_) {
    model_.add_child(leaf, batch_norm);
  } else {
    dynamic_cast<OnnxScope&>(parent).add_child(leaf, batch_norm);
  }
  batch_norm_layers_[&node] = {&parent, leaf};
}

// Initializers, in file order: floating ones read as data are parameters (or BatchNorm
// buffers), the rest host constants.
void OnnxModel::Graph::Builder::load_initializers() {
  graph_.constants.clear();
  for (const auto& tensor : onnx_graph_.initializer()) {
    if (owned_names_.count(tensor.name())) {
      create_batch_norm(*owned_by_.at(tensor.name()));
      continue;
    }
    const std::string where = file_ + ": initializer '" + tensor.name() + "'";
    Tensor value = tensor_from_proto(tensor, where);
    const int id = ids_.get(tensor.name());
    known_.insert(id);
    if (core::is_floating(value.dtype()) && trainable_uses_[tensor.name()] > 0) {
      const bool buffer = buffer_names_.count(tensor.name()) > 0;
      Tensor& slot = register_slot(tensor.name(), value, buffer);
      graph_.slot_values.emplace_back(id, &slot);
      if (graph_.first_float_slot == nullptr) {
        graph_.first_float_slot = &slot;
        graph_.loaded_float_dtype = slot.dtype();
      }
    } else {
      if (int(graph_.constants.size()) <= id) graph_.constants.resize(size_t(id) + 1);
      graph_.constants[size_t(id)] = std::move(value);
    }
  }
}

// Graph inputs and outputs as declared; old exporters list the initializers among the inputs.
void OnnxModel::Graph::Builder::declare_inputs_and_outputs() {
  for (const auto& input : onnx_graph_.input()) {
    if (initializers_.count(input.name())) continue;
    graph_.inputs.push_back(value_info(input, file_));
    // The batch dim is free: the legacy exporter writes the example batch's size there.
    if (!graph_.inputs.back().shape.empty()) graph_.inputs.back().shape[0] = -1;
    const int id = ids_.get(input.name());
    graph_.input_ids.push_back(id);
    known_.insert(id);
  }
  for (const auto& output : onnx_graph_.output()) {
    graph_.outputs.push_back(value_info(output, file_));
    if (!graph_.outputs.back().shape.empty()) graph_.outputs.back().shape[0] = -1;
  }
}

// Nodes, in file order (ONNX requires a topological order).
void OnnxModel::Graph::Builder::compile_nodes() {
  for (const auto& node : onnx_graph_.node()) graph_.nodes.push_back(compile_node(node));
}

// One node: its input and output ids, checked against what is defined so far, and its function.
OnnxModel::Graph::Node OnnxModel::Graph::Builder::compile_node(const onnx::NodeProto& node) {
  const std::string where = node_where(node);
  Node compiled;
  compiled.where = where;
  compiled.name = node.name().empty() ? node.op_type() + "_" + std::to_string(graph_.nodes.size())
                                      : node.name();
  compiled.op_type = node.op_type();
  for (const auto& input : node.input()) {
    if (input.empty()) {
      compiled.inputs.push_back(-1);
      continue;
    }
    const bool owned = owned_names_.count(input) > 0;
    const int id = owned ? -1 : ids_.get(input);
    MPIGRAD_CHECK(owned || known_.count(id), where, " reads '", input,
                  "', which is no graph input, initializer or earlier node's output "
                  "(a missing initializer?)");
    compiled.inputs.push_back(id);
  }
  if (batch_norm_layers_.count(&node)) {
    Module* owner = batch_norm_layers_.at(&node).first;
    const std::string leaf = batch_norm_layers_.at(&node).second;
    const bool relu = batch_norms_with_relu_.count(&node) > 0;
    compiled.run = [owner, leaf, where, relu](const std::vector<Tensor>& in,
                                              onnx_ops::RunContext&) {
      Module* layer = find_child(*owner, leaf);
      MPIGRAD_CHECK(layer != nullptr, where, ": its layer '", leaf, "' was removed");
      // The layer may since have become another module (convert_sync_batchnorm): then
      // batch_norm_then_relu runs the two ops in turn.
      std::vector<Tensor> out{relu ? batch_norm_then_relu(*layer, in[0]) : layer->forward(in[0])};
      out.push_back(layer->buffer("running_mean"));
      out.push_back(layer->buffer("running_var"));
      return out;
    };
  } else if (absorbed_relus_.count(&node)) {
    // Its BatchNormalization applied it already.
    compiled.run = [](const std::vector<Tensor>& in, onnx_ops::RunContext&) {
      return std::vector<Tensor>{in[0]};
    };
  } else {
    compile_op(node, compiled);
  }
  for (const auto& output : node.output()) {
    if (output.empty()) {
      compiled.outputs.push_back(-1);
      continue;
    }
    const int id = ids_.get(output);
    MPIGRAD_CHECK(!known_.count(id), where, ": output '", output, "' is defined twice");
    known_.insert(id);
    compiled.outputs.push_back(id);
  }
  return compiled;
}

// A node's function from its op's row: the arity checked, then the builder run once, here, so
// attributes are read at load and not at every forward.
void OnnxModel::Graph::Builder::compile_op(const onnx::NodeProto& node, Node& compiled) const {
  const onnx_ops::OpInfo& op = *onnx_ops::op_table().find(node.op_type());
  const std::string& where = compiled.where;
  MPIGRAD_CHECK(node.input_size() >= op.inputs.min, where, ": has ", node.input_size(),
                " inputs, needs at least ", op.inputs.min);
  MPIGRAD_CHECK(node.input_size() <= op.inputs.max, where, ": has ", node.input_size(),
                " inputs, takes at most ", op.inputs.max);
  compiled.foldable = op.foldable;
  onnx_ops::NodeView view(node, graph_.opset, where);
  try {
    if (const auto* build = std::get_if<onnx_ops::OpBuilder>(&op.build)) {
      compiled.run = (*build)(view);
    } else {
      compiled.run_sequence = std::get<onnx_ops::SequenceBuilder>(op.build)(view);
    }
  } catch (const core::Error&) {
    throw;
  } catch (const std::exception& error) {
    core::fail(where, ": ", error.what());
  }
}

void OnnxModel::Graph::Builder::resolve_outputs() {
  for (const auto& output : graph_.outputs) {
    const auto it = ids_.ids.find(output.name);
    MPIGRAD_CHECK(it != ids_.ids.end() && known_.count(it->second), file_, ": graph output '",
                  output.name, "' is never computed");
    graph_.output_ids.push_back(it->second);
  }
  graph_.value_names = ids_.names;
  graph_.constants.resize(ids_.names.size());
}

// Nodes that read only constants run once, here (Constant, shape arithmetic on fixed shapes),
// unless their row says their result can change between forwards.
void OnnxModel::Graph::Builder::fold_constants() {
  std::vector<Node> kept;
  for (auto& node : graph_.nodes) {
    bool constant = node.foldable;
    std::vector<Tensor> in;
    for (int id : node.inputs) {
      if (id >= 0 && !graph_.constants[size_t(id)].defined()) constant = false;
      in.push_back(id >= 0 ? graph_.constants[size_t(id)] : Tensor());
    }
    if (!constant) {
      kept.push_back(std::move(node));
      continue;
    }
    core::NoGradGuard no_grad;
    onnx_ops::RunContext context;
    std::vector<Tensor> out;
    try {
      out = node.run(in, context);
    } catch (const std::exception& error) {
      rethrow_naming_node(error, node.where, file_);
    }
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      if (node.outputs[i] < 0) continue;
      MPIGRAD_CHECK(i < out.size() && out[i].defined(), node.where, ": output ", i,
                    " not produced");
      graph_.constants[size_t(node.outputs[i])] = out[i];
    }
  }
  graph_.nodes = std::move(kept);
}

// When each value can be dropped during a forward: after the last node that reads it, so a
// long graph holds only the activations autograd still needs.
void OnnxModel::Graph::Builder::plan_releases() {
  std::vector<int> last_use(ids_.names.size(), -1);
  for (size_t n = 0; n < graph_.nodes.size(); ++n)
    for (int id : graph_.nodes[n].inputs)
      if (id >= 0) last_use[size_t(id)] = int(n);
  for (int id : graph_.output_ids) last_use[size_t(id)] = int(graph_.nodes.size());
  graph_.release_after.assign(graph_.nodes.size(), {});
  for (size_t id = 0; id < last_use.size(); ++id)
    if (last_use[id] >= 0 && last_use[id] < int(graph_.nodes.size()))
      graph_.release_after[size_t(last_use[id])].push_back(int(id));
  graph_.device_constants = graph_.constants;
}

// Dropout draws from a generator the module registers, so it appears among named_generators()
// like any layer's Dropout generator.
void OnnxModel::Graph::Builder::add_dropout_generator() {
  graph_.dropout_generator = std::make_shared<core::Generator>(0);
  model_.register_generator("dropout", graph_.dropout_generator);
}

OnnxModel::OnnxModel() : graph_(std::make_unique<Graph>()) {}
OnnxModel::~OnnxModel() = default;

std::shared_ptr<OnnxModel> OnnxModel::load(const std::string& path) {
  onnx::ModelProto proto = read_onnx_model(path);
  std::shared_ptr<OnnxModel> model(new OnnxModel());
  Graph::build(*model, proto, path);
  return model;
}

std::shared_ptr<OnnxModel> OnnxModel::load_from_bytes(const std::string& bytes,
                                                      const std::string& name) {
  onnx::ModelProto proto = parse_onnx_model(bytes, name, std::filesystem::path("."));
  std::shared_ptr<OnnxModel> model(new OnnxModel());
  Graph::build(*model, proto, name);
  return model;
}

const std::vector<OnnxValueInfo>& OnnxModel::graph_inputs() const {
  return graph_->inputs;
}
const std::vector<OnnxValueInfo>& OnnxModel::graph_outputs() const {
  return graph_->outputs;
}
int64_t OnnxModel::opset() const {
  return graph_->opset;
}
const std::string& OnnxModel::file() const {
  return graph_->file;
}

std::string OnnxModel::extra_repr() const {
  return "file=" + graph_->file + ", nodes=" + std::to_string(graph_->nodes.size());
}

std::vector<Tensor> OnnxModel::Graph::bind_inputs(const std::vector<Tensor>& given,
                                                  std::optional<core::DType> float_dtype) const {
  MPIGRAD_CHECK(given.size() == inputs.size(), file, ": the graph takes ", inputs.size(),
                " input(s), got ", given.size());
  std::vector<Tensor> bound;
  for (size_t i = 0; i < given.size(); ++i) {
    const OnnxValueInfo& info = inputs[i];
    Tensor x = given[i];
    MPIGRAD_CHECK(x.defined(), file, ": input '", info.name, "' is undefined");
    if (!info.shape.empty() || x.dim() == 0) {
      bool fits = int64_t(x.dim()) == int64_t(info.shape.size());
      for (size_t d = 0; fits && d < info.shape.size(); ++d)
        fits = info.shape[d] < 0 || info.shape[d] == x.shape()[int(d)];
      MPIGRAD_CHECK(fits, file, ": input '", info.name, "' has shape ", x.shape(),
                    ", the graph declares ", onnx_shape_text(info.shape));
    }
    core::DType want = info.dtype;
    if (core::is_floating(want) && float_dtype) want = *float_dtype;
    if (x.dtype() != want) x = x.to(want);
    bound.push_back(std::move(x));
  }
  return bound;
}

void OnnxModel::Graph::move_constants(core::Device to) {
  if (to == device) return;
  for (size_t i = 0; i < constants.size(); ++i)
    if (constants[i].defined()) device_constants[i] = constants[i].to(to);
  device = to;
}

std::vector<Tensor> OnnxModel::forward_all(const std::vector<Tensor>& inputs) {
  Graph& graph = *graph_;
  // Floating inputs take the declared dtype, or the parameters' new one once to() moved them.
  std::optional<core::DType> float_dtype;
  if (graph.first_float_slot != nullptr &&
      graph.first_float_slot->dtype() != graph.loaded_float_dtype)
    float_dtype = graph.first_float_slot->dtype();
  std::vector<Tensor> bound = graph.bind_inputs(inputs, float_dtype);
  std::vector<Tensor> values(graph.value_names.size());
  for (size_t i = 0; i < bound.size(); ++i) values[size_t(graph.input_ids[i])] = bound[i];
  graph.move_constants(inputs.empty() ? core::kCPU : inputs[0].device());
  for (size_t i = 0; i < graph.device_constants.size(); ++i)
    if (graph.device_constants[i].defined()) values[i] = graph.device_constants[i];
  for (const auto& [id, slot] : graph.slot_values) values[size_t(id)] = *slot;

  onnx_ops::RunContext context;
  context.training = is_training();
  context.generator = graph.dropout_generator.get();

  std::vector<std::vector<Tensor>> sequences;
  std::vector<bool> is_sequence;
  std::vector<Tensor> in;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Graph::Node& node = graph.nodes[n];
    core::ProfileSpan span(node.name.c_str(), core::ProfileKind::OnnxNode, node.op_type.c_str());
    if (node.run_sequence) {
      sequences.resize(values.size());
      is_sequence.resize(values.size());
      onnx_ops::SequenceState state{values, sequences, is_sequence};
      try {
        node.run_sequence(node.inputs, node.outputs, state);
      } catch (const std::exception& error) {
        rethrow_naming_node(error, node.where, graph.file);
      }
      continue;
    }
    in.clear();
    for (int id : node.inputs) in.push_back(id >= 0 ? values[size_t(id)] : Tensor());
    std::vector<Tensor> out;
    try {
      out = node.run(in, context);
    } catch (const std::exception& error) {
      rethrow_naming_node(error, node.where, graph.file);
    }
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      if (node.outputs[i] < 0) continue;
      MPIGRAD_CHECK(i < out.size() && out[i].defined(), node.where, ": output ", i, " ('",
                    graph.value_names[size_t(node.outputs[i])], "') is not produced");
      values[size_t(node.outputs[i])] = std::move(out[i]);
    }
    for (int id : graph.release_after[n]) values[size_t(id)] = Tensor();
  }
  std::vector<Tensor> outputs;
  for (int id : graph.output_ids) outputs.push_back(values[size_t(id)]);
  return outputs;
}

Tensor OnnxModel::forward(const Tensor& input) {
  MPIGRAD_CHECK(graph_->inputs.size() == 1, graph_->file, ": the graph takes ",
                graph_->inputs.size(), " inputs; call forward_all");
  return forward_all({input}).front();
}

std::string onnx_shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    text += (i ? ", " : "") + (shape[i] < 0 ? std::string("?") : std::to_string(shape[i]));
  }
  return text + "]";
}

}  // namespace mpigrad::nn
