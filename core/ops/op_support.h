// Shared plumbing of the op implementations in core/ops/*.cpp: loop descriptions for the
// kernels, output allocation, and recording a backward node. Not part of the public API.
#pragma once

#include <initializer_list>
#include <memory>
#include <utility>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/backend.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::core::detail {

// The StridedLoop over `shape` for operands that broadcast to it (operand 0 is the output).
// Adjacent dims that are contiguous for every operand are merged, so dense tensors reach the
// kernels as one flat loop.
StridedLoop make_loop(const Shape& shape, std::initializer_list<const Tensor*> operands);

// A fresh contiguous tensor like `like` (device), with `shape` and `dtype`.
inline Tensor empty_on(const Shape& shape, DType dtype, Device device) {
  return Tensor::empty(shape, TensorOptions(dtype).device(device));
}

// Throws unless every tensor lives on the same device; names the op and both devices.
void check_same_device(const char* op, std::initializer_list<const Tensor*> tensors);
// Throws unless the dtype is a floating type; names the op.
void check_floating(const char* op, const Tensor& tensor);

// Records a node of type NodeT (built from args) as the history of `result` when any input
// requires grad and grad mode is on. Returns the node (null when nothing was recorded) so the
// caller can save tensors into it.
template <typename NodeT, typename... Args>
std::shared_ptr<NodeT> record(const Tensor& result, std::initializer_list<const Tensor*> inputs,
                              Args&&... args) {
  if (!any_requires_grad(inputs)) return nullptr;
  auto node = std::make_shared<NodeT>(std::forward<Args>(args)...);
  set_history(result, node, inputs);
  return node;
}

// out = a op b written into an existing tensor (no autograd): the in-place ops' fast path.
// a and b must broadcast to out's shape; they are converted to out's dtype.
void binary_into(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b,
                 const char* name);

// out-of-place copy of `source` into a new tensor of `dtype` on the same device (no autograd).
Tensor copy_as(const Tensor& source, DType dtype);

}  // namespace mpigrad::core::detail
