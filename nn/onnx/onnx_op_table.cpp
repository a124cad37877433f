#include "mpigrad/nn/onnx/onnx_op_table.h"

#include "mpigrad/core/error.h"
#include "mpigrad/nn/onnx/onnx_file.h"

namespace mpigrad::nn {

bool onnx_op_supported(const std::string& op_type, int64_t opset) {
  return opset >= kOnnxMinOpset && opset <= kOnnxMaxOpset &&
         onnx_ops::op_table().find(op_type) != nullptr;
}

namespace onnx_ops {

OpTable::Row OpTable::add(const std::string& op_type,
                          std::variant<OpBuilder, SequenceBuilder> build) {
  OpInfo row;
  row.build = std::move(build);
  auto [it, added] = rows_.emplace(op_type, std::move(row));
  MPIGRAD_CHECK(added, "ONNX op table: ", op_type, " has two rows");
  return Row(it->second);
}

const OpInfo* OpTable::find(const std::string& op_type) const {
  const auto it = rows_.find(op_type);
  return it == rows_.end() ? nullptr : &it->second;
}

const OpTable& op_table() {
  static const OpTable table = [] {
    OpTable t;
    add_math_ops(t);
    add_nn_ops(t);
    add_shape_ops(t);
    add_scatter_ops(t);
    add_sequence_ops(t);
    return t;
  }();
  return table;
}

}  // namespace onnx_ops
}  // namespace mpigrad::nn
