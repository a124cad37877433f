// NodeView's attribute access and the helpers the op families share.
#include "mpigrad/nn/onnx/onnx_ops.h"

#include "mpigrad/core/error.h"
#include "mpigrad/nn/onnx/onnx_file.h"

namespace mpigrad::nn::onnx_ops {

const onnx::AttributeProto* NodeView::find(const std::string& name) const {
  for (const auto& attribute : node_.attribute())
    if (attribute.name() == name) return &attribute;
  return nullptr;
}

bool NodeView::has(const std::string& name) const {
  return find(name) != nullptr;
}

void NodeView::fail(const std::string& message) const {
  core::fail(where_, ": ", message);
}

int64_t NodeView::get_int(const std::string& name, int64_t fallback) const {
  const auto* a = find(name);
  if (a == nullptr) return fallback;
  if (a->type() != onnx::AttributeProto::INT) fail("attribute " + name + " is not an int");
  return a->i();
}

double NodeView::get_float(const std::string& name, double fallback) const {
  const auto* a = find(name);
  if (a == nullptr) return fallback;
  if (a->type() == onnx::AttributeProto::INT) return double(a->i());
  if (a->type() != onnx::AttributeProto::FLOAT) fail("attribute " + name + " is not a float");
  return a->f();
}

std::string NodeView::get_string(const std::string& name, const std::string& fallback) const {
  const auto* a = find(name);
  if (a == nullptr) return fallback;
  if (a->type() != onnx::AttributeProto::STRING) fail("attribute " + name + " is not a string");
  return a->s();
}

std::optional<std::vector<int64_t>> NodeView::get_ints(const std::string& name) const {
  const auto* a = find(name);
  if (a == nullptr) return std::nullopt;
  if (a->type() != onnx::AttributeProto::INTS) fail("attribute " + name + " is not a list of ints");
  return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}

std::optional<std::vector<float>> NodeView::get_floats(const std::string& name) const {
  const auto* a = find(name);
  if (a == nullptr) return std::nullopt;
  if (a->type() != onnx::AttributeProto::FLOATS)
    fail("attribute " + name + " is not a list of floats");
  return std::vector<float>(a->floats().begin(), a->floats().end());
}

std::optional<Tensor> NodeView::get_tensor(const std::string& name) const {
  const auto* a = find(name);
  if (a == nullptr) return std::nullopt;
  if (a->type() != onnx::AttributeProto::TENSOR) fail("attribute " + name + " is not a tensor");
  return tensor_from_proto(a->t(), where_ + " attribute " + name);
}

std::vector<int64_t> host_ints(const Tensor& tensor) {
  if (tensor.dtype() == core::kInt64)
    return tensor.to(core::kCPU).contiguous().to_vector<int64_t>();
  return tensor.detach().to(core::kCPU, core::kInt64).contiguous().to_vector<int64_t>();
}

std::vector<double> host_doubles(const Tensor& tensor) {
  return tensor.detach().to(core::kCPU, core::kFloat64).contiguous().to_vector<double>();
}

Tensor on_device_of(const Tensor& tensor, const Tensor& like) {
  if (!tensor.defined() || !like.defined() || tensor.device() == like.device()) return tensor;
  return tensor.to(like.device());
}

int64_t wrap_axis(int64_t axis, int64_t rank, const std::string& where) {
  const int64_t wrapped = axis < 0 ? axis + rank : axis;
  MPIGRAD_CHECK(wrapped >= 0 && wrapped < std::max<int64_t>(rank, 1), where, ": axis ", axis,
                " is out of range for a tensor of rank ", rank);
  return wrapped;
}

Tensor int64_vector(const std::vector<int64_t>& values) {
  return Tensor::from_vector(values, core::Shape{int64_t(values.size())});
}

}  // namespace mpigrad::nn::onnx_ops
