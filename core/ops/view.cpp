// View ops: new shape/strides/offset over the same storage, each with its backward.
#include <algorithm>

#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/ops/op_support.h"

namespace mpigrad::core {

namespace {

Tensor make_view(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>(base.storage(), shape, strides, offset, base.dtype());
  impl->is_view = true;
  return Tensor(std::move(impl));
}

struct ReshapeBackward final : Node {
  Shape input_shape;
  explicit ReshapeBackward(Shape shape) : input_shape(shape) {}
  const char* name() const override { return "ReshapeBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    grads[0] = grad.reshape(input_shape);
  }
};

struct PermuteBackward final : Node {
  std::vector<int64_t> inverse;
  explicit PermuteBackward(std::vector<int64_t> inv) : inverse(std::move(inv)) {}
  const char* name() const override { return "PermuteBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    grads[0] = grad.permute(inverse);
  }
};

// Gradient of slice and select: the incoming gradient placed into zeros of the input's shape.
struct SliceBackward final : Node {
  Shape input_shape;
  int dim;
  int64_t start, end, step;
  bool removes_dim;  // select
  SliceBackward(Shape shape, int d, int64_t s, int64_t e, int64_t st, bool removes)
      : input_shape(shape), dim(d), start(s), end(e), step(st), removes_dim(removes) {}
  const char* name() const override { return removes_dim ? "SelectBackward" : "SliceBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    if (grad_enabled()) {
      // create_graph: the window's positions added into zeros by an op that records a graph
      // (its own gradient is this slice again).
      const int64_t count = removes_dim ? 1 : grad.shape()[dim];
      Tensor positions = arange(count, TensorOptions(kInt64).device(grad.device()));
      {
        NoGradGuard no_grad;
        positions = positions * scalar_like(double(step), positions) +
                    scalar_like(double(start), positions);
      }
      Tensor base = zeros(input_shape, TensorOptions(grad.dtype()).device(grad.device()));
      grads[0] = index_add(base, dim, positions, removes_dim ? grad.unsqueeze(dim) : grad);
      return;
    }
    // One pass where the backend has the kernel: the zeros and the window written together.
    Tensor full_grad =
        Tensor::empty(input_shape, TensorOptions(grad.dtype()).device(grad.device()));
    Backend& backend = backend_for(grad.device());
    if (backend.supports_slice_backward()) {
      const Tensor dense = grad.contiguous();
      backend.slice_backward(grad.dtype(), window(dense), full_grad.data_ptr(), dense.data_ptr());
    } else {
      full_grad.zero_();
      full_grad.slice(dim, start, end, step).copy_(removes_dim ? grad.unsqueeze(dim) : grad);
    }
    grads[0] = std::move(full_grad);
  }

  // The input as [outer, extent, inner] around `dim`, and where the slice's gradient goes in it.
  kernels::SliceWindow window(const Tensor& grad) const {
    kernels::SliceWindow w;
    for (int d = 0; d < dim; ++d) w.outer *= input_shape[d];
    w.extent = input_shape[dim];
    for (int d = dim + 1; d < input_shape.size(); ++d) w.inner *= input_shape[d];
    w.start = start;
    w.step = step;
    w.count = removes_dim ? 1 : grad.shape()[dim];
    return w;
  }
};

struct ExpandBackward final : Node {
  Shape input_shape;
  explicit ExpandBackward(Shape shape) : input_shape(shape) {}
  const char* name() const override { return "ExpandBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    grads[0] = sum_to(grad, input_shape);
  }
};

// Resolves one -1 extent and checks the element count.
Shape infer_shape(const Shape& requested, const Shape& current, const char* op) {
  int64_t numel = current.numel();
  Shape shape = requested;
  int inferred = -1;
  int64_t known = 1;
  for (int d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      MPIGRAD_CHECK(inferred < 0, op, ": only one dimension can be -1 in ", requested);
      inferred = d;
    } else {
      MPIGRAD_CHECK(shape[d] >= 0, op, ": invalid extent ", shape[d], " in ", requested);
      known *= shape[d];
    }
  }
  if (inferred >= 0) {
    MPIGRAD_CHECK(known != 0 && numel % known == 0, op, ": shape ", requested,
                  " is invalid for a tensor of shape ", current, " (", numel, " elements)");
    shape[inferred] = numel / known;
  }
  MPIGRAD_CHECK(shape.numel() == numel, op, ": shape ", requested,
                " is invalid for a tensor of shape ", current, " (", numel, " elements)");
  return shape;
}

