// Reductions: any set of axes is brought to the kernels' [outer, extent, inner] layout, by a
// permuted copy only when the reduced axes are not already one contiguous block. A float sum
// over leading and trailing axes around kept ones (a convolution's bias gradient, dims {0, 2, 3}
// of NCHW) runs in two passes instead: the trailing block first, then the leading one over the
// small result, which reads the input once and copies nothing.
#include "mpigrad/core/ops/reduce.h"

#include <algorithm>
#include <limits>

#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/ops/op_support.h"
#include "mpigrad/core/profiler.h"

namespace mpigrad::core {

namespace {

struct ReductionPlan {
  Tensor input;  // contiguous, laid out as [outer, extent, inner] (x trailing, see below)
  int64_t outer = 1, extent = 1, inner = 1;
  // > 1: the input is [extent, inner, trailing], reduced over the first and last axes (outer 1);
  // for sums only.
  int64_t trailing = 1;
  int64_t reduced_count() const { return extent * trailing; }  // elements in each result
  Shape keepdim_shape;  // output shape with reduced dims kept as 1
  Shape out_shape;      // output shape as requested
};

// Trailing rows shorter than this are copied into place instead (ReductionPlan::trailing).
constexpr int64_t kTwoPassMinRow = 16;

// `sums`: the plan is for a Sum (and may take two passes).
ReductionPlan plan_reduction(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim,
                             const char* op, bool sums = false) {
  MPIGRAD_CHECK(x.defined(), op, ": undefined operand");
  std::vector<bool> reduced(size_t(x.dim()), dims_in.empty());
  for (int64_t dim : dims_in) {
    int d = wrap_dim(dim, x.dim(), op);
    if (x.dim() == 0) continue;
    MPIGRAD_CHECK(!reduced[size_t(d)], op, ": dim ", dim, " appears twice");
    reduced[size_t(d)] = true;
  }
  ReductionPlan plan;
  for (int d = 0; d < x.dim(); ++d) {
    plan.keepdim_shape.push_back(reduced[size_t(d)] ? 1 : x.shape()[d]);
    if (!reduced[size_t(d)] || keepdim) plan.out_shape.push_back(plan.keepdim_shape[d]);
  }
  int first = -1, last = -1;
  for (int d = 0; d < x.dim(); ++d) {
    if (reduced[size_t(d)]) {
      if (first < 0) first = d;
      last = d;
    }
  }
  bool block = first >= 0 && std::all_of(reduced.begin() + first, reduced.begin() + last + 1,
                                         [](bool r) { return r; });
  if (first < 0) {  // nothing reduced (0-d input)
    plan.input = x.contiguous();
    plan.outer = x.numel();
    return plan;
  }
  if (block) {
    plan.input = x.contiguous();
    for (int d = 0; d < x.dim(); ++d) {
      int64_t extent = x.shape()[d];
      if (d < first)
        plan.outer *= extent;
      else if (d <= last)
        plan.extent *= extent;
      else
        plan.inner *= extent;
    }
    return plan;
  }
  // Reduced axes before and after one block of kept ones: two passes, no copy. Float32 and
  // Float64 only (the partial sums of 16-bit floats would round to 16 bits), on the CPU, with
  // trailing rows long enough that the first pass is not mostly per-row overhead.
  int kept_first = first;
  while (kept_first < x.dim() && reduced[size_t(kept_first)]) ++kept_first;
  int kept_last = kept_first;
  while (kept_last < x.dim() && !reduced[size_t(kept_last)]) ++kept_last;  // one past
  const bool two_pass =
      sums && first == 0 && kept_last < x.dim() &&
      std::all_of(reduced.begin() + kept_last, reduced.end(), [](bool r) { return r; }) &&
      (x.dtype() == kFloat32 || x.dtype() == kFloat64) && x.device().is_cpu();
  if (two_pass) {
    int64_t lead = 1, kept = 1, trail = 1;
    for (int d = 0; d < x.dim(); ++d) {
      (d < kept_first ? lead : d < kept_last ? kept : trail) *= x.shape()[d];
    }
    if (trail >= kTwoPassMinRow) {
      plan.input = x.contiguous();
      plan.extent = lead;
      plan.inner = kept;
      plan.trailing = trail;
      return plan;
    }
  }
  // Kept axes first, reduced axes last, then one dense copy.
  std::vector<int64_t> order;
  for (int d = 0; d < x.dim(); ++d) {
    if (!reduced[size_t(d)]) order.push_back(d);
  }
  for (int d = 0; d < x.dim(); ++d) {
    if (reduced[size_t(d)]) {
      order.push_back(d);
      plan.extent *= x.shape()[d];
    } else {
      plan.outer *= x.shape()[d];
    }
  }
  NoGradGuard no_grad;
  plan.input = x.permute(order).contiguous();
  return plan;
}

// Runs the kernel; indices (Int64, same shape as the result) only for Max/Min.
Tensor run_reduction(ReduceOp op, const ReductionPlan& plan, Tensor* indices) {
  DType out_dtype = kernels::reduce_out_dtype(op, plan.input.dtype());
  Device device = plan.input.device();
  Tensor out = detail::empty_on(plan.out_shape, out_dtype, device);
  int64_t* index_ptr = nullptr;
  if (indices != nullptr) {
    *indices = detail::empty_on(plan.out_shape, kInt64, device);
    index_ptr = indices->data<int64_t>();
  }
  if (out.numel() == 0) return out;
  if (plan.trailing > 1) {
    // [extent, inner, trailing] -> [extent, inner] -> [inner]
    Tensor rows = detail::empty_on({plan.extent * plan.inner}, out_dtype, device);
    backend_for(device).reduce(op, plan.input.dtype(), plan.extent * plan.inner, plan.trailing, 1,
                               rows.data_ptr(), nullptr, plan.input.data_ptr());
    backend_for(device).reduce(op, out_dtype, 1, plan.extent, plan.inner, out.data_ptr(), nullptr,
                               rows.data_ptr());
    return out;
  }
  backend_for(device).reduce(op, plan.input.dtype(), plan.outer, plan.extent, plan.inner,
                             out.data_ptr(), index_ptr, plan.input.data_ptr());
  return out;
}

struct SumBackward final : Node {
  Shape input_shape, keepdim_shape;
  double scale;  // 1 for sum, 1/count for mean
  SumBackward(Shape in, Shape keep, double s) : input_shape(in), keepdim_shape(keep), scale(s) {}
  const char* name() const override { return scale == 1.0 ? "SumBackward" : "MeanBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    Tensor spread = grad.reshape(keepdim_shape).expand(input_shape);
    grads[0] = scale == 1.0 ? spread : mul(spread, scalar_like(scale, spread));
  }
};

// Gradient of max/min along a dim: the incoming gradient lands on the selected positions.
struct SelectExtremumBackward final : Node {
  Shape input_shape, keepdim_shape;
  int dim;
  SavedTensor indices;
  SelectExtremumBackward(Shape in, Shape keep, int d)
      : input_shape(in), keepdim_shape(keep), dim(d) {}
  const char* name() const override { return "MaxBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    if (grad_enabled()) {  // create_graph: the same scatter as an op that records a graph
      Tensor base = zeros(input_shape, TensorOptions(grad.dtype()).device(grad.device()));
      grads[0] = scatter_add(base, dim, indices.get(*this).reshape(keepdim_shape),
                             grad.reshape(keepdim_shape));
      return;
    }
    Tensor source = grad.reshape(keepdim_shape).contiguous();
    Tensor index = indices.get(*this).reshape(keepdim_shape).contiguous();
    Tensor result = zeros(input_shape, TensorOptions(grad.dtype()).device(grad.device()));
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < dim; ++d) outer *= input_shape[d];
    for (int d = dim + 1; d < input_shape.size(); ++d) inner *= input_shape[d];
    backend_for(grad.device())
        .scatter_add(grad.dtype(), outer, input_shape[dim], inner, index.data<int64_t>(), 1,
                     result.data_ptr(), source.data_ptr());
    grads[0] = std::move(result);
  }
  void release_saved() override { indices.release(); }
};

