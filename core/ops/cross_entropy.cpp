#include "mpigrad/core/ops/cross_entropy.h"

#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/ops/op_support.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/profiler.h"

namespace mpigrad::core {

namespace {

// The row gradients p - onehot(target) as a function of the logits, for the second derivative:
// the softmax's Jacobian p (v - sum(v p)) applied to an incoming v. p comes back from the saved
// row gradients (p = row gradient + onehot in counted rows; 0 in ignored ones). It is the end of
// the chain: a third derivative through cross-entropy stops here with an error naming it.
struct CrossEntropyRowGradientBackward final : Node {
  Tensor probabilities;
  const char* name() const override { return "CrossEntropyRowGradientBackward"; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    Tensor weighted = mul(probabilities, grad);
    grads[0] = sub(weighted, mul(probabilities, sum(weighted, {1}, /*keepdim=*/true)));
  }
};

// The kernel wrote d(loss of row r)/d(logits of row r) in forward; backward scales it.
struct CrossEntropyBackward final : Node {
  RowLossReduction reduction;
  int64_t ignore_index = -100;
  SavedTensor row_gradients;  // [rows, C], the logits' dtype
  SavedTensor count;          // Mean: the counted rows, a 0-d tensor on the device
  SavedTensor targets;        // for the second derivative
  explicit CrossEntropyBackward(RowLossReduction r) : reduction(r) {}
  const char* name() const override { return "CrossEntropyBackward"; }
  bool differentiable_backward() const override { return true; }
  // create_graph: the row gradients as a tensor whose history leads to the logits.
  Tensor row_gradients_with_history(const Tensor& saved) const {
    Tensor probabilities;
    {
      NoGradGuard no_grad;
      const Tensor t = targets.get(*this);
      const Tensor counted = ne(t, scalar_like(double(ignore_index), t));
      const Tensor safe = where(counted, t, zeros_like(t));
      const Tensor onehot = mul(one_hot(safe, saved.size(1)), counted.unsqueeze(1).to(kInt64));
      probabilities = add(saved, onehot.to(saved.dtype()));
    }
    auto node = std::make_shared<CrossEntropyRowGradientBackward>();
    node->probabilities = probabilities;
    node->next.push_back(next[0]);  // the logits' edge
    return with_history(saved, std::move(node));
  }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    const Tensor g = grad_enabled() ? row_gradients_with_history(row_gradients.get(*this))
                                    : row_gradients.get(*this);
    Tensor scale = grad.to(g.dtype());
    if (reduction == RowLossReduction::None) scale = scale.reshape({g.size(0), 1});
    if (reduction == RowLossReduction::Mean) scale = scale / count.get(*this).to(g.dtype());
    grads[0] = g * scale;
  }
  void release_saved() override {
    row_gradients.release();
    count.release();
    targets.release();
  }
};

}  // namespace

Tensor cross_entropy_rows(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                          RowLossReduction reduction, const TargetCheck& check) {
  ProfileSpan span("cross_entropy");
  const char* op = check.op.c_str();
  MPIGRAD_CHECK(logits.defined() && targets.defined(), op, ": undefined input");
  detail::check_floating(op, logits);
  MPIGRAD_CHECK(logits.dim() == 2, op, ": logits must be [rows, classes], got ", logits.shape());
  MPIGRAD_CHECK(
      targets.dtype() == kInt64 && targets.dim() == 1 && targets.size(0) == logits.size(0), op,
      ": targets must be Int64 [", logits.size(0), "], got ", dtype_name(targets.dtype()), " ",
      targets.shape());
  detail::check_same_device(op, {&logits, &targets});
  const int64_t rows = logits.size(0), classes = logits.size(1);
  const Device device = logits.device();
  const DType loss_dtype = logits.dtype() == kFloat64 ? kFloat64 : kFloat32;
  const bool record = any_requires_grad({&logits});

  Tensor x, t;
  {
    NoGradGuard no_grad;
    x = logits.contiguous();
    t = targets.contiguous();
  }
  Tensor losses = detail::empty_on({rows}, loss_dtype, device);
  Tensor row_gradients = record ? detail::empty_on({rows, classes}, x.dtype(), device) : Tensor();
  backend_for(device).cross_entropy(x.dtype(), rows, classes, x.data_ptr(), t.data<int64_t>(),
                                    ignore_index, 1.0, losses.data_ptr(),
                                    record ? row_gradients.data_ptr() : nullptr, check);
  Tensor out, count;
  {
    NoGradGuard no_grad;
    switch (reduction) {
      case RowLossReduction::None:
        out = losses;
        break;
      case RowLossReduction::Sum:
        out = sum(losses);
        break;
      case RowLossReduction::Mean:
        // On the device: no host round trip to learn how many rows were ignored.
        count = sum(ne(t, scalar_like(double(ignore_index), t)).to(loss_dtype));
        out = sum(losses) / count;  // NaN when every row is ignored, as torch
        break;
    }
    out = out.to(logits.dtype());
  }
  if (auto node = detail::record<CrossEntropyBackward>(out, {&logits}, reduction)) {
    node->row_gradients = SavedTensor(row_gradients);
    if (count.defined()) node->count = SavedTensor(count);
    node->ignore_index = ignore_index;
    node->targets = SavedTensor(t);
  }
  return out;
}

}  // namespace mpigrad::core