// Strides that express `shape` over the memory of (old_shape, old_strides) without a copy, or
// false when the old layout cannot be regrouped that way. Dims are matched in groups whose
// elements are evenly spaced in memory; each new dim must fall inside one group.
bool view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& shape,
                  Shape& strides) {
  strides = shape;
  if (old_shape.numel() == 0 || old_shape.empty()) {
    strides = contiguous_strides(shape);
    return true;
  }
  int new_d = shape.size() - 1;
  int64_t group_stride = old_strides.back();
  int64_t old_count = 1;
  int64_t new_count = 1;
  for (int d = old_shape.size() - 1; d >= 0; --d) {
    old_count *= old_shape[d];
    bool group_ends =
        d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != old_count * group_stride);
    if (!group_ends) continue;
    while (new_d >= 0 && (new_count < old_count || shape[new_d] == 1)) {
      strides[new_d] = new_count * group_stride;
      new_count *= shape[new_d];
      --new_d;
    }
    if (new_count != old_count) return false;
    if (d > 0) {
      group_stride = old_strides[d - 1];
      old_count = 1;
      new_count = 1;
    }
  }
  return new_d == -1;
}

}  // namespace

Tensor Tensor::view(const Shape& requested) const {
  Shape shape = infer_shape(requested, this->shape(), "view");
  Shape new_strides;
  MPIGRAD_CHECK(view_strides(this->shape(), strides(), shape, new_strides), "view: shape ",
                requested, " is not compatible with the layout of a tensor of shape ",
                this->shape(), " and strides ", strides(), "; use reshape() (which copies)");
  Tensor out = make_view(*this, shape, new_strides, offset());
  detail::record<ReshapeBackward>(out, {this}, this->shape());
  return out;
}

Tensor Tensor::reshape(const Shape& requested) const {
  Shape shape = infer_shape(requested, this->shape(), "reshape");
  Shape new_strides;
  if (view_strides(this->shape(), strides(), shape, new_strides)) return view(shape);
  return contiguous().view(shape);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  MPIGRAD_CHECK(int(dims.size()) == dim(), "permute: got ", dims.size(), " dims for a ", dim(),
                "-d tensor");
  Shape shape, new_strides;
  std::vector<int64_t> inverse(dims.size(), -1);
  for (size_t i = 0; i < dims.size(); ++i) {
    int d = wrap_dim(dims[i], dim(), "permute");
    MPIGRAD_CHECK(inverse[size_t(d)] < 0, "permute: dim ", dims[i], " appears twice");
    inverse[size_t(d)] = int64_t(i);
    shape.push_back(this->shape()[d]);
    new_strides.push_back(strides()[d]);
  }
  Tensor out = make_view(*this, shape, new_strides, offset());
  detail::record<PermuteBackward>(out, {this}, inverse);
  return out;
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  std::vector<int64_t> order(static_cast<size_t>(dim()));
  for (int d = 0; d < dim(); ++d) order[size_t(d)] = d;
  std::swap(order[size_t(wrap_dim(dim0, dim(), "transpose"))],
            order[size_t(wrap_dim(dim1, dim(), "transpose"))]);
  return permute(order);
}

Tensor Tensor::t() const {
  MPIGRAD_CHECK(dim() == 2, "t(): expected a 2-d tensor, got shape ", shape());
  return transpose(0, 1);
}

Tensor Tensor::slice(int64_t dim_in, int64_t start, int64_t end, int64_t step) const {
  int d = wrap_dim(dim_in, dim(), "slice");
  MPIGRAD_CHECK(step > 0, "slice: step must be positive, got ", step);
  int64_t extent = shape()[d];
  auto clamp_index = [extent](int64_t i) {
    if (i < 0) i += extent;
    return std::clamp<int64_t>(i, 0, extent);
  };
  start = clamp_index(start);
  end = std::max(clamp_index(end), start);
  Shape shape = this->shape();
  shape[d] = (end - start + step - 1) / step;
  Shape new_strides = strides();
  new_strides[d] *= step;
  Tensor out = make_view(*this, shape, new_strides, offset() + start * strides()[d]);
  detail::record<SliceBackward>(out, {this}, this->shape(), d, start, end, step, false);
  return out;
}

