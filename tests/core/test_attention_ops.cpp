// The attention path's ops: matmul on the [B, H, T, D] head views that exporters take of a
// [B, T, H*D] projection (two batch strides, read in place by a loop of strided batched GEMMs),
// checked against the same product on dense copies, forward and backward.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/linalg.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/profiler.h"
#include "mpigrad/core/tensor.h"

namespace {

using namespace mpigrad::core;  // NOLINT

// Counts the spans of each name.
class CountSpans final : public ProfileSink {
 public:
  void record(const ProfileEvent& event) noexcept override { names.emplace_back(event.name); }
  int count(const std::string& name) const {
    int found = 0;
    for (const std::string& n : names) found += n == name ? 1 : 0;
    return found;
  }
  std::vector<std::string> names;
};

// Small integers, so every product is exact whichever order BLAS sums in.
Tensor integers(const Shape& shape, int seed) {
  std::vector<float> values(size_t(shape.numel()));
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(int(i * 7 + seed) % 5 - 2);
  return Tensor::from_vector<float>(values, shape);
}

constexpr int64_t kBatch = 3, kHeads = 4, kTokens = 5, kHeadDim = 2;

// GPT-2's split of the fused QKV projection [B, T, 3 * H * D]: the third `part` as [B, H, T, D],
// a view whose B and H dims step with two strides (T * 3HD and D).
Tensor head_view(const Tensor& qkv, int part) {
  const int64_t width = kHeads * kHeadDim;
  return qkv.slice(2, part * width, (part + 1) * width)
      .view({kBatch, kTokens, kHeads, kHeadDim})
      .permute({0, 2, 1, 3});
}

}  // namespace

TEST_CASE("matmul reads [B, H, T, D] head views in place: one strided call per sequence") {
  Tensor qkv = integers({kBatch, kTokens, 3 * kHeads * kHeadDim}, 1).set_requires_grad();
  Tensor dense = qkv.detach().clone().set_requires_grad();
  const Tensor weights = integers({kBatch, kHeads, kTokens, kTokens}, 3);
  const Tensor weights_v = integers({kBatch, kHeads, kTokens, kHeadDim}, 4);

  // Q K^T and (Q K^T) V from the views, with the profile of the forward products.
  Tensor q = head_view(qkv, 0), k = head_view(qkv, 1), v = head_view(qkv, 2);
  REQUIRE_FALSE(q.is_contiguous());
  Tensor scores, context;
  CountSpans spans;
  {
    ProfileSession session(spans);
    scores = matmul(q, k.transpose(-1, -2));
    context = matmul(scores, v);
  }
  CHECK(spans.count("copy") == 0);           // no head was copied out
  CHECK(spans.count("gemm") == 2 * kBatch);  // one call of H products per sequence and product

  // The same products on dense copies of the heads (one batch stride, one call each).
  Tensor qd = head_view(dense, 0).contiguous(), kd = head_view(dense, 1).contiguous();
  Tensor vd = head_view(dense, 2).contiguous();
  Tensor scores_dense = matmul(qd, kd.transpose(-1, -2));
  Tensor context_dense = matmul(scores_dense, vd);
  CHECK(scores.shape() == Shape{kBatch, kHeads, kTokens, kTokens});
  CHECK(scores.to_vector<float>() == scores_dense.to_vector<float>());
  CHECK(context.to_vector<float>() == context_dense.to_vector<float>());

  // Each product's backward node alone reads the saved views in place too: per sequence
  // dQ = dS K, dK^T = Q^T dS and dS = dC V^T; dV = S^T dC from the dense scores in one call.
  CountSpans backward_spans;
  {
    ProfileSession session(backward_spans);
    std::vector<Tensor> grads(2);
    context.grad_fn()->apply(weights_v, grads);
    scores.grad_fn()->apply(weights, grads);
  }
  CHECK(backward_spans.count("copy") == 0);
  CHECK(backward_spans.count("gemm") == 3 * kBatch + 1);

  // Through the whole graph the shared projection gets the same gradient as the dense heads'.
  (sum(scores * weights) + sum(context * weights_v)).backward();
  (sum(scores_dense * weights) + sum(context_dense * weights_v)).backward();
  CHECK(qkv.grad().to_vector<float>() == dense.grad().to_vector<float>());
}

TEST_CASE("matmul copies a batch whose outer loop would outnumber its strided calls") {
  // [B, H, T, D] with H = 1 folded in: batch dims [6, 2] where the inner run (2) is shorter than
  // the loop around it (6), so the operand is copied dense and one call spreads all 12 products.
  Tensor base = integers({2, 6, 3, 4}, 2).set_requires_grad();
  Tensor a = base.permute({1, 0, 2, 3});  // [6, 2, 3, 4], strides 12, 72, 4, 1
  Tensor b = integers({6, 2, 4, 3}, 5);
  CountSpans spans;
  Tensor out;
  {
    ProfileSession session(spans);
    out = matmul(a, b);
  }
  CHECK(spans.count("gemm") == 1);
  CHECK(out.to_vector<float>() == matmul(a.contiguous(), b).to_vector<float>());
  sum(out).backward();
  Tensor dense = base.detach().clone().set_requires_grad();
  sum(matmul(dense.permute({1, 0, 2, 3}).contiguous(), b)).backward();
  CHECK(base.grad().to_vector<float>() == dense.grad().to_vector<float>());
}
