#include "mpigrad/launch/commands/onnx_command.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "mpigrad/core/atomic_file.h"
#include "mpigrad/core/error.h"
#include "mpigrad/launch/commands/subcommand.h"
#include "mpigrad/nn/checkpoint.h"
#include "mpigrad/nn/onnx/onnx_file.h"

namespace mpigrad::launch {

namespace {

constexpr const char* kUsage =
    "usage: mpigrad onnx inspect MODEL.onnx\n"
    "       mpigrad onnx export --checkpoint CKPT.h5 --model MODEL.onnx -o OUT.onnx\n\n"
    "inspect  lists the graph's inputs and outputs (dtype, shape; ? is a free dimension), its\n"
    "         initializers as mpigrad holds them (parameter, buffer or constant) and every op\n"
    "         type with whether mpigrad runs it at the file's opset. Exit status 0 when every\n"
    "         op is supported, 3 when some are not, 1 on a bad file.\n"
    "export   writes the weights of a checkpoint of `mpigrad train` (or of the C API's\n"
    "         save_model) into a copy of MODEL.onnx, matched by name, as one self-contained\n"
    "         file OUT.onnx (external data inlined), through a temporary file and a rename.\n"
    "         The copy is for inference: BatchNormalization and Dropout exported in training\n"
    "         mode are set to inference mode (BatchNorm on the trained running statistics).\n";

std::string dims_text(const onnx::TensorShapeProto& shape) {
  std::string text = "[";
  for (int d = 0; d < shape.dim_size(); ++d) {
    const auto& dim = shape.dim(d);
    if (d > 0) text += ", ";
    text += dim.has_dim_value() ? std::to_string(dim.dim_value())
                                : (dim.has_dim_param() ? "?" + dim.dim_param() : "?");
  }
  return text + "]";
}

std::string dims_text(const google::protobuf::RepeatedField<int64_t>& dims) {
  std::string text = "[";
  for (int d = 0; d < dims.size(); ++d) text += (d ? ", " : "") + std::to_string(dims[d]);
  return text + "]";
}

bool is_floating_onnx(int32_t data_type) {
  using T = onnx::TensorProto;
  return data_type == T::FLOAT || data_type == T::DOUBLE || data_type == T::FLOAT16 ||
         data_type == T::BFLOAT16;
}

bool is_batch_norm_statistic(const std::string& name) {
  return name.ends_with("running_mean") || name.ends_with("running_var");
}

// What nn::OnnxModel makes of an initializer (see nn/onnx/onnx_model.h).
const char* role_of(const onnx::TensorProto& initializer) {
  if (!is_floating_onnx(initializer.data_type())) return "constant";
  return is_batch_norm_statistic(initializer.name()) ? "buffer" : "parameter";
}

void print_values(const char* title,
                  const google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>& values,
                  const std::set<std::string>& initializers) {
  std::printf("%s:\n", title);
  for (const onnx::ValueInfoProto& value : values) {
    if (initializers.count(value.name())) continue;  // old exporters list weights as inputs
    const auto& type = value.type().tensor_type();
    std::printf("  %-24s %-8s %s\n", value.name().c_str(),
                nn::onnx_dtype_name(type.elem_type()).c_str(),
                type.has_shape() ? dims_text(type.shape()).c_str() : "(no shape)");
  }
}

int inspect(const std::vector<std::string>& args) {
  MPIGRAD_CHECK(args.size() == 1, "expected one MODEL.onnx (see --help)");
  const std::string& path = args.front();
  MPIGRAD_CHECK(std::filesystem::is_regular_file(path), "file '", path, "' does not exist");
  const onnx::ModelProto model = nn::read_onnx_model(path);
  const int64_t opset = nn::onnx_default_opset(model);
  const onnx::GraphProto& graph = model.graph();
  std::printf("%s: IR version %lld, opset %lld, producer %s %s\n", path.c_str(),
              static_cast<long long>(model.ir_version()), static_cast<long long>(opset),
              model.producer_name().c_str(), model.producer_version().c_str());
  std::set<std::string> initializer_names;
  for (const onnx::TensorProto& initializer : graph.initializer()) {
    initializer_names.insert(initializer.name());
  }
  print_values("inputs", graph.input(), initializer_names);
  print_values("outputs", graph.output(), {});

  std::map<std::string, int64_t> values_by_role;
  std::printf("initializers (as mpigrad holds them):\n");
  for (const onnx::TensorProto& initializer : graph.initializer()) {
    int64_t count = 1;
    for (int64_t dim : initializer.dims()) count *= dim;
    values_by_role[role_of(initializer)] += count;
    std::printf("  %-40s %-9s %-8s %s\n", initializer.name().c_str(), role_of(initializer),
                nn::onnx_dtype_name(initializer.data_type()).c_str(),
                dims_text(initializer.dims()).c_str());
  }
  std::printf("  (%lld parameter values, %lld buffer values, %lld constant values)\n",
              static_cast<long long>(values_by_role["parameter"]),
              static_cast<long long>(values_by_role["buffer"]),
              static_cast<long long>(values_by_role["constant"]));

  // Op types in the order they first appear, each with its count.
  std::vector<std::string> order;
  std::map<std::string, int64_t> counts;
  for (const onnx::NodeProto& node : graph.node()) {
    const std::string type = node.domain().empty() || node.domain() == "ai.onnx"
                                 ? node.op_type()
                                 : node.domain() + "::" + node.op_type();
    if (counts[type]++ == 0) order.push_back(type);
  }
  std::printf("ops (%d nodes, opset %lld):\n", graph.node_size(), static_cast<long long>(opset));
  std::vector<std::string> unsupported;
  for (const std::string& type : order) {
    const bool supported =
        type.find("::") == std::string::npos && nn::onnx_op_supported(type, opset);
    if (!supported) unsupported.push_back(type);
    std::printf("  %-24s %4lld  %s\n", type.c_str(), static_cast<long long>(counts[type]),
                supported ? "supported" : "NOT SUPPORTED");
  }
  if (unsupported.empty()) {
    std::printf("every op is supported: mpigrad can train this graph\n");
    return 0;
  }
  std::string list;
  for (const std::string& type : unsupported) list += (list.empty() ? "" : ", ") + type;
  std::printf("%zu op type(s) not supported at opset %lld: %s\n", unsupported.size(),
              static_cast<long long>(opset), list.c_str());
  return 3;
}

// The names some node or the graph reads.
std::set<std::string> consumed_names(const onnx::GraphProto& graph) {
  std::set<std::string> names;
  for (const onnx::NodeProto& node : graph.node()) {
    for (const std::string& input : node.input()) names.insert(input);
  }
  for (const onnx::ValueInfoProto& output : graph.output()) names.insert(output.name());
  return names;
}

// A graph exported in training mode (the legacy exporter's TrainingMode.TRAINING) runs its
// BatchNormalization on batch statistics and its Dropout at random in ONNX Runtime too; the
// trained copy is for inference: BatchNormalization in inference mode (on the trained running
// statistics; its statistics outputs dropped when nothing reads them) and Dropout without its
// training_mode input. Returns how many nodes it changed.
int64_t to_inference_mode(onnx::GraphProto& graph, const std::string& where) {
  const std::set<std::string> consumed = consumed_names(graph);
  int64_t changed = 0;
  for (onnx::NodeProto& node : *graph.mutable_node()) {
    if (node.op_type() == "BatchNormalization") {
      auto* attributes = node.mutable_attribute();
      const auto training = std::find_if(attributes->begin(), attributes->end(),
                                         [](const auto& a) { return a.name() == "training_mode"; });
      if (training == attributes->end() || training->i() == 0) continue;
      for (int output = 1; output < node.output_size(); ++output) {
        MPIGRAD_CHECK(node.output(output).empty() || !consumed.count(node.output(output)),
                      "--model: '", where, "' node '", node.name(),
                      "' (BatchNormalization in training mode) feeds its running statistics '",
                      node.output(output), "' to the graph; cannot write it for inference");
      }
      attributes->erase(training);
      while (node.output_size() > 1) node.mutable_output()->RemoveLast();
      ++changed;
    } else if (node.op_type() == "Dropout" && node.input_size() >= 3 && !node.input(2).empty()) {
      node.set_input(2, "");  // absent: inference, whatever the file said
      ++changed;
    }
  }
  return changed;
}

int export_model(std::vector<std::string> args) {
  const std::optional<std::string> checkpoint = take_option(args, "checkpoint");
  const std::optional<std::string> model_path = take_option(args, "model");
  const std::optional<std::string> output = take_option(args, "output", "-o");
  MPIGRAD_CHECK(args.empty(), "unexpected argument '", args.empty() ? "" : args.front(),
                "' (see --help)");
  MPIGRAD_CHECK(checkpoint && !checkpoint->empty(), "--checkpoint CKPT.h5 is required");
  MPIGRAD_CHECK(model_path && !model_path->empty(), "--model MODEL.onnx is required");
  MPIGRAD_CHECK(output && !output->empty(), "-o OUT.onnx is required");
  namespace fs = std::filesystem;
  MPIGRAD_CHECK(fs::is_regular_file(*checkpoint), "--checkpoint: file '", *checkpoint,
                "' does not exist");
  MPIGRAD_CHECK(fs::is_regular_file(*model_path), "--model: file '", *model_path,
                "' does not exist");
  std::error_code same_error;
  MPIGRAD_CHECK(!fs::exists(*output) || !fs::equivalent(*output, *model_path, same_error), "-o: '",
                *output, "' is the model file itself; write the trained copy elsewhere");

  onnx::ModelProto model = nn::read_onnx_model(*model_path);
  const nn::CheckpointData data = nn::load_checkpoint(*checkpoint);
  std::set<std::string> used;
  int64_t replaced = 0;
  for (onnx::TensorProto& initializer : *model.mutable_graph()->mutable_initializer()) {
    const std::string name = initializer.name();
    const core::Tensor* trained = data.model.find(name);
    if (trained == nullptr) {
      // Integer constants are not trained; every floating initializer is a weight or buffer.
      MPIGRAD_CHECK(!is_floating_onnx(initializer.data_type()), "--checkpoint: '", *checkpoint,
                    "' has no tensor '", name, "' for the ", role_of(initializer), " of '",
                    *model_path, "' (shape ", dims_text(initializer.dims()),
                    "); was it trained from this model?");
    } else {
      const std::string where = "initializer '" + name + "' of '" + *model_path + "'";
      std::vector<int64_t> dims(initializer.dims().begin(), initializer.dims().end());
      MPIGRAD_CHECK(trained->shape() == core::Shape(dims), "--checkpoint: '", *checkpoint,
                    "' tensor '", name, "' has shape ", trained->shape(), " but the ", where,
                    " has ", dims_text(initializer.dims()));
      const core::DType dtype = nn::dtype_from_onnx(initializer.data_type(), where);
      nn::tensor_to_proto(trained->to(dtype).contiguous(), initializer);
      used.insert(name);
      ++replaced;
    }
  }
  for (const auto& [name, tensor] : data.model.tensors()) {
    if (used.count(name) || name.ends_with("num_batches_tracked")) continue;
    core::fail("--checkpoint: '", *checkpoint, "' tensor '", name, "' (shape ", tensor.shape(),
               ") has no initializer in '", *model_path, "'; was it trained from this model?");
  }
  const int64_t inference_nodes = to_inference_mode(*model.mutable_graph(), *model_path);
  const size_t bytes = model.ByteSizeLong();
  MPIGRAD_CHECK(bytes < size_t(std::numeric_limits<int32_t>::max()), "-o: '", *output,
                "' would be ", bytes,
                " bytes, beyond protobuf's 2 GiB for one self-contained ONNX file");
  core::write_file_atomically(*output, [&](std::ostream& out) {
    MPIGRAD_CHECK(model.SerializeToOstream(&out), "-o: cannot serialize the model to '", *output,
                  "'");
  });
  std::printf("mpigrad onnx export: %lld initializer(s) from %s written into %s (%zu bytes)",
              static_cast<long long>(replaced), checkpoint->c_str(), output->c_str(), bytes);
  if (inference_nodes > 0) {
    std::printf("; %lld BatchNormalization/Dropout node(s) set to inference mode",
                static_cast<long long>(inference_nodes));
  }
  std::printf("\n");
  return 0;
}

}  // namespace

int run_onnx_command(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  const bool help = std::any_of(args.begin(), args.end(),
                                [](const std::string& a) { return a == "--help" || a == "-h"; });
  if (help) {
    std::printf("%s", kUsage);
    return 0;
  }
  if (args.empty()) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  const std::string action = args.front();
  args.erase(args.begin());
  const std::string program = "mpigrad onnx " + action;
  try {
    if (action == "inspect") return inspect(args);
    if (action == "export") return export_model(args);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: error: %s\n", program.c_str(), error.what());
    return 1;
  }
  std::fprintf(stderr, "mpigrad onnx: unknown action '%s' (inspect or export; see --help)\n",
               action.c_str());
  return 2;
}

}  // namespace mpigrad::launch
