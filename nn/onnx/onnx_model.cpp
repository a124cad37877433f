#include "mpigrad/nn/onnx/onnx_model.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <utility>
#include <variant>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/nn/layers/batch_norm.h"
#include "mpigrad/nn/onnx/onnx_file.h"
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

  static void build(OnnxModel& model, const onnx::ModelProto& proto, const std::string& file);
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

}  // namespace

void OnnxModel::Graph::build(OnnxModel& model, const onnx::ModelProto& proto,
                             const std::string& file) {
  Graph& graph = *model.graph_;
  graph.file = file;
  graph.opset = onnx_default_opset(proto);
  const onnx::GraphProto& g = proto.graph();
  const onnx_ops::OpTable& table = onnx_ops::op_table();

  auto node_where = [&](const onnx::NodeProto& node) {
    std::ostringstream out;
    out << file << ": node '" << node.name() << "' (" << node.op_type() << ", opset " << graph.opset
        << ")";
    return out.str();
  };

  // Every op first, so an unknown one stops the load before anything is built.
  std::vector<std::string> unsupported;
  for (const auto& node : g.node()) {
    const bool default_domain = node.domain().empty() || node.domain() == "ai.onnx";
    if (!default_domain || table.find(node.op_type()) == nullptr) {
      unsupported.push_back(node.op_type() +
                            (default_domain ? "" : " (domain " + node.domain() + ")") +
                            " in node '" + node.name() + "'");
    }
  }
  if (!unsupported.empty()) {
    std::ostringstream out;
    out << file << " (opset " << graph.opset << "): " << unsupported.size()
        << " node(s) use ops mpigrad does not support: ";
    for (size_t i = 0; i < unsupported.size() && i < 8; ++i)
      out << (i ? "; " : "") << unsupported[i];
    if (unsupported.size() > 8) out << "; ...";
    core::fail(out.str());
  }

  ValueIds ids;
  std::map<std::string, const onnx::TensorProto*> initializers;
  for (const auto& tensor : g.initializer()) {
    MPIGRAD_CHECK(!tensor.name().empty(), file, ": an initializer has no name");
    MPIGRAD_CHECK(initializers.emplace(tensor.name(), &tensor).second, file, ": initializer '",
                  tensor.name(), "' is defined twice");
  }
  // Uses of each value, and those at a differentiable input: a floating initializer read only
  // as settings (Resize scales, Clip bounds, Dropout ratio) stays a constant, not a parameter.
  std::map<std::string, int> uses, trainable_uses;
  for (const auto& node : g.node()) {
    const onnx_ops::OpInfo& op = *table.find(node.op_type());
    for (int i = 0; i < node.input_size(); ++i) {
      ++uses[node.input(i)];
      if (!op.is_setting_input(i)) ++trainable_uses[node.input(i)];
    }
  }

  // BatchNormalization nodes an nn::BatchNorm child can own: prefix P with P.weight, P.bias,
  // P.running_mean, P.running_var as initializers that nothing else reads.
  std::map<const onnx::NodeProto*, std::string> owned_batch_norms;
  std::set<std::string> owned_names, buffer_names;
  for (const auto& node : g.node()) {
    if (node.op_type() != "BatchNormalization" || node.input_size() < 5) continue;
    buffer_names.insert(node.input(3));
    buffer_names.insert(node.input(4));
    const std::string& scale = node.input(1);
    const std::string suffix = ".weight";
    if (scale.size() <= suffix.size() ||
        scale.compare(scale.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string prefix = scale.substr(0, scale.size() - suffix.size());
    const bool owned = node.input(2) == prefix + ".bias" &&
                       node.input(3) == prefix + ".running_mean" &&
                       node.input(4) == prefix + ".running_var";
    bool only_here = owned;
    for (int i = 1; i < 5 && only_here; ++i)
      only_here = initializers.count(node.input(i)) && uses[node.input(i)] == 1 &&
                  owned_names.count(node.input(i)) == 0;
    if (!only_here) continue;
    owned_batch_norms[&node] = prefix;
    for (int i = 1; i < 5; ++i) owned_names.insert(node.input(i));
  }

  // The module for a dotted prefix, creating OnnxScope levels on the way.
  auto scope_for = [&](const std::vector<std::string>& path, const std::string& name) -> Module& {
    Module* current = &model;
    for (const std::string& part : path) {
      Module* child = find_child(*current, part);
      if (child == nullptr) {
        auto scope = std::make_shared<OnnxScope>();
        if (current == &model) {
          model.add_child(part, scope);
        } else {
          auto* parent_scope = dynamic_cast<OnnxScope*>(current);
          MPIGRAD_CHECK(parent_scope != nullptr, file, ": cannot place '", name, "' under '", part,
                        "'");
          parent_scope->add_child(part, scope);
        }
        child = scope.get();
      }
      current = child;
    }
    return *current;
  };
  auto register_slot = [&](const std::string& name, Tensor value, bool buffer) -> Tensor& {
    std::vector<std::string> path = split_dotted(name);
    const std::string leaf = path.back();
    path.pop_back();
    Module& owner = scope_for(path, name);
    try {
      if (&owner == &model)
        return buffer ? model.register_buffer(leaf, value) : model.register_parameter(leaf, value);
      auto& scope = dynamic_cast<OnnxScope&>(owner);
      return buffer ? scope.register_buffer(leaf, value) : scope.register_parameter(leaf, value);
    } catch (const std::bad_cast&) {
      core::fail(file, ": initializer '", name, "' falls inside a layer module");
    } catch (const core::Error& error) {
      core::fail(file, ": initializer '", name, "': ", error.what());
    }
  };

  graph.constants.clear();
  auto set_constant = [&](int id, Tensor value) {
    if (int(graph.constants.size()) <= id) graph.constants.resize(size_t(id) + 1);
    graph.constants[size_t(id)] = std::move(value);
  };
  std::set<int> known;  // values defined so far (inputs, initializers, earlier outputs)

  // Builds the nn::BatchNorm child for an owned node, where its first initializer comes, so
  // the children keep the exporter's (PyTorch's) order.
  std::map<const onnx::NodeProto*, std::pair<Module*, std::string>> batch_norm_layers;
  auto create_batch_norm = [&](const onnx::NodeProto& node) {
    if (batch_norm_layers.count(&node)) return;
    const auto owned = owned_batch_norms.find(&node);
    const std::string where = node_where(node);
    onnx_ops::NodeView view(node, graph.opset, where);
    std::vector<std::string> path = split_dotted(owned->second);
    const std::string leaf = path.back();
    path.pop_back();
    Module& parent = scope_for(path, owned->second);
    const Tensor scale = tensor_from_proto(*initializers[node.input(1)], where + " scale");
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
        const Tensor value = tensor_from_proto(*initializers[node.input(i + 1)], where);
        Tensor& slot = i < 2 ? batch_norm->parameter(names[i]) : batch_norm->buffer(names[i]);
        MPIGRAD_CHECK(value.shape() == slot.shape(), where, ": ", node.input(i + 1), " has shape ",
                      value.shape(), ", expected ", slot.shape());
        slot.copy_(value);
      }
      auto tracked = initializers.find(owned->second + ".num_batches_tracked");
      if (tracked != initializers.end())
        batch_norm->buffer("num_batches_tracked")
            .copy_(tensor_from_proto(*tracked->second, where).reshape({}));
    }
    if (&parent == &model) {
      model.add_child(leaf, batch_norm);
    } else {
      dynamic_cast<OnnxScope&>(parent).add_child(leaf, batch_norm);
    }
    batch_norm_layers[&node] = {&parent, leaf};
  };
  std::map<std::string, const onnx::NodeProto*> owned_by;
  for (const auto& [node, prefix] : owned_batch_norms)
    for (int i = 1; i < 5; ++i) owned_by[node->input(i)] = node;

  // Initializers: floating ones are parameters (or BN buffers), the rest host constants.
  for (const auto& tensor : g.initializer()) {
    if (owned_names.count(tensor.name())) {
      create_batch_norm(*owned_by.at(tensor.name()));
      continue;
    }
    const std::string where = file + ": initializer '" + tensor.name() + "'";
    Tensor value = tensor_from_proto(tensor, where);
    const int id = ids.get(tensor.name());
    known.insert(id);
    if (core::is_floating(value.dtype()) && trainable_uses[tensor.name()] > 0) {
      const bool buffer = buffer_names.count(tensor.name()) > 0;
      Tensor& slot = register_slot(tensor.name(), value, buffer);
      graph.slot_values.emplace_back(id, &slot);
      if (graph.first_float_slot == nullptr) {
        graph.first_float_slot = &slot;
        graph.loaded_float_dtype = slot.dtype();
      }
    } else {
      set_constant(id, value);
    }
  }
  // Graph inputs; old exporters list the initializers among them.
  for (const auto& input : g.input()) {
    if (initializers.count(input.name())) continue;
    graph.inputs.push_back(value_info(input, file));
    // The batch dim is free: the legacy exporter writes the example batch's size there.
    if (!graph.inputs.back().shape.empty()) graph.inputs.back().shape[0] = -1;
    const int id = ids.get(input.name());
    graph.input_ids.push_back(id);
    known.insert(id);
  }
  for (const auto& output : g.output()) {
    graph.outputs.push_back(value_info(output, file));
    if (!graph.outputs.back().shape.empty()) graph.outputs.back().shape[0] = -1;
  }

  // Nodes, in file order (ONNX requires a topological order).
  for (const auto& node : g.node()) {
    const std::string where = node_where(node);
    Node compiled;
    compiled.where = where;
    for (const auto& input : node.input()) {
      if (input.empty()) {
        compiled.inputs.push_back(-1);
        continue;
      }
      const bool owned = owned_names.count(input) > 0;
      const int id = owned ? -1 : ids.get(input);
      MPIGRAD_CHECK(owned || known.count(id), where, " reads '", input,
                    "', which is no graph input, initializer or earlier node's output "
                    "(a missing initializer?)");
      compiled.inputs.push_back(id);
    }
    if (batch_norm_layers.count(&node)) {
      Module* owner = batch_norm_layers.at(&node).first;
      const std::string leaf = batch_norm_layers.at(&node).second;
      compiled.run = [owner, leaf, where](const std::vector<Tensor>& in, onnx_ops::RunContext&) {
        Module* layer = find_child(*owner, leaf);
        MPIGRAD_CHECK(layer != nullptr, where, ": its layer '", leaf, "' was removed");
        std::vector<Tensor> out{layer->forward(in[0])};
        out.push_back(layer->buffer("running_mean"));
        out.push_back(layer->buffer("running_var"));
        return out;
      };
    } else {
      const onnx_ops::OpInfo& op = *table.find(node.op_type());
      MPIGRAD_CHECK(node.input_size() >= op.inputs.min, where, ": has ", node.input_size(),
                    " inputs, needs at least ", op.inputs.min);
      MPIGRAD_CHECK(node.input_size() <= op.inputs.max, where, ": has ", node.input_size(),
                    " inputs, takes at most ", op.inputs.max);
      compiled.foldable = op.foldable;
      onnx_ops::NodeView view(node, graph.opset, where);
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
    for (const auto& output : node.output()) {
      if (output.empty()) {
        compiled.outputs.push_back(-1);
        continue;
      }
      const int id = ids.get(output);
      MPIGRAD_CHECK(!known.count(id), where, ": output '", output, "' is defined twice");
      known.insert(id);
      compiled.outputs.push_back(id);
    }
    graph.nodes.push_back(std::move(compiled));
  }
  for (const auto& output : graph.outputs) {
    const auto it = ids.ids.find(output.name);
    MPIGRAD_CHECK(it != ids.ids.end() && known.count(it->second), file, ": graph output '",
                  output.name, "' is never computed");
    graph.output_ids.push_back(it->second);
  }
  graph.value_names = ids.names;
  graph.constants.resize(ids.names.size());

  // Nodes that read only constants run once, here (Constant, shape arithmetic on fixed shapes),
  // unless their op's row says their result can change between forwards.
  std::vector<Node> kept;
  for (auto& node : graph.nodes) {
    bool constant = node.foldable;
    std::vector<Tensor> in;
    for (int id : node.inputs) {
      if (id >= 0 && !graph.constants[size_t(id)].defined()) constant = false;
      in.push_back(id >= 0 ? graph.constants[size_t(id)] : Tensor());
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
      const std::string what = error.what();
      if (dynamic_cast<const core::Error*>(&error) && what.rfind(file, 0) == 0) throw;
      core::fail(node.where, ": ", what);
    }
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      if (node.outputs[i] < 0) continue;
      MPIGRAD_CHECK(i < out.size() && out[i].defined(), node.where, ": output ", i,
                    " not produced");
      graph.constants[size_t(node.outputs[i])] = out[i];
    }
  }
  graph.nodes = std::move(kept);

  // When each value can be dropped: after the last node that reads it.
  std::vector<int> last_use(ids.names.size(), -1);
  for (size_t n = 0; n < graph.nodes.size(); ++n)
    for (int id : graph.nodes[n].inputs)
      if (id >= 0) last_use[size_t(id)] = int(n);
  for (int id : graph.output_ids) last_use[size_t(id)] = int(graph.nodes.size());
  graph.release_after.assign(graph.nodes.size(), {});
  for (size_t id = 0; id < last_use.size(); ++id)
    if (last_use[id] >= 0 && last_use[id] < int(graph.nodes.size()))
      graph.release_after[size_t(last_use[id])].push_back(int(id));
  graph.device_constants = graph.constants;

  graph.dropout_generator = std::make_shared<core::Generator>(0);
  model.register_generator("dropout", graph.dropout_generator);
}

