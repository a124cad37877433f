#include "mpigrad/core/ops/cross_entropy.h"

#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/op_support.h"
#include "mpigrad/core/ops/reduce.h"

namespace mpigrad::core {

namespace {

// The kernel wrote d(loss of row r)/d(logits of row r) in forward; backward scales it.
struct CrossEntropyBackward final : Node {
  RowLossReduction reduction;
  SavedTensor row_gradients;  // [rows, C], the logits' dtype
  SavedTensor count;          // Mean: the counted rows, a 0-d tensor on the device
  explicit CrossEntropyBackward(RowLossReduction r) : reduction(r) {}
  const char* name() const override { return "CrossEntropyBackward"; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    const Tensor& g = row_gradients.get(*this);
    Tensor scale = grad.to(g.dtype());
    if (reduction == RowLossReduction::None) scale = scale.reshape({g.size(0), 1});
    if (reduction == RowLossReduction::Mean) scale = scale / count.get(*this).to(g.dtype());
    grads[0] = g * scale;
  }
  void release_saved() override {
    row_gradients.release();
    count.release();
  }
};

}  // namespace

Tensor cross_entropy_rows(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                          RowLossReduction reduction, const TargetCheck& check) {
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
  }
  return out;
}

}  // namespace mpigrad::core
