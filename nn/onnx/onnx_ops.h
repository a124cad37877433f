// What an ONNX op's builder works with: the node it compiles (NodeView, typed attribute access),
// the function it returns for each forward (OpFunction, or SequenceFunction for sequence ops)
// and the helpers the op families share. The ops themselves, one row each, are the table of
// nn/onnx/onnx_op_table.h.
//
// Internal to nn/onnx. The op families live in onnx_ops_math.cpp (elementwise, activations,
// Gemm/MatMul, reductions, softmax), onnx_ops_nn.cpp (convolution, pooling, normalization,
// dropout), onnx_ops_shape.cpp (shape arithmetic, data movement, plumbing), onnx_ops_scatter.cpp
// (gathering and scattering by index tuples) and onnx_ops_sequence.cpp (sequences of tensors). Every op runs on core ops, so autograd, devices
// and dtypes come from core. Integer tensors (shapes, indices) never require grad, which is what
// keeps shape arithmetic a host-side constant computation.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "mpigrad/core/rng.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::nn::onnx_ops {

using core::Tensor;

// What a node's function sees at run time besides its inputs.
struct RunContext {
  bool training = false;
  core::Generator* generator = nullptr;  // Dropout's, owned by the model
};

// inputs[i] is undefined where the node leaves an optional input empty.
using OpFunction =
    std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs, RunContext& context)>;

// A node as the builder sees it, with typed attribute access. Errors name the node (`where`).
class NodeView {
 public:
  NodeView(const onnx::NodeProto& node, int64_t opset, std::string where)
      : node_(node), opset_(opset), where_(std::move(where)) {}
  const onnx::NodeProto& proto() const { return node_; }
  int64_t opset() const { return opset_; }
  const std::string& where() const { return where_; }
  int num_inputs() const { return node_.input_size(); }
  int num_outputs() const { return node_.output_size(); }

  bool has(const std::string& name) const;
  int64_t get_int(const std::string& name, int64_t fallback) const;
  double get_float(const std::string& name, double fallback) const;
  std::string get_string(const std::string& name, const std::string& fallback) const;
  std::optional<std::vector<int64_t>> get_ints(const std::string& name) const;
  std::optional<std::vector<float>> get_floats(const std::string& name) const;
  std::optional<Tensor> get_tensor(const std::string& name) const;

  [[noreturn]] void fail(const std::string& message) const;

 private:
  const onnx::AttributeProto* find(const std::string& name) const;
  const onnx::NodeProto& node_;
  int64_t opset_;
  std::string where_;
};

using OpBuilder = std::function<OpFunction(const NodeView& node)>;

// Sequence ops (nn/onnx/onnx_ops_sequence.cpp) read and write the graph's state directly: a
// sequence value is a std::vector<Tensor> beside the tensors.
struct SequenceState {
  std::vector<Tensor>& values;
  std::vector<std::vector<Tensor>>& sequences;
  std::vector<bool>& is_sequence;
  // Writing to id -1 (an output the graph leaves unnamed) does nothing.
  void set(int id, std::vector<Tensor> items) {
    if (id < 0) return;
    sequences[size_t(id)] = std::move(items);
    is_sequence[size_t(id)] = true;
  }
  void set_tensor(int id, Tensor tensor) {
    if (id >= 0) values[size_t(id)] = std::move(tensor);
  }
};
using SequenceFunction = std::function<void(const std::vector<int>& inputs,
                                            const std::vector<int>& outputs, SequenceState& state)>;

// ---- Helpers shared by the op families --------------------------------------------------
// The values of a (small, integer or floating) tensor on the host, as int64 / double.
std::vector<int64_t> host_ints(const Tensor& tensor);
std::vector<double> host_doubles(const Tensor& tensor);
// `tensor` on `like`'s device (constants live on the host until a node meets device data).
Tensor on_device_of(const Tensor& tensor, const Tensor& like);
// Wraps a possibly negative axis into [0, rank); fails naming the node when out of range.
int64_t wrap_axis(int64_t axis, int64_t rank, const std::string& where);
// Pads every dim d by begin[d] before and end[d] after (negative values crop): mode "constant"
// (with `value`), "reflect" or "edge". Differentiable in x.
Tensor pad_tensor(const Tensor& x, const std::vector<int64_t>& begin,
                  const std::vector<int64_t>& end, const std::string& mode, double value,
                  const std::string& where);
// A host int64 tensor of shape [values.size()].
Tensor int64_vector(const std::vector<int64_t>& values);

}  // namespace mpigrad::nn::onnx_ops