OnnxModel::OnnxModel() : graph_(std::make_unique<Graph>()) {}
OnnxModel::~OnnxModel() = default;

std::shared_ptr<OnnxModel> OnnxModel::load(const std::string& path) {
  const onnx::ModelProto proto = read_onnx_model(path);
  std::shared_ptr<OnnxModel> model(new OnnxModel());
  Graph::build(*model, proto, path);
  return model;
}

std::shared_ptr<OnnxModel> OnnxModel::load_from_bytes(const std::string& bytes,
                                                      const std::string& name) {
  const onnx::ModelProto proto = parse_onnx_model(bytes, name, std::filesystem::path("."));
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

std::vector<Tensor> OnnxModel::forward_all(const std::vector<Tensor>& inputs) {
  Graph& graph = *graph_;
  MPIGRAD_CHECK(inputs.size() == graph.inputs.size(), graph.file, ": the graph takes ",
                graph.inputs.size(), " input(s), got ", inputs.size());
  // Floating inputs take the declared dtype, or the parameters' new one once to() moved them.
  std::optional<core::DType> float_dtype;
  if (graph.first_float_slot != nullptr &&
      graph.first_float_slot->dtype() != graph.loaded_float_dtype)
    float_dtype = graph.first_float_slot->dtype();
  std::vector<Tensor> values(graph.value_names.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const OnnxValueInfo& info = graph.inputs[i];
    Tensor x = inputs[i];
    MPIGRAD_CHECK(x.defined(), graph.file, ": input '", info.name, "' is undefined");
    if (!info.shape.empty() || x.dim() == 0) {
      bool fits = int64_t(x.dim()) == int64_t(info.shape.size());
      for (size_t d = 0; fits && d < info.shape.size(); ++d)
        fits = info.shape[d] < 0 || info.shape[d] == x.shape()[int(d)];
      MPIGRAD_CHECK(fits, graph.file, ": input '", info.name, "' has shape ", x.shape(),
                    ", the graph declares ", onnx_shape_text(info.shape));
    }
    core::DType want = info.dtype;
    if (core::is_floating(want) && float_dtype) want = *float_dtype;
    if (x.dtype() != want) x = x.to(want);
    values[size_t(graph.input_ids[i])] = x;
  }
  const core::Device device = inputs.empty() ? core::kCPU : inputs[0].device();
  if (!(device == graph.device)) {
    for (size_t i = 0; i < graph.constants.size(); ++i)
      if (graph.constants[i].defined()) graph.device_constants[i] = graph.constants[i].to(device);
    graph.device = device;
  }
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
    if (node.run_sequence) {
      sequences.resize(values.size());
      is_sequence.resize(values.size());
      onnx_ops::SequenceState state{values, sequences, is_sequence};
      try {
        node.run_sequence(node.inputs, node.outputs, state);
      } catch (const std::exception& error) {
        const std::string what = error.what();
        if (dynamic_cast<const core::Error*>(&error) && what.rfind(graph.file, 0) == 0) throw;
        core::fail(node.where, ": ", what);
      }
      continue;
    }
    in.clear();
    for (int id : node.inputs) in.push_back(id >= 0 ? values[size_t(id)] : Tensor());
    std::vector<Tensor> out;
    try {
      out = node.run(in, context);
    } catch (const std::exception& error) {
      // Every failure inside a node (a core op's shape check, an index out of range) becomes
      // one core::Error that names the node, unless it already names the file.
      const std::string what = error.what();
      if (dynamic_cast<const core::Error*>(&error) && what.rfind(graph.file, 0) == 0) throw;
      core::fail(node.where, ": ", what);
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
