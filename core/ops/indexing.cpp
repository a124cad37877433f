#include "mpigrad/core/ops/indexing.h"

#include <algorithm>

#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/op_support.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/profiler.h"

namespace mpigrad::core {

namespace {

// Dense Int64 indices on `device`; integer dtypes only.
Tensor prepare_index(const Tensor& index, Device device, const char* op) {
  MPIGRAD_CHECK(index.defined(), op, ": undefined index tensor");
  MPIGRAD_CHECK(index.dtype() == kInt64 || index.dtype() == kInt32 || index.dtype() == kUInt8, op,
                ": indices must be an integer tensor (int64 or int32), got ", index.dtype());
  MPIGRAD_CHECK(index.device() == device, op, ": indices are on ", index.device(),
                " but the source is on ", device);
  NoGradGuard no_grad;
  return index.to(kInt64).contiguous();
}

// Turns a kernel's "first bad position" into an error naming the value and the valid range.
void check_index_result(int64_t bad_position, const Tensor& index, int64_t extent, int dim,
                        const char* op) {
  if (bad_position < 0) return;
  int64_t value = index.reshape({-1}).select(0, bad_position).item<int64_t>();
  fail(op, ": index ", value, " (at position ", bad_position, ") is out of range for dim ", dim,
       " of extent ", extent, "; valid indices are 0..", extent - 1);
}

struct Layout3 {
  int64_t outer = 1, extent = 1, inner = 1;
};
Layout3 split_at(const Shape& shape, int dim) {
  Layout3 l;
  for (int d = 0; d < shape.size(); ++d) {
    if (d < dim)
      l.outer *= shape[d];
    else if (d == dim)
      l.extent = shape[d];
    else
      l.inner *= shape[d];
  }
  return l;
}

// Gradient of index_select, embedding and gather: the incoming gradient added back at the
// positions that were read (index_add for one index list, scatter_add for a per-element one).
struct IndexBackward final : Node {
  Shape input_shape;
  int dim;
  bool per_element;  // gather
  SavedTensor index;
  IndexBackward(Shape shape, int d, bool element)
      : input_shape(shape), dim(d), per_element(element) {}
  const char* name() const override {
    return per_element ? "GatherBackward" : "IndexSelectBackward";
  }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    const Tensor idx = index.get(*this);
    if (grad_enabled()) {  // create_graph: the same sum as an op that records its own graph
      Tensor base = zeros(input_shape, TensorOptions(grad.dtype()).device(grad.device()));
      if (per_element) {
        grads[0] = scatter_add(base, dim, idx, grad);
      } else {
        Shape rows = input_shape;  // embedding's gradient comes as indices.shape + [dim]
        rows[dim] = idx.numel();
        grads[0] = index_add(base, dim, idx, grad.reshape(rows));
      }
      return;
    }
    Tensor source = grad.contiguous();
    Tensor result = zeros(input_shape, TensorOptions(grad.dtype()).device(grad.device()));
    Layout3 l = split_at(input_shape, dim);
    Backend& backend = backend_for(grad.device());
    if (per_element) {
      backend.scatter_add(grad.dtype(), l.outer, l.extent, l.inner, idx.data<int64_t>(),
                          idx.shape()[dim], result.data_ptr(), source.data_ptr());
    } else {
      backend.index_add(grad.dtype(), l.outer, l.extent, l.inner, idx.data<int64_t>(), idx.numel(),
                        result.data_ptr(), source.data_ptr());
    }
    grads[0] = std::move(result);
  }
  void release_saved() override { index.release(); }
};

// scatter_add and index_add: the base's gradient passes through, the source's is read back from
// the positions it was added at.
struct AddAtBackward final : Node {
  int dim;
  bool per_element;  // scatter_add
  SavedTensor index;
  AddAtBackward(int d, bool element) : dim(d), per_element(element) {}
  const char* name() const override {
    return per_element ? "ScatterAddBackward" : "IndexAddBackward";
  }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    if (next[0]) grads[0] = grad;
    if (next[1]) {
      const Tensor idx = index.get(*this);
      grads[1] = per_element ? gather(grad, dim, idx) : index_select(grad, dim, idx);
    }
  }
  void release_saved() override { index.release(); }
};