Tensor Tensor::narrow(int64_t dim_in, int64_t start, int64_t length) const {
  int d = wrap_dim(dim_in, dim(), "narrow");
  MPIGRAD_CHECK(start >= 0 && length >= 0 && start + length <= shape()[d], "narrow: [", start, ", ",
                start + length, ") is outside dim ", d, " of extent ", shape()[d]);
  return slice(d, start, start + length);
}

Tensor Tensor::select(int64_t dim_in, int64_t index) const {
  int d = wrap_dim(dim_in, dim(), "select");
  int64_t extent = shape()[d];
  MPIGRAD_CHECK(index >= -extent && index < extent, "select: index ", index,
                " is out of range for dim ", d, " of extent ", extent);
  if (index < 0) index += extent;
  Shape shape = this->shape();
  Shape new_strides = strides();
  shape.erase(d);
  new_strides.erase(d);
  Tensor out = make_view(*this, shape, new_strides, offset() + index * strides()[d]);
  detail::record<SliceBackward>(out, {this}, this->shape(), d, index, index + 1, 1, true);
  return out;
}

Tensor Tensor::unsqueeze(int64_t dim_in) const {
  int d = wrap_dim(dim_in, dim() + 1, "unsqueeze");
  Shape shape = this->shape();
  Shape new_strides = strides();
  int64_t stride = d < dim() ? strides()[d] * this->shape()[d] : 1;
  shape.insert(d, 1);
  new_strides.insert(d, stride);
  Tensor out = make_view(*this, shape, new_strides, offset());
  detail::record<ReshapeBackward>(out, {this}, this->shape());
  return out;
}

Tensor Tensor::squeeze(int64_t dim_in) const {
  int d = wrap_dim(dim_in, dim(), "squeeze");
  if (shape()[d] != 1) return *this;  // as in PyTorch, a dim of another extent is left alone
  Shape shape = this->shape();
  Shape new_strides = strides();
  shape.erase(d);
  new_strides.erase(d);
  Tensor out = make_view(*this, shape, new_strides, offset());
  detail::record<ReshapeBackward>(out, {this}, this->shape());
  return out;
}

Tensor Tensor::squeeze() const {
  Shape shape, new_strides;
  for (int d = 0; d < dim(); ++d) {
    if (this->shape()[d] == 1) continue;
    shape.push_back(this->shape()[d]);
    new_strides.push_back(strides()[d]);
  }
  Tensor out = make_view(*this, shape, new_strides, offset());
  detail::record<ReshapeBackward>(out, {this}, this->shape());
  return out;
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  int start = wrap_dim(start_dim, dim(), "flatten");
  int end = wrap_dim(end_dim, dim(), "flatten");
  MPIGRAD_CHECK(start <= end, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim);
  Shape shape;
  for (int d = 0; d < start; ++d) shape.push_back(this->shape()[d]);
  int64_t merged = 1;
  for (int d = start; d <= end; ++d) merged *= this->shape()[d];
  shape.push_back(merged);
  for (int d = end + 1; d < dim(); ++d) shape.push_back(this->shape()[d]);
  return reshape(shape);
}

Tensor Tensor::expand(const Shape& requested) const {
  MPIGRAD_CHECK(requested.size() >= dim(), "expand: cannot expand shape ", shape(), " to ",
                requested, " (fewer dims)");
  int leading = requested.size() - dim();
  Shape shape, new_strides;
  for (int d = 0; d < requested.size(); ++d) {
    int source = d - leading;
    int64_t have = source >= 0 ? this->shape()[source] : 1;
    int64_t want = requested[d] == -1 ? have : requested[d];
    MPIGRAD_CHECK(source >= 0 || requested[d] != -1, "expand: -1 is not allowed for new dim ", d,
                  " in ", requested);
    MPIGRAD_CHECK(have == want || have == 1, "expand: shape ", this->shape(),
                  " cannot be expanded to ", requested, " (dim ", d, ": ", have, " vs ", want, ")");
    shape.push_back(want);
    new_strides.push_back(source >= 0 && have == want ? strides()[source] : 0);
  }
  Tensor out = make_view(*this, shape, new_strides, offset());
  detail::record<ExpandBackward>(out, {this}, this->shape());
  return out;
}

}  // namespace mpigrad::core
