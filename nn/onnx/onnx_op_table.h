// The ONNX ops OnnxModel runs, one row per op type: how a node is compiled, how many inputs it
// takes, which of them are settings, whether it may run once at load, and whether it works on
// sequences. Every other fact the loader knows about an op is derived from its row, so adding
// an op touches one row (MLX's primitives.h and PyTorch's derivatives.yaml keep ops the same
// way).
//
// Internal to nn/onnx. The rows are written beside their builders: onnx_ops_math.cpp,
// onnx_ops_nn.cpp, onnx_ops_shape.cpp, onnx_ops_scatter.cpp and onnx_ops_sequence.cpp.
#pragma once

#include <climits>
#include <functional>
#include <map>
#include <string>
#include <variant>

#include "mpigrad/nn/onnx/onnx_ops.h"

namespace mpigrad::nn::onnx_ops {

// A sequence op's compiler: its function reads and writes the graph's state (SequenceState)
// instead of returning tensors, because its inputs or outputs are sequences.
using SequenceBuilder = std::function<SequenceFunction(const NodeView& node)>;

// No upper bound on the inputs (Concat, Sum, SequenceConstruct).
inline constexpr int kVariadic = INT_MAX;
// An op all of whose inputs are data.
inline constexpr int kNoSettings = INT_MAX;

// How many inputs a node names, counting the empty names of skipped optional inputs: the
// fewest and the most any opset from kOnnxMinOpset to kOnnxMaxOpset allows.
struct InputCount {
  int min = 1;
  int max = 1;
};

struct OpInfo {
  // A tensor op compiles to an OpFunction; a sequence op to a SequenceFunction.
  std::variant<OpBuilder, SequenceBuilder> build;
  InputCount inputs;
  // Inputs from this index on are settings, read as values rather than data a gradient could
  // flow to (Resize's scales, Clip's bounds, Dropout's ratio, Reshape's shape): a floating
  // initializer read only there stays a constant instead of becoming a parameter.
  int settings_from = kNoSettings;
  // Whether a node whose inputs are all constant may run once at load instead of at every
  // forward. False for ops whose result depends on train()/eval(), on a generator's state or
  // on sequences (which live for one forward).
  bool foldable = true;

  // ---- Derivatives ------------------------------------------------------------------------
  // Reserved for each op's own derivative rules (a backward written in differentiable core
  // ops, so that its second derivative exists), kept in the row as derivatives.yaml keeps
  // them. Today every op differentiates through the core ops its builder runs.

  bool is_sequence_op() const { return std::holds_alternative<SequenceBuilder>(build); }
  bool is_setting_input(int index) const { return index >= settings_from; }
};

class OpTable {
 public:
  // Writes one row, one statement per op: the defaults are one input, all of it data, and
  // foldable; e.g. t.add("Clip", clip).inputs(1, 3).settings_from(1).
  class Row {
   public:
    explicit Row(OpInfo& info) : info_(info) {}
    Row& inputs(int min, int max) {
      info_.inputs = {min, max};
      return *this;
    }
    Row& settings_from(int index) {
      info_.settings_from = index;
      return *this;
    }
    Row& not_foldable() {
      info_.foldable = false;
      return *this;
    }

   private:
    OpInfo& info_;
  };

  // Adds the row of `op_type`; a second row for the same op is an error.
  Row add(const std::string& op_type, std::variant<OpBuilder, SequenceBuilder> build);
  // The row of `op_type` (default domain), or nullptr when OnnxModel does not run it.
  const OpInfo* find(const std::string& op_type) const;
  const std::map<std::string, OpInfo>& rows() const { return rows_; }

 private:
  std::map<std::string, OpInfo> rows_;
};

// Every row, built once.
const OpTable& op_table();

// The rows of each family of ops, next to their builders.
void add_math_ops(OpTable& table);
void add_nn_ops(OpTable& table);
void add_shape_ops(OpTable& table);
void add_scatter_ops(OpTable& table);
void add_sequence_ops(OpTable& table);

}  // namespace mpigrad::nn::onnx_ops