// The shared body of scatter_add and index_add.
Tensor add_at(const Tensor& base, int64_t dim_in, const Tensor& index_in, const Tensor& src,
              bool per_element) {
  const char* op = per_element ? "scatter_add" : "index_add";
  MPIGRAD_CHECK(base.defined() && src.defined(), op, ": undefined operand");
  detail::check_same_device(op, {&base, &src});
  MPIGRAD_CHECK(base.dim() >= 1, op, ": the base must have at least one dim, got a scalar");
  const int dim = wrap_dim(dim_in, base.dim(), op);
  Tensor index = prepare_index(index_in, base.device(), op);
  MPIGRAD_CHECK(src.dim() == base.dim(), op, ": the source has shape ", src.shape(),
                " but must have as many dims as the base ", base.shape());
  for (int d = 0; d < base.dim(); ++d) {
    MPIGRAD_CHECK(d == dim || src.shape()[d] == base.shape()[d], op, ": source shape ", src.shape(),
                  " must match base shape ", base.shape(), " outside dim ", dim);
  }
  int64_t count = 0;
  if (per_element) {
    MPIGRAD_CHECK(index.shape() == src.shape(), op, ": the index has shape ", index.shape(),
                  " but must have the source's shape ", src.shape());
    count = src.shape()[dim];
  } else {
    MPIGRAD_CHECK(index.dim() <= 1 && index.numel() == src.shape()[dim], op, ": ", index.numel(),
                  " indices for a source with ", src.shape()[dim], " entries along dim ", dim);
    count = index.numel();
  }
  const DType dtype = promote_types(base.dtype(), src.dtype());
  Tensor out, source;
  {
    NoGradGuard no_grad;
    out = base.to(dtype).contiguous().clone();
    source = src.to(dtype).contiguous();
  }
  Layout3 l = split_at(out.shape(), dim);
  Backend& backend = backend_for(out.device());
  const int64_t bad =
      out.numel() == 0
          ? -1
          : (per_element
                 ? backend.scatter_add(dtype, l.outer, l.extent, l.inner, index.data<int64_t>(),
                                       count, out.data_ptr(), source.data_ptr())
                 : backend.index_add(dtype, l.outer, l.extent, l.inner, index.data<int64_t>(),
                                     count, out.data_ptr(), source.data_ptr()));
  check_index_result(bad, index, l.extent, dim, op);
  if (auto node = detail::record<AddAtBackward>(out, {&base, &src}, dim, per_element)) {
    node->index = index;
  }
  return out;
}

