// matmul: torch.matmul's shape rules expressed with differentiable views (unsqueeze, expand)
// around one batched GEMM primitive, so broadcasting gradients fall out of the view backward.
// Under autocast (core/autocast.h) the same views are taken of 16-bit copies of the operands, and
// the primitive is the backend's gemm_mixed.
#include "mpigrad/core/ops/linalg.h"

#include <vector>

#include "mpigrad/core/autocast.h"
#include "mpigrad/core/ops/op_support.h"
#include "mpigrad/core/profiler.h"

namespace mpigrad::core {

namespace {

// How BLAS sees the last two dims of a [..., rows, cols] tensor.
struct MatrixLayout {
  bool transposed = false;
  int64_t leading_dim = 0;
};

bool describe_matrix(const Tensor& t, MatrixLayout& layout) {
  int nd = t.dim();
  int64_t rows = t.shape()[nd - 2], cols = t.shape()[nd - 1];
  int64_t row_stride = t.strides()[nd - 2], col_stride = t.strides()[nd - 1];
  if ((col_stride == 1 || cols == 1) && row_stride >= std::max<int64_t>(1, cols)) {
    layout = {false, row_stride};
  } else if ((row_stride == 1 || rows == 1) && col_stride >= std::max<int64_t>(1, rows)) {
    layout = {true, col_stride};
  } else if (rows == 1 && cols == 1) {
    layout = {false, 1};
  } else {
    return false;
  }
  return true;
}

// The batch dims of a product [..., m, k] x [..., k, n] -> [..., m, n] (shared by a, b and the
// contiguous result), grouped into runs that each operand steps through with one stride. BLAS
// walks one run per call (GemmShape's batch strides); the runs outside it are a loop of calls.
// Why: attention's Q, K and V are [B, H, T, D] views permuted from [B, T, H*D], whose B and H
// dims step with two strides (T*H*D and D); one strided call per sequence reads them where they
// lie instead of copying each head out first.
struct BatchRun {
  int64_t extent = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

// Runs innermost first; dims of extent 1 are left out, and an empty list is one product.
std::vector<BatchRun> batch_runs(const Tensor& a, const Tensor& b, int64_t m, int64_t n) {
  std::vector<BatchRun> runs;
  int64_t stride_c = m * n;
  for (int d = a.dim() - 3; d >= 0; --d) {
    const int64_t extent = a.shape()[d];
    if (extent == 1) continue;
    const int64_t stride_a = a.strides()[d], stride_b = b.strides()[d];
    if (!runs.empty()) {
      BatchRun& run = runs.back();
      if (stride_a == run.stride_a * run.extent && stride_b == run.stride_b * run.extent) {
        run.extent *= extent;  // the result is contiguous, so its stride always continues
        stride_c *= extent;
        continue;
      }
    }
    runs.push_back({extent, stride_a, stride_b, stride_c});
    stride_c *= extent;
  }
  return runs;
}

// One operand's batch dims as one run (each stride the extent times the next), or broadcast.
bool single_run(const Tensor& t) {
  const std::vector<BatchRun> runs = batch_runs(t, t, 1, 1);
  return runs.size() <= 1;
}

Tensor batched_matmul(const Tensor& a, const Tensor& b);

// A [..., rows, cols] whose columns are contiguous: the transpose of a row-major matrix, as
// W.t() in Linear's x W^T.
bool column_major(const Tensor& t) {
  MatrixLayout layout;
  return t.shape()[t.dim() - 2] > 1 && t.shape()[t.dim() - 1] > 1 && describe_matrix(t, layout) &&
         layout.transposed && single_run(t);
}

// d(A B) = dA B + A dB: grad_A = G B^T, grad_B = A^T G (transposes are views, not copies).
// Each gradient comes out in its operand's layout, as PyTorch's mm backward does: for B = W.t()
// grad_B is computed as (G^T A)^T, so W's gradient arrives row-major like W. Otherwise it would
// arrive transposed and every accumulation into W.grad (and DDP's copy into its bucket) would
// walk memory with a stride of a whole row: 4-8x slower on Linear layers.
// B's gradient comes first and is handed over before A's is computed (core/autograd.h, "Early
// gradients"): in Linear's x W^T, B is the weight, whose DDP bucket can then start while the
// input's gradient, a GEMM as large, is still being computed.
struct BatchedMatmulBackward final : Node {
  SavedTensor a, b;
  const char* name() const override { return "MatmulBackward"; }
  bool differentiable_backward() const override { return true; }  // products of matmuls
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    if (gradient_needed(*this, 1)) {
      const Tensor& b_saved = b.get(*this);
      grads[1] = column_major(b_saved)
                     ? batched_matmul(grad.transpose(-1, -2), a.get(*this)).transpose(-1, -2)
                     : batched_matmul(a.get(*this).transpose(-1, -2), grad);
      if (gradient_needed(*this, 0)) release_gradient_early(*this, grads, 1);
    }
    if (gradient_needed(*this, 0)) {
      const Tensor& a_saved = a.get(*this);
      grads[0] = column_major(a_saved)
                     ? batched_matmul(b.get(*this), grad.transpose(-1, -2)).transpose(-1, -2)
                     : batched_matmul(grad, b.get(*this).transpose(-1, -2));
    }
  }
  void release_saved() override {
    a.release();
    b.release();
  }
};

// [..., m, k] x [..., k, n] -> [..., m, n] with identical batch dims, without autograd. With
// `mixed`, a and b are 16-bit and the product (fp32 sums) is float32. Batch dims that no single
// stride walks become a loop of strided batched calls when each call still has at least as many
// products as the loop has calls (attention's heads, per sequence); otherwise the operand is
// copied dense first, so that one call spreads the whole batch over the threads.
Tensor product(const Tensor& a_in, const Tensor& b_in, bool mixed) {
  int nd = a_in.dim();
  int64_t m = a_in.shape()[nd - 2], k = a_in.shape()[nd - 1], n = b_in.shape()[nd - 1];
  Shape out_shape = a_in.shape();
  out_shape[nd - 1] = n;
  Tensor out = detail::empty_on(out_shape, mixed ? kFloat32 : a_in.dtype(), a_in.device());
  Backend& backend = backend_for(a_in.device());
  MatrixLayout la, lb;
  Tensor a = a_in, b = b_in;
  if (!describe_matrix(a, la)) describe_matrix(a = a_in.detach().contiguous(), la);
  if (!describe_matrix(b, lb)) describe_matrix(b = b_in.detach().contiguous(), lb);
  std::vector<BatchRun> runs = batch_runs(a, b, m, n);
  if (runs.size() > 1) {
    int64_t calls = 1;
    for (size_t r = 1; r < runs.size(); ++r) calls *= runs[r].extent;
    if (calls > runs[0].extent) {
      if (!single_run(a)) describe_matrix(a = a.detach().contiguous(), la);
      if (!single_run(b)) describe_matrix(b = b.detach().contiguous(), lb);
      runs = batch_runs(a, b, m, n);
    }
  }
  if (out.numel() > 0 && k == 0) {
    backend.fill(out.dtype(), out.numel(), out.data_ptr(), 0.0);
  } else if (out.numel() > 0) {
    GemmShape shape;
    shape.transpose_a = la.transposed;
    shape.transpose_b = lb.transposed;
    shape.m = m;
    shape.n = n;
    shape.k = k;
    shape.lda = la.leading_dim;
    shape.ldb = lb.leading_dim;
    shape.ldc = std::max<int64_t>(1, n);
    if (!runs.empty()) {
      shape.batch = runs[0].extent;
      shape.batch_stride_a = runs[0].stride_a;
      shape.batch_stride_b = runs[0].stride_b;
      shape.batch_stride_c = runs[0].stride_c;
    }
    const int64_t a_size = element_size(a.dtype()), c_size = element_size(out.dtype());
    const auto* a_base = static_cast<const char*>(a.data_ptr());
    const auto* b_base = static_cast<const char*>(b.data_ptr());
    auto* c_base = static_cast<char*>(out.data_ptr());
    // An odometer over the outer runs (runs[1..]), each step one strided batched call.
    std::vector<int64_t> index(runs.size(), 0);
    for (;;) {
      int64_t offset_a = 0, offset_b = 0, offset_c = 0;
      for (size_t r = 1; r < runs.size(); ++r) {
        offset_a += index[r] * runs[r].stride_a;
        offset_b += index[r] * runs[r].stride_b;
        offset_c += index[r] * runs[r].stride_c;
      }
      const void* a_ptr = a_base + offset_a * a_size;
      const void* b_ptr = b_base + offset_b * a_size;
      void* c_ptr = c_base + offset_c * c_size;
      if (mixed) {
        backend.gemm_mixed(a.dtype(), shape, 1.0, a_ptr, b_ptr, 0.0, static_cast<float*>(c_ptr));
      } else {
        backend.gemm(a.dtype(), shape, 1.0, a_ptr, b_ptr, 0.0, c_ptr);
      }
      size_t r = 1;
      while (r < runs.size() && ++index[r] == runs[r].extent) index[r++] = 0;
      if (r >= runs.size()) break;
    }
  }
  return out;
}

Tensor batched_matmul(const Tensor& a_in, const Tensor& b_in) {
  Tensor out = product(a_in, b_in, false);
  if (auto node = detail::record<BatchedMatmulBackward>(out, {&a_in, &b_in})) {
    node->a = a_in;
    node->b = b_in;
  }
  return out;
}

// The autocast product's backward: both gradient products in 16 bits as well, from the 16-bit
// operands the forward kept (half the memory of float32 ones), each gradient in its float32
// operand's layout, and B's first, as in BatchedMatmulBackward.
struct MixedMatmulBackward final : Node {
  Tensor a_low, b_low;
  bool a_column_major = false, b_column_major = false;
  const char* name() const override { return "MixedMatmulBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    if (grad_enabled()) {
      // create_graph: float32 products that record a graph, from the 16-bit operands standing
      // in for the float32 ones they were cast from.
      Tensor a32, b32;
      {
        NoGradGuard no_grad;
        a32 = a_low.detach().to(kFloat32);
        b32 = b_low.detach().to(kFloat32);
      }
      a32 = stand_in(a32, next[0]);
      b32 = stand_in(b32, next[1]);
      if (gradient_needed(*this, 1)) grads[1] = batched_matmul(a32.transpose(-1, -2), grad);
      if (gradient_needed(*this, 0)) grads[0] = batched_matmul(grad, b32.transpose(-1, -2));
      return;
    }
    const Tensor g = detail::copy_as(grad, a_low.dtype());
    if (gradient_needed(*this, 1)) {
      grads[1] = b_column_major ? product(g.transpose(-1, -2), a_low, true).transpose(-1, -2)
                                : product(a_low.transpose(-1, -2), g, true);
      if (gradient_needed(*this, 0)) release_gradient_early(*this, grads, 1);
    }
    if (gradient_needed(*this, 0)) {
      grads[0] = a_column_major ? product(b_low, g.transpose(-1, -2), true).transpose(-1, -2)
                                : product(g, b_low.transpose(-1, -2), true);
    }
  }
  void release_saved() override {
    a_low = Tensor();
    b_low = Tensor();
  }
};

Tensor mixed_matmul(const Tensor& a, const Tensor& b, const Tensor& a_low, const Tensor& b_low) {
  Tensor out = product(a_low, b_low, true);
  if (auto node = detail::record<MixedMatmulBackward>(out, {&a, &b})) {
    node->a_low = a_low;
    node->b_low = b_low;
    node->a_column_major = column_major(a);
    node->b_column_major = column_major(b);
  }
  return out;
}

// An autocast operand; a transposed parameter (Linear's W.t()) is cast as W and transposed
// back, so the cached copy is W's and every use of W shares it.
Tensor low_operand(const Tensor& t, DType dtype) {
  if (t.dim() >= 2 && column_major(t)) {
    return autocast_operand(t.transpose(-1, -2), dtype).transpose(-1, -2);
  }
  return autocast_operand(t, dtype);
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  ProfileSpan span("matmul");
  MPIGRAD_CHECK(a_in.defined() && b_in.defined(), "matmul: undefined operand");
  detail::check_same_device("matmul", {&a_in, &b_in});
  MPIGRAD_CHECK(a_in.dim() >= 1 && b_in.dim() >= 1,
                "matmul: both operands need at least 1 dim, "
                "got shapes ",
                a_in.shape(), " and ", b_in.shape());
  DType dtype = promote_types(a_in.dtype(), b_in.dtype());
  MPIGRAD_CHECK(is_floating(dtype), "matmul: expected floating-point operands, got ", a_in.dtype(),
                " and ", b_in.dtype());
  const std::optional<DType> low = autocast_dtype_for("matmul", {&a_in, &b_in});
  MPIGRAD_CHECK(low || !a_in.device().is_cpu() || dtype == kFloat32 || dtype == kFloat64,
                "matmul: ", dtype,
                " operands are not supported on the CPU; use float32 operands, with "
                "[train] precision = bf16 for 16-bit arithmetic");
  // [..., m, k] x [k, n], a Linear layer on a sequence or an image (ConvNeXt's MatMul on NHWC):
  // a's batch dims fold into its rows and one GEMM does the work, as in torch.matmul. Broadcast
  // over the batch instead, the weight's gradient would be a [..., k, n] stack of products,
  // copied contiguous (W.t()'s layout) and summed by a reduction: most of ConvNeXt-Tiny's step
  // (1.2-1.5 s of CPU at batch 8, 32x32, against 0.25 s folded; docs/benchmarks.md). The reshape
  // is a view whenever a's batch and row dims are contiguous with each other, and copies a once
  // otherwise.
  if (a_in.dim() > 2 && b_in.dim() == 2 && a_in.numel() > 0 && a_in.shape().back() > 0) {
    const int64_t k = a_in.shape().back();
    MPIGRAD_CHECK(k == b_in.shape()[0], "matmul: shapes ", a_in.shape(), " and ", b_in.shape(),
                  " cannot be multiplied (", k, " vs ", b_in.shape()[0], " inner elements)");
    Shape out_shape = a_in.shape();
    out_shape[out_shape.size() - 1] = b_in.shape()[1];
    return matmul(a_in.reshape({-1, k}), b_in).view(out_shape);
  }
  Tensor a = a_in.to(dtype), b = b_in.to(dtype);
  Tensor a_low, b_low;
  if (low) {
    a_low = low_operand(a, *low);
    b_low = low_operand(b, *low);
  }
  // The same views on the 16-bit copies as on the float32 operands.
  auto shaped = [&](Tensor& x, Tensor& x_low, auto&& reshape) {
    x = reshape(x);
    if (low) x_low = reshape(x_low);
  };
  if (a.dim() == 1) shaped(a, a_low, [](const Tensor& t) { return t.unsqueeze(0); });
  if (b.dim() == 1) shaped(b, b_low, [](const Tensor& t) { return t.unsqueeze(1); });
  int64_t k_a = a.shape()[a.dim() - 1], k_b = b.shape()[b.dim() - 2];
  MPIGRAD_CHECK(k_a == k_b, "matmul: shapes ", a_in.shape(), " and ", b_in.shape(),
                " cannot be multiplied (", k_a, " vs ", k_b, " inner elements)");
  Shape a_batch(a.shape().data(), a.dim() - 2), b_batch(b.shape().data(), b.dim() - 2);
  Shape batch = broadcast_shapes(a_batch, b_batch, "matmul (batch dims)");
  Shape a_full = batch, b_full = batch;
  a_full.push_back(a.shape()[a.dim() - 2]);
  a_full.push_back(k_a);
  b_full.push_back(k_b);
  b_full.push_back(b.shape()[b.dim() - 1]);
  if (!(a.shape() == a_full)) shaped(a, a_low, [&](const Tensor& t) { return t.expand(a_full); });
  if (!(b.shape() == b_full)) shaped(b, b_low, [&](const Tensor& t) { return t.expand(b_full); });
  Tensor out = low ? mixed_matmul(a, b, a_low, b_low) : batched_matmul(a, b);
  if (a_in.dim() == 1) out = out.squeeze(-2);
  if (b_in.dim() == 1) out = out.squeeze(-1);
  return out;
}

}  // namespace mpigrad::core