ValuesIndices extremum(ReduceOp op, const Tensor& x, int64_t dim_in, bool keepdim) {
  ProfileSpan span(op == ReduceOp::Max ? "max" : "min");
  const char* name = op == ReduceOp::Max ? "max" : "min";
  int d = wrap_dim(dim_in, x.dim(), name);
  MPIGRAD_CHECK(x.dtype() != kBool, name, ": not defined for bool tensors");
  ReductionPlan plan = plan_reduction(x, {dim_in}, keepdim, name);
  MPIGRAD_CHECK(x.dim() == 0 || x.shape()[d] > 0, name, ": cannot reduce over dim ", dim_in,
                " of extent 0 in shape ", x.shape());
  ValuesIndices result;
  result.values = run_reduction(op, plan, &result.indices);
  if (x.dim() > 0) {
    if (auto node = detail::record<SelectExtremumBackward>(result.values, {&x}, x.shape(),
                                                           plan.keepdim_shape, d)) {
      node->indices = result.indices;
    }
  }
  return result;
}

}  // namespace

Tensor sum(const Tensor& x) {
  return sum(x, {}, false);
}

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  ProfileSpan span("sum");
  ReductionPlan plan = plan_reduction(x, dims, keepdim, "sum", /*sums=*/true);
  Tensor out = run_reduction(ReduceOp::Sum, plan, nullptr);
  if (is_floating(x.dtype())) {
    detail::record<SumBackward>(out, {&x}, x.shape(), plan.keepdim_shape, 1.0);
  }
  return out;
}