// scatter_reduce: see indexing.h for what each gradient is. The node keeps base (promoted),
// src and the result, all as the forward saw them.
struct ScatterReduceBackward final : Node {
  int dim;
  ScatterReduceOp op;
  SavedTensor index, base, src, out;
  ScatterReduceBackward(int d, ScatterReduceOp o) : dim(d), op(o) {}
  const char* name() const override { return "ScatterReduceBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    const Tensor idx = index.get(*this);
    const Tensor b = base.get(*this), s = src.get(*this);
    if (op == ScatterReduceOp::Mul) {
      apply_mul(grad, idx, b, s, grads);
      return;
    }
    // The winner of each position, from the values alone: the masks are constants.
    Tensor base_won, src_won;
    {
      NoGradGuard no_grad;
      const Tensor result = out.get(*this).detach().contiguous();
      const Tensor before = b.detach().contiguous(), updates = s.detach().contiguous();
      // No position of src reaches updates.numel(): where it stays, base's own value won.
      Tensor winner = full(result.shape(), double(updates.numel()),
                           TensorOptions(kInt64).device(result.device()));
      const Layout3 l = split_at(result.shape(), dim);
      backend_for(result.device())
          .scatter_winner(result.dtype(), l.outer, l.extent, l.inner, idx.data<int64_t>(),
                          updates.shape()[dim], result.data_ptr(), before.data_ptr(),
                          updates.data_ptr(), winner.data<int64_t>());
      const Tensor positions =
          arange(updates.numel(), TensorOptions(kInt64).device(updates.device()))
              .reshape(updates.shape());
      base_won = ge(winner, scalar_like(double(updates.numel()), winner)).to(grad.dtype());
      src_won = eq(gather(winner, dim, idx), positions).to(grad.dtype());
    }
    if (next[0]) grads[0] = mul(grad, base_won);
    if (next[1]) grads[1] = mul(gather(grad, dim, idx), src_won);
  }
  // d out / d base = the product of the updates, and d out / d src[q] = base times the other
  // updates, written without dividing by a zero so that it is exact to the second order: with
  // P = base times the nonzero updates and Z the sum of the zero updates (0 in value, but its
  // derivative picks them out), a nonzero update's is P / src[q] times 1, Z or 0 for 0, 1 or
  // more zero updates there; a zero update's is P times 1, (Z - src[p]) or 0 for 1, 2 or more.
  void apply_mul(const Tensor& grad, const Tensor& idx, const Tensor& b, const Tensor& s,
                 std::vector<Tensor>& grads) {
    if (next[0]) grads[0] = mul(grad, scatter_reduce(ones_like(b).detach(), dim, idx, s, op));
    if (!next[1]) return;
    Tensor zero, zeros_at;
    {
      NoGradGuard no_grad;
      zero = eq(s, scalar_like(0.0, s));
      const Tensor counts =
          scatter_add(zeros_like(b).detach(), dim, idx, zero.to(b.dtype()).detach());
      zeros_at = gather(counts, dim, idx);
    }
    const auto zeros_are = [&](double n) { return eq(zeros_at, scalar_like(n, zeros_at)); };
    const Tensor ones = ones_like(s).detach(), none = zeros_like(s).detach();
    const Tensor nonzero = where(zero, ones, s);
    const Tensor zero_sum =
        gather(scatter_add(zeros_like(b).detach(), dim, idx, where(zero, s, none)), dim, idx);
    const Tensor g = gather(mul(grad, scatter_reduce(b, dim, idx, nonzero, op)), dim, idx);
    const Tensor of_nonzero = where(zeros_are(0), ones, where(zeros_are(1), zero_sum, none));
    const Tensor of_zero = where(zeros_are(1), ones, where(zeros_are(2), sub(zero_sum, s), none));
    grads[1] = where(zero, mul(g, of_zero), mul(div(g, nonzero), of_nonzero));
  }
  void release_saved() override {
    index.release();
    base.release();
    src.release();
    out.release();
  }
};

// ---- gather_mul_scatter and gather_product: one op, out[t(e)] (+)= a[ia(e)] * b[ib(e)] ----------

// The three index roles, named as the public op calls them, for errors.
struct ProductNames {
  const char* op;
  const char* a_index;
  const char* b_index;
  const char* target;
};

Tensor indexed_product(const Tensor& a, const Tensor& a_index, const Tensor& b,
                       const Tensor& b_index, const Tensor& target, int64_t out_rows, int64_t edges,
                       const ProductNames& names);

// The gradient of out[t(e)] += a[ia(e)] * b[ib(e)] in a is grad[t(e)] * b[ib(e)] added at
// ia(e): the same op with the roles of ia and t swapped, and likewise for b. Written in the op
// itself, so a create_graph backward records it and every order of derivative follows. Only the
// gradients a grad() asks for are computed (the forces of a potential need the positions', not
// the weights').
struct IndexedProductBackward final : Node {
  SavedTensor a, b;
  Tensor a_index, b_index, target;  // int64 [edges], or undefined: e itself
  int64_t edges = 0, a_rows = 0, b_rows = 0;
  const char* name() const override {
    return target.defined() ? "GatherMulScatterBackward" : "GatherProductBackward";
  }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    static constexpr ProductNames kNames{"gather_mul_scatter backward", "index", "index", "index"};
    if (next[1] && next[1]->needed) {
      grads[1] =
          indexed_product(grad, target, a.get(*this), a_index, b_index, b_rows, edges, kNames);
    }
    if (next[0] && next[0]->needed) {
      grads[0] =
          indexed_product(grad, target, b.get(*this), b_index, a_index, a_rows, edges, kNames);
    }
  }
  void release_saved() override {
    a.release();
    b.release();
  }
};

