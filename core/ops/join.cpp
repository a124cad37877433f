#include "mpigrad/core/ops/join.h"

#include "mpigrad/core/ops/op_support.h"
#include "mpigrad/core/profiler.h"

namespace mpigrad::core {

namespace {

// Gradient of cat: each input gets its slice of the incoming gradient.
struct CatBackward final : Node {
  int dim;
  std::vector<int64_t> extents;
  CatBackward(int d, std::vector<int64_t> e) : dim(d), extents(std::move(e)) {}
  const char* name() const override { return "CatBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    int64_t start = 0;
    for (size_t i = 0; i < extents.size(); ++i) {
      if (next[i]) grads[i] = grad.slice(dim, start, start + extents[i]);
      start += extents[i];
    }
  }
};

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim_in) {
  ProfileSpan span("cat");
  MPIGRAD_CHECK(!tensors.empty(), "cat: expected at least one tensor");
  const Tensor& first = tensors[0];
  MPIGRAD_CHECK(first.defined(), "cat: tensor 0 is undefined");
  MPIGRAD_CHECK(first.dim() > 0, "cat: zero-dimensional tensors cannot be concatenated");
  int dim = wrap_dim(dim_in, first.dim(), "cat");
  Shape shape = first.shape();
  shape[dim] = 0;
  std::vector<int64_t> extents;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    MPIGRAD_CHECK(t.defined(), "cat: tensor ", i, " is undefined");
    MPIGRAD_CHECK(t.dtype() == first.dtype(), "cat: tensor ", i, " is ", t.dtype(),
                  " but tensor 0 is ", first.dtype());
    MPIGRAD_CHECK(t.device() == first.device(), "cat: tensor ", i, " is on ", t.device(),
                  " but tensor 0 is on ", first.device());
    bool compatible = t.dim() == first.dim();
    for (int d = 0; compatible && d < t.dim(); ++d) {
      if (d != dim && t.shape()[d] != first.shape()[d]) compatible = false;
    }
    MPIGRAD_CHECK(compatible, "cat: tensor ", i, " has shape ", t.shape(),
                  ", which does not match tensor 0's ", first.shape(), " outside dim ", dim);
    extents.push_back(t.shape()[dim]);
    shape[dim] += t.shape()[dim];
  }
  Tensor out = detail::empty_on(shape, first.dtype(), first.device());
  Backend& backend = backend_for(first.device());
  int64_t start = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    Tensor window = out.detach().slice(dim, start, start + extents[i]);
    if (window.numel() > 0) {
      StridedLoop loop = detail::make_loop(window.shape(), {&window, &tensors[i]});
      backend.copy(out.dtype(), tensors[i].dtype(), loop, window.data_ptr(), tensors[i].data_ptr());
    }
    start += extents[i];
  }
  if (any_requires_grad(tensors)) {
    set_history(out, std::make_shared<CatBackward>(dim, extents), tensors);
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim_in) {
  ProfileSpan span("stack");
  MPIGRAD_CHECK(!tensors.empty(), "stack: expected at least one tensor");
  MPIGRAD_CHECK(tensors[0].defined(), "stack: tensor 0 is undefined");
  int dim = wrap_dim(dim_in, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> expanded;
  expanded.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    MPIGRAD_CHECK(tensors[i].defined() && tensors[i].shape() == tensors[0].shape(),
                  "stack: tensor ", i, " has shape ",
                  tensors[i].defined() ? tensors[i].shape().str() : "undefined",
                  " but tensor 0 has ", tensors[0].shape(), "; stack needs equal shapes");
    expanded.push_back(tensors[i].unsqueeze(dim));
  }
  return cat(expanded, dim);
}

}  // namespace mpigrad::core
