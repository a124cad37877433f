#include "mpigrad/core/ops/softmax.h"

#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/op_support.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/profiler.h"

namespace mpigrad::core {

namespace {

struct SoftmaxBackward final : Node {
  bool log;
  int dim;
  SavedTensor output;  // the result; moved back to its softmax axis last, it is dense
  SoftmaxBackward(bool log_, int dim_) : log(log_), dim(dim_) {}
  const char* name() const override { return log ? "LogSoftmaxBackward" : "SoftmaxBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    const Tensor out = output.get(*this);  // in the caller's layout
    if (grad_enabled()) {
      // create_graph: the fused kernel's formula in ops that record a graph, on the saved
      // result (which carries this node as its history):
      //   softmax:     y (g - sum(g y))        log_softmax: g - exp(y) sum(g)
      const Tensor& y = out;
      if (log) {
        grads[0] = sub(grad, mul(exp(y), sum(grad, {dim}, /*keepdim=*/true)));
      } else {
        grads[0] = mul(y, sub(grad, sum(mul(grad, y), {dim}, /*keepdim=*/true)));
      }
      return;
    }
    const Tensor y = out.transpose(dim, out.dim() - 1);  // the kernel's rows, dense
    int last = y.dim() - 1;
    Tensor g = grad.transpose(dim, last).contiguous();
    Tensor grad_in = detail::empty_on(y.shape(), y.dtype(), y.device());
    int64_t cols = y.dim() == 0 ? 1 : y.shape()[last];
    int64_t rows = cols == 0 ? 0 : y.numel() / cols;
    if (y.numel() > 0) {
      backend_for(y.device())
          .softmax_backward(log, y.dtype(), rows, cols, grad_in.data_ptr(), g.data_ptr(),
                            y.data_ptr(), 1.0);
    }
    grads[0] = grad_in.transpose(dim, last);
  }
  void release_saved() override { output.release(); }
};

Tensor softmax_impl(const Tensor& x, int64_t dim_in, bool log) {
  ProfileSpan span(log ? "log_softmax" : "softmax");
  const char* name = log ? "log_softmax" : "softmax";
  MPIGRAD_CHECK(x.defined(), name, ": undefined operand");
  detail::check_floating(name, x);
  int dim = wrap_dim(dim_in, x.dim(), name);
  int last = x.dim() == 0 ? 0 : x.dim() - 1;
  // The kernel works on rows: move the axis last (a view), then make that dense.
  Tensor rows_view;
  {
    NoGradGuard no_grad;
    rows_view = x.dim() == 0 ? x.reshape({1}) : x.transpose(dim, last).contiguous();
  }
  Tensor y = detail::empty_on(rows_view.shape(), x.dtype(), x.device());
  int64_t cols = rows_view.shape()[rows_view.dim() - 1];
  int64_t rows = cols == 0 ? 0 : rows_view.numel() / cols;
  if (y.numel() > 0) {
    backend_for(x.device())
        .softmax_forward(log, x.dtype(), rows, cols, y.data_ptr(), rows_view.data_ptr(), {});
  }
  Tensor out = x.dim() == 0 ? y.reshape(Shape{}) : y.transpose(dim, last);
  if (x.dim() > 0) {
    if (auto node = detail::record<SoftmaxBackward>(out, {&x}, log, dim)) {
      node->output = SavedTensor(out, /*is_output=*/true);
    }
  }
  return out;
}

// d softmax(s x + m) / dx = s y (g - sum(g y)), in one kernel pass; the mask needs no gradient.
struct SoftmaxScaleMaskBackward final : Node {
  double scale;
  SavedTensor output;  // the result, dense
  explicit SoftmaxScaleMaskBackward(double scale_) : scale(scale_) {}
  const char* name() const override { return "SoftmaxScaleMaskBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    const Tensor y = output.get(*this);
    if (grad_enabled()) {
      // create_graph: the formula in ops that record a graph, the scale's mul last, as the
      // separate ops' MulBackward would apply it.
      const Tensor softmax_grad = mul(y, sub(grad, sum(mul(grad, y), {-1}, /*keepdim=*/true)));
      grads[0] = scale == 1.0 ? softmax_grad : softmax_grad * scale;
      return;
    }
    const Tensor g = grad.contiguous();
    Tensor grad_in = detail::empty_on(y.shape(), y.dtype(), y.device());
    const int64_t cols = y.shape().back();
    const int64_t rows = cols == 0 ? 0 : y.numel() / cols;
    if (y.numel() > 0) {
      backend_for(y.device())
          .softmax_backward(false, y.dtype(), rows, cols, grad_in.data_ptr(), g.data_ptr(),
                            y.data_ptr(), scale);
    }
    grads[0] = grad_in;
  }
  void release_saved() override { output.release(); }
};

// The mask's rows as the kernel reads them (kernels/softmax.h SoftmaxScaleMask): x's dims before
// the last, each kept by the mask (the same extent) or broadcast (extent 1 in the mask); the
// broadcast ones must form one run, whose extents give `repeat`, and the kept ones after it
// `inner`. False when the mask is not of that form.
bool mask_rows(const Shape& x_shape, const Shape& mask_shape, int64_t& inner, int64_t& repeat) {
  const int nd = int(x_shape.size()), offset = nd - int(mask_shape.size());
  if (offset < 0 || mask_shape.back() != x_shape.back()) return false;
  inner = 1;
  repeat = 1;
  int stage = 0;  // 0: kept dims before the run, 1: the broadcast run, 2: kept dims after it
  for (int d = 0; d + 1 < nd; ++d) {
    const int64_t extent = x_shape[d];
    const int64_t mask_extent = d < offset ? 1 : mask_shape[d - offset];
    if (extent == 1) continue;
    if (mask_extent == extent) {
      if (stage == 1) stage = 2;
      if (stage == 2) inner *= extent;
    } else if (mask_extent == 1) {
      if (stage == 2) return false;
      stage = 1;
      repeat *= extent;
    } else {
      return false;
    }
  }
  // Kept dims with no run after them are rows of their own: the mask is x's shape.
  if (stage == 0) inner = 1, repeat = 1;
  return true;
}

}  // namespace

Tensor softmax_scale_mask(const Tensor& x, double scale, const Tensor& mask) {
  ProfileSpan span("softmax_scale_mask");
  MPIGRAD_CHECK(x.defined(), "softmax_scale_mask: undefined operand");
  detail::check_floating("softmax_scale_mask", x);
  MPIGRAD_CHECK(x.dim() >= 1, "softmax_scale_mask: expected at least 1 dim, got a scalar");
  int64_t inner = 1, repeat = 1;
  const bool fused = !mask.defined() || (mask.dtype() == x.dtype() && mask.device() == x.device() &&
                                         !mask.requires_grad() && mask.dim() >= 1 &&
                                         mask_rows(x.shape(), mask.shape(), inner, repeat));
  if (!fused) {
    const Tensor scaled = scale == 1.0 ? x : x * scale;
    return softmax(mask.defined() ? scaled + mask : scaled, -1);
  }
  Tensor input, dense_mask;
  {
    NoGradGuard no_grad;
    input = x.contiguous();
    if (mask.defined()) dense_mask = mask.detach().contiguous();
  }
  Tensor y = detail::empty_on(x.shape(), x.dtype(), x.device());
  const int64_t cols = x.shape().back();
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  if (y.numel() > 0) {
    kernels::SoftmaxScaleMask transform;
    transform.scale = scale;
    if (dense_mask.defined()) {
      transform.mask = dense_mask.data_ptr();
      transform.mask_inner = inner;
      transform.mask_repeat = repeat;
    }
    backend_for(x.device())
        .softmax_forward(false, x.dtype(), rows, cols, y.data_ptr(), input.data_ptr(), transform);
  }
  if (auto node = detail::record<SoftmaxScaleMaskBackward>(y, {&x}, scale)) {
    node->output = SavedTensor(y, /*is_output=*/true);
  }
  return y;
}

Tensor softmax(const Tensor& x, int64_t dim) {
  return softmax_impl(x, dim, false);
}
Tensor log_softmax(const Tensor& x, int64_t dim) {
  return softmax_impl(x, dim, true);
}

}  // namespace mpigrad::core