// An index of one row per edge as int64 [edges], or undefined for "e itself" (then the operand
// must have `edges` rows).
Tensor edge_index_of(const Tensor& index, int64_t edges, int64_t rows, Device device,
                     const char* op, const char* role) {
  if (!index.defined()) {
    MPIGRAD_CHECK(rows == edges, op, ": the ", role, " side has ", rows, " rows for ", edges,
                  " edges");
    return Tensor();
  }
  MPIGRAD_CHECK(index.dim() == 1 && index.numel() == edges, op, ": the ", role, " index must be [",
                edges, "] (one entry per edge), got shape ", index.shape());
  return prepare_index(index, device, op);
}

Tensor indexed_product(const Tensor& a_in, const Tensor& a_index_in, const Tensor& b_in,
                       const Tensor& b_index_in, const Tensor& target_in, int64_t out_rows,
                       int64_t edges, const ProductNames& names) {
  const char* op = names.op;
  MPIGRAD_CHECK(a_in.defined() && b_in.defined(), op, ": undefined operand");
  detail::check_same_device(op, {&a_in, &b_in});
  MPIGRAD_CHECK(a_in.dim() >= 1 && b_in.dim() >= 1, op,
                ": the operands must have a row dim, got shapes ", a_in.shape(), " and ",
                b_in.shape());
  MPIGRAD_CHECK(
      a_in.dtype() == b_in.dtype() && (a_in.dtype() == kFloat32 || a_in.dtype() == kFloat64), op,
      ": takes two float32 or two float64 operands, got ", a_in.dtype(), " and ", b_in.dtype());
  Shape out_shape = a_in.shape();
  int64_t width = 1;
  for (int d = 1; d < a_in.dim(); ++d) width *= a_in.shape()[d];
  bool same_rows = a_in.dim() == b_in.dim();
  for (int d = 1; same_rows && d < a_in.dim(); ++d) same_rows = a_in.shape()[d] == b_in.shape()[d];
  MPIGRAD_CHECK(same_rows, op, ": the operands' rows must have one shape, got ", a_in.shape(),
                " and ", b_in.shape());
  const Device device = a_in.device();
  const Tensor a_index =
      edge_index_of(a_index_in, edges, a_in.shape()[0], device, op, names.a_index);
  const Tensor b_index =
      edge_index_of(b_index_in, edges, b_in.shape()[0], device, op, names.b_index);
  Tensor target;
  if (target_in.defined()) {
    MPIGRAD_CHECK(out_rows >= 0, op, ": negative number of output rows ", out_rows);
    target = edge_index_of(target_in, edges, out_rows, device, op, names.target);
  }
  out_shape[0] = target.defined() ? out_rows : edges;
  Tensor a, b, out;
  {
    NoGradGuard no_grad;
    a = a_in.contiguous();
    b = b_in.contiguous();
    out = target.defined() ? zeros(out_shape, TensorOptions(a.dtype()).device(device))
                           : detail::empty_on(out_shape, a.dtype(), device);
  }
  kernels::GatherMulScatterArgs args;
  args.edges = edges;
  args.width = width;
  args.a_index = a_index.defined() ? a_index.data<int64_t>() : nullptr;
  args.a_rows = a.shape()[0];
  args.a = a.data_ptr();
  args.b_index = b_index.defined() ? b_index.data<int64_t>() : nullptr;
  args.b_rows = b.shape()[0];
  args.b = b.data_ptr();
  args.target = target.defined() ? target.data<int64_t>() : nullptr;
  args.out_rows = out_shape[0];
  args.out = out.data_ptr();
  const int64_t bad = backend_for(device).gather_mul_scatter(a.dtype(), args);
  if (bad >= 0) {
    const int64_t which = bad / std::max<int64_t>(edges, 1),
                  position = bad % std::max<int64_t>(edges, 1);
    const Tensor& index = which == 0 ? a_index : which == 1 ? b_index : target;
    const char* role = which == 0 ? names.a_index : which == 1 ? names.b_index : names.target;
    const int64_t rows = which == 0 ? args.a_rows : which == 1 ? args.b_rows : args.out_rows;
    fail(op, ": ", role, " index ", index.select(0, position).item<int64_t>(), " (at position ",
         position, ") is out of range for ", rows, " rows; valid indices are 0..", rows - 1);
  }
  if (auto node = detail::record<IndexedProductBackward>(out, {&a_in, &b_in})) {
    node->a = a_in;
    node->b = b_in;
    node->a_index = a_index;
    node->b_index = b_index;
    node->target = target;
    node->edges = edges;
    node->a_rows = args.a_rows;
    node->b_rows = args.b_rows;
  }
  return out;
}

}  // namespace

