// Builds small ONNX models in C++ for the loader's tests, with ONNX's protobuf classes: a graph
// of named inputs, initializers and nodes, written to a file in a scratch folder.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "mpigrad/core/tensor.h"
#include "mpigrad/nn/onnx/onnx_file.h"

namespace mpigrad::test {

class OnnxGraph {
 public:
  explicit OnnxGraph(int64_t opset = 17, int64_t ir_version = 8) {
    model_.set_ir_version(ir_version);
    model_.set_producer_name("mpigrad-test");
    auto* import = model_.add_opset_import();
    import->set_domain("");
    import->set_version(opset);
    model_.mutable_graph()->set_name("test");
  }

  // A graph input; -1 in `shape` is a free dim.
  OnnxGraph& input(const std::string& name, std::vector<int64_t> shape,
                   int32_t type = onnx::TensorProto::DOUBLE) {
    value_info(model_.mutable_graph()->add_input(), name, shape, type);
    return *this;
  }
  OnnxGraph& output(const std::string& name, int32_t type = onnx::TensorProto::DOUBLE) {
    value_info(model_.mutable_graph()->add_output(), name, {}, type, false);
    return *this;
  }
  OnnxGraph& initializer(const std::string& name, const core::Tensor& value) {
    auto* tensor = model_.mutable_graph()->add_initializer();
    nn::tensor_to_proto(value, *tensor);
    tensor->set_name(name);
    return *this;
  }
  // A node; attributes are added to the returned proto.
  onnx::NodeProto& node(const std::string& op_type, std::vector<std::string> inputs,
                        std::vector<std::string> outputs, const std::string& name = "") {
    auto* node = model_.mutable_graph()->add_node();
    node->set_op_type(op_type);
    node->set_name(name.empty() ? op_type + "_" + std::to_string(model_.graph().node_size())
                                : name);
    for (auto& input : inputs) node->add_input(input);
    for (auto& output : outputs) node->add_output(output);
    return *node;
  }
  onnx::ModelProto& proto() { return model_; }

  // Writes the model into `folder` (created) as `file` and returns its path.
  std::string write(const std::filesystem::path& folder,
                    const std::string& file = "model.onnx") const {
    std::filesystem::create_directories(folder);
    const auto path = folder / file;
    std::ofstream out(path, std::ios::binary);
    out << model_.SerializeAsString();
    return path.string();
  }

 private:
  static void value_info(onnx::ValueInfoProto* info, const std::string& name,
                         const std::vector<int64_t>& shape, int32_t type, bool with_shape = true) {
    info->set_name(name);
    auto* tensor_type = info->mutable_type()->mutable_tensor_type();
    tensor_type->set_elem_type(type);
    if (!with_shape) return;
    auto* s = tensor_type->mutable_shape();
    for (int64_t d : shape) {
      auto* dim = s->add_dim();
      if (d >= 0) {
        dim->set_dim_value(d);
      } else {
        dim->set_dim_param("N");
      }
    }
  }
  onnx::ModelProto model_;
};

inline void set_attribute(onnx::NodeProto& node, const std::string& name, int64_t value) {
  auto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(value);
}
inline void set_attribute(onnx::NodeProto& node, const std::string& name, double value) {
  auto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(float(value));
}
inline void set_attribute(onnx::NodeProto& node, const std::string& name,
                          const std::string& value) {
  auto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(value);
}
inline void set_attribute(onnx::NodeProto& node, const std::string& name,
                          std::initializer_list<int64_t> values) {
  auto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t v : values) a->add_ints(v);
}

// A scratch folder per test, under the build tree's working directory.
inline std::filesystem::path scratch_folder(const std::string& name) {
  auto folder = std::filesystem::temp_directory_path() / ("mpigrad-onnx-test-" + name);
  std::filesystem::remove_all(folder);
  std::filesystem::create_directories(folder);
  return folder;
}

}  // namespace mpigrad::test
