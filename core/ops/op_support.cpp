#include "mpigrad/core/ops/op_support.h"

namespace mpigrad::core::detail {

namespace {

StridedLoop flat_loop(int64_t numel, int num_operands) {
  StridedLoop loop;
  loop.ndim = 1;
  loop.size[0] = numel;
  for (int op = 0; op < num_operands; ++op) loop.stride[op][0] = 1;
  return loop;
}

}  // namespace

// Both returns are prvalues, so the 328-byte loop is built in the caller's slot, not copied
// (a named `return loop` beside `return coalesced(...)` defeats that; it showed in op overhead).
StridedLoop make_loop(const Shape& shape, std::initializer_list<const Tensor*> operands) {
  const int num_operands = int(operands.size());
  // The common case, every operand dense with the full shape, is one flat loop.
  bool all_dense = true;
  for (const Tensor* operand : operands) {
    if (!(operand->shape() == shape) || !operand->is_contiguous()) {
      all_dense = false;
      break;
    }
  }
  if (all_dense) return flat_loop(shape.numel(), num_operands);
  StridedLoop loop;
  // Align every operand's strides to `shape` (broadcast dims get 0), then merge.
  loop.ndim = shape.size();
  for (int d = 0; d < shape.size(); ++d) {
    loop.size[d] = shape[d];
    int op = 0;
    for (const Tensor* operand : operands) {
      int operand_dim = d - (shape.size() - operand->dim());
      bool broadcast = operand_dim < 0 || operand->shape()[operand_dim] == 1;
      loop.stride[op++][d] = broadcast ? 0 : operand->strides()[operand_dim];
    }
  }
  return kernels::coalesced(loop, num_operands);
}

void check_same_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* tensor : tensors) {
    if (!tensor->defined()) continue;
    if (first == nullptr) {
      first = tensor;
    } else {
      MPIGRAD_CHECK(tensor->device() == first->device(), op, ": tensors are on different devices (",
                    first->device(), " and ", tensor->device(), ")");
    }
  }
}

void check_floating(const char* op, const Tensor& tensor) {
  MPIGRAD_CHECK(is_floating(tensor.dtype()), op, ": expected a floating-point tensor, got ",
                tensor.dtype());
}

}  // namespace mpigrad::core::detail