Tensor scatter_reduce(const Tensor& base, int64_t dim_in, const Tensor& index_in, const Tensor& src,
                      ScatterReduceOp op) {
  const char* name = "scatter_reduce";
  ProfileSpan span(name);
  MPIGRAD_CHECK(base.defined() && src.defined(), name, ": undefined operand");
  detail::check_same_device(name, {&base, &src});
  MPIGRAD_CHECK(base.dim() >= 1, name, ": the base must have at least one dim, got a scalar");
  const int dim = wrap_dim(dim_in, base.dim(), name);
  Tensor index = prepare_index(index_in, base.device(), name);
  MPIGRAD_CHECK(src.dim() == base.dim() && index.shape() == src.shape(), name, ": the source ",
                src.shape(), " and the index ", index.shape(),
                " must have one shape, with as many dims as the base ", base.shape());
  for (int d = 0; d < base.dim(); ++d) {
    MPIGRAD_CHECK(d == dim || src.shape()[d] == base.shape()[d], name, ": source shape ",
                  src.shape(), " must match base shape ", base.shape(), " outside dim ", dim);
  }
  const DType dtype = promote_types(base.dtype(), src.dtype());
  MPIGRAD_CHECK(dtype == kFloat32 || dtype == kFloat64 || dtype == kInt32 || dtype == kInt64, name,
                ": takes float32, float64, int32 and int64 tensors, got ", dtype);
  Tensor out, before, source;
  {
    NoGradGuard no_grad;
    before = base.to(dtype).contiguous();
    out = before.clone();
    source = src.to(dtype).contiguous();
  }
  const Layout3 l = split_at(out.shape(), dim);
  const int64_t bad =
      out.numel() == 0
          ? -1
          : backend_for(out.device())
                .scatter_reduce(op, dtype, l.outer, l.extent, l.inner, index.data<int64_t>(),
                                src.shape()[dim], out.data_ptr(), source.data_ptr());
  check_index_result(bad, index, l.extent, dim, name);
  if (auto node = detail::record<ScatterReduceBackward>(out, {&base, &src}, dim, op)) {
    node->index = index;
    // What the forward computed with, with its history, so a second derivative reaches base
    // and src through it.
    node->base = base.dtype() == dtype ? base : base.to(dtype);
    node->src = src.dtype() == dtype ? src : src.to(dtype);
    node->out = SavedTensor(out, true);
  }
  return out;
}

Tensor scatter_add(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src) {
  ProfileSpan span("scatter_add");
  return add_at(base, dim, index, src, true);
}

Tensor index_add(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src) {
  ProfileSpan span("index_add");
  return add_at(base, dim, index, src, false);
}

Tensor index_select(const Tensor& x, int64_t dim_in, const Tensor& index_in) {
  ProfileSpan span("index_select");
  MPIGRAD_CHECK(x.defined(), "index_select: undefined source");
  int dim = wrap_dim(dim_in, x.dim(), "index_select");
  MPIGRAD_CHECK(index_in.defined() && index_in.dim() <= 1,
                "index_select: the index must be 0-d "
                "or 1-d, got shape ",
                index_in.defined() ? index_in.shape().str() : "undefined");
  Tensor index = prepare_index(index_in, x.device(), "index_select");
  Tensor source;
  {
    NoGradGuard no_grad;
    source = x.dim() == 0 ? x.reshape({1}) : x.contiguous();
  }
  Shape shape = source.shape();
  shape[dim] = index.numel();
  Tensor out = detail::empty_on(shape, x.dtype(), x.device());
  Layout3 l = split_at(source.shape(), dim);
  int64_t bad = backend_for(x.device())
                    .index_select(x.dtype(), l.outer, l.extent, l.inner, index.data<int64_t>(),
                                  index.numel(), out.data_ptr(), source.data_ptr());
  check_index_result(bad, index, l.extent, dim, "index_select");
  if (auto node = detail::record<IndexBackward>(out, {&x}, source.shape(), dim, false)) {
    node->index = index;
  }
  return x.dim() == 0 ? out.reshape(Shape{}) : out;
}

