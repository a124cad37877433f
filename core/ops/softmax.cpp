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
                            y.data_ptr());
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
        .softmax_forward(log, x.dtype(), rows, cols, y.data_ptr(), rows_view.data_ptr());
  }
  Tensor out = x.dim() == 0 ? y.reshape(Shape{}) : y.transpose(dim, last);
  if (x.dim() > 0) {
    if (auto node = detail::record<SoftmaxBackward>(out, {&x}, log, dim)) {
      node->output = SavedTensor(out, /*is_output=*/true);
    }
  }
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  return softmax_impl(x, dim, false);
}
Tensor log_softmax(const Tensor& x, int64_t dim) {
  return softmax_impl(x, dim, true);
}

}  // namespace mpigrad::core