Tensor mean(const Tensor& x) {
  return mean(x, {}, false);
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  ProfileSpan span("mean");
  detail::check_floating("mean", x);
  ReductionPlan plan = plan_reduction(x, dims, keepdim, "mean", /*sums=*/true);
  Tensor out = run_reduction(ReduceOp::Sum, plan, nullptr);
  const int64_t count = plan.reduced_count();
  double scale = count > 0 ? 1.0 / double(count) : 0.0;
  if (count == 0) {
    out.fill_(std::numeric_limits<double>::quiet_NaN());  // mean of nothing, as in PyTorch
  } else {
    NoGradGuard no_grad;
    out.mul_(scale);
  }
  detail::record<SumBackward>(out, {&x}, x.shape(), plan.keepdim_shape, scale);
  return out;
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  ProfileSpan span("var");
  detail::check_floating("var", x);
  ReductionPlan plan = plan_reduction(x, dims, keepdim, "var");
  // Two passes (mean, then squared deviations) for accuracy; autograd comes from the parts.
  Tensor centered = sub(x, mean(x, dims, /*keepdim=*/true));
  Tensor squares = sum(mul(centered, centered), dims, keepdim);
  double denominator = double(plan.extent - correction);
  return div(squares, scalar_like(denominator > 0 ? denominator : 0.0, squares));
}

ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim) {
  return extremum(ReduceOp::Max, x, dim, keepdim);
}
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim) {
  return extremum(ReduceOp::Min, x, dim, keepdim);
}
Tensor max(const Tensor& x) {
  MPIGRAD_CHECK(x.numel() > 0, "max: the tensor is empty");
  return extremum(ReduceOp::Max, x.reshape({-1}), 0, false).values;
}
Tensor min(const Tensor& x) {
  MPIGRAD_CHECK(x.numel() > 0, "min: the tensor is empty");
  return extremum(ReduceOp::Min, x.reshape({-1}), 0, false).values;
}
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  NoGradGuard no_grad;
  return extremum(ReduceOp::Max, x, dim, keepdim).indices;
}

}  // namespace mpigrad::core