Tensor gather(const Tensor& x, int64_t dim_in, const Tensor& index_in) {
  ProfileSpan span("gather");
  MPIGRAD_CHECK(x.defined(), "gather: undefined source");
  int dim = wrap_dim(dim_in, x.dim(), "gather");
  Tensor index = prepare_index(index_in, x.device(), "gather");
  MPIGRAD_CHECK(index.dim() == x.dim(), "gather: the index has shape ", index.shape(),
                " but must have as many dims as the source ", x.shape());
  for (int d = 0; d < x.dim(); ++d) {
    MPIGRAD_CHECK(d == dim || index.shape()[d] == x.shape()[d], "gather: index shape ",
                  index.shape(), " must match source shape ", x.shape(), " outside dim ", dim);
  }
  Tensor source;
  {
    NoGradGuard no_grad;
    source = x.contiguous();
  }
  Tensor out = detail::empty_on(index.shape(), x.dtype(), x.device());
  Layout3 l = split_at(source.shape(), dim);
  int64_t count = x.dim() == 0 ? 1 : index.shape()[dim];
  int64_t bad = backend_for(x.device())
                    .gather(x.dtype(), l.outer, l.extent, l.inner, index.data<int64_t>(), count,
                            out.data_ptr(), source.data_ptr());
  check_index_result(bad, index, l.extent, dim, "gather");
  if (auto node = detail::record<IndexBackward>(out, {&x}, x.shape(), dim, true)) {
    node->index = index;
  }
  return out;
}

Tensor gather_mul_scatter(const Tensor& x, const Tensor& source, const Tensor& weight,
                          const Tensor& target, int64_t num_targets, const Tensor& weight_index) {
  ProfileSpan span("gather_mul_scatter");
  static constexpr ProductNames kNames{"gather_mul_scatter", "source", "weight", "target"};
  MPIGRAD_CHECK(source.defined() && target.defined(),
                "gather_mul_scatter: undefined source or target index");
  MPIGRAD_CHECK(num_targets >= 0, "gather_mul_scatter: negative num_targets ", num_targets);
  return indexed_product(x, source, weight, weight_index, target, num_targets, source.numel(),
                         kNames);
}

Tensor gather_product(const Tensor& a, const Tensor& index_a, const Tensor& b,
                      const Tensor& index_b) {
  ProfileSpan span("gather_product");
  static constexpr ProductNames kNames{"gather_product", "index_a", "index_b", "target"};
  MPIGRAD_CHECK(index_a.defined() && index_b.defined(), "gather_product: undefined index");
  return indexed_product(a, index_a, b, index_b, Tensor(), 0, index_a.numel(), kNames);
}

Tensor one_hot(const Tensor& labels, int64_t num_classes) {
  ProfileSpan span("one_hot");
  MPIGRAD_CHECK(num_classes > 0, "one_hot: num_classes must be positive, got ", num_classes);
  Tensor index = prepare_index(labels, labels.device(), "one_hot");
  if (index.numel() > 0) {
    int64_t lo = min(index).item<int64_t>(), hi = max(index).item<int64_t>();
    MPIGRAD_CHECK(lo >= 0 && hi < num_classes, "one_hot: label ", lo < 0 ? lo : hi,
                  " is out of range for ", num_classes, " classes (valid labels are 0..",
                  num_classes - 1, ")");
  }
  Tensor classes = arange(num_classes, TensorOptions(kInt64).device(labels.device()));
  return eq(index.unsqueeze(-1), classes).to(kInt64);
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  ProfileSpan span("embedding");
  MPIGRAD_CHECK(weight.defined() && weight.dim() == 2,
                "embedding: the weight must be 2-d "
                "[num_embeddings, dim], got shape ",
                weight.defined() ? weight.shape().str() : "undefined");
  MPIGRAD_CHECK(indices.defined(), "embedding: undefined indices");
  Shape shape = indices.shape();
  shape.push_back(weight.shape()[1]);
  return index_select(weight, 0, indices.reshape({-1})).reshape(shape);
}

}  // namespace mpigrad::core
