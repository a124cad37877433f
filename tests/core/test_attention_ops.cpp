// The attention path's ops: matmul on the [B, H, T, D] head views that exporters take of a
// [B, T, H*D] projection (two batch strides, read in place by a loop of strided batched GEMMs),
// checked against the same product on dense copies, forward and backward; and the fused
// softmax(scale * x + mask) against the separate mul, add and softmax it replaces, bit for bit,
// with finite differences and second derivatives.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/linalg.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/ops/softmax.h"
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

// ---- softmax(scale * x + mask), fused --------------------------------------------------------

namespace {

// Scores with a spread of magnitudes, and masks holding 0 and a large negative value (the
// exporters' causal masks hold float's lowest or -inf).
Tensor scores(const Shape& shape, DType dtype, int seed) {
  std::vector<double> values(size_t(shape.numel()));
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(double(i) * 0.37 + seed) * 6.0;
  return Tensor::from_vector(values, shape).to(dtype);
}
Tensor mask_of(const Shape& shape, DType dtype, double lowest) {
  std::vector<double> values(size_t(shape.numel()));
  const int64_t cols = shape.back();
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t row = int64_t(i) / cols, col = int64_t(i) % cols;
    values[i] = col > row % (cols + 3) ? lowest : (col % 3 == 0 ? 0.0 : -0.5 * double(col % 3));
  }
  return Tensor::from_vector(values, shape).to(dtype);
}

// The separate ops an exporter writes: Mul by a constant, Add of the mask, Softmax.
Tensor unfused(const Tensor& x, double scale, const Tensor& mask) {
  const Tensor c = Tensor::from_vector(std::vector<double>{scale}, Shape{}).to(x.dtype());
  Tensor s = mul(x, c);
  if (mask.defined()) s = s + mask;
  return softmax(s, -1);
}

}  // namespace

TEST_CASE("softmax_scale_mask: the separate mul, add and softmax, bit for bit, each mask form") {
  // 37 columns: AVX2's 32 lanes and a scalar tail; B = 2, H = 3, T = 4 rows of queries.
  const Shape x_shape{2, 3, 4, 37};
  const std::vector<Shape> mask_shapes = {
      {},             // no mask (BERT)
      {4, 37},        // a [T, T] causal mask
      {1, 1, 4, 37},  // the same as GPT-2's exporter writes it
      {2, 1, 4, 37},  // per sequence
      {2, 1, 1, 37},  // a padding mask
      {2, 3, 4, 37},  // one per score
      {1, 3, 1, 37},  // two broadcast runs: the separate ops, same result
  };
  for (const DType dtype : {kFloat32, kFloat64}) {
    for (const double scale : {0.125, 1.0}) {
      for (const Shape& mask_shape : mask_shapes) {
        CAPTURE(dtype);
        CAPTURE(scale);
        CAPTURE(mask_shape);
        const Tensor mask = mask_shape.empty()
                                ? Tensor()
                                : mask_of(mask_shape, dtype, std::numeric_limits<float>::lowest());
        Tensor x = scores(x_shape, dtype, 1).set_requires_grad();
        Tensor x_ref = scores(x_shape, dtype, 1).set_requires_grad();
        const Tensor y = softmax_scale_mask(x, scale, mask);
        const Tensor y_ref = unfused(x_ref, scale, mask);
        CHECK(y.to_vector<double>() == y_ref.to_vector<double>());
        const Tensor g = scores(x_shape, dtype, 2);
        y.backward(g);
        y_ref.backward(g);
        CHECK(x.grad().to_vector<double>() == x_ref.grad().to_vector<double>());
      }
    }
  }
}

TEST_CASE("softmax_scale_mask: one node forward and back; a mask needing a gradient gets it") {
  const Tensor mask = mask_of({1, 1, 4, 8}, kFloat32, -1e9);
  Tensor x = scores({2, 2, 4, 8}, kFloat32, 3).set_requires_grad();
  const Tensor y = softmax_scale_mask(x, 0.5, mask);
  REQUIRE(y.grad_fn() != nullptr);
  CHECK(std::string(y.grad_fn()->name()) == "SoftmaxScaleMaskBackward");
  // A trainable mask (an ALiBi-like bias) goes through the separate ops, and so gets its
  // gradient: the sum over the broadcast dims.
  Tensor bias = mask_of({1, 1, 4, 8}, kFloat32, -3.0).set_requires_grad();
  Tensor bias_ref = bias.detach().clone().set_requires_grad();
  Tensor x_ref = x.detach().clone().set_requires_grad();
  const Tensor g = scores({2, 2, 4, 8}, kFloat32, 4);
  softmax_scale_mask(x, 0.5, bias).backward(g);
  unfused(x_ref, 0.5, bias_ref).backward(g);
  CHECK(bias.grad().to_vector<float>() == bias_ref.grad().to_vector<float>());
}

TEST_CASE("softmax_scale_mask: finite differences, and second derivatives as the separate ops'") {
  // Float64: d/dx of sum(w * y) against central differences.
  const Tensor mask = mask_of({3, 6}, kFloat64, -1e4);
  const Tensor w = scores({2, 3, 6}, kFloat64, 5);
  const Tensor x0 = scores({2, 3, 6}, kFloat64, 6);
  Tensor x = x0.clone().set_requires_grad();
  sum(softmax_scale_mask(x, 0.3, mask) * w).backward();
  const std::vector<double> analytic = x.grad().to_vector<double>();
  std::vector<double> base = x0.to_vector<double>();
  const double h = 1e-6;
  for (size_t i = 0; i < base.size(); ++i) {
    std::vector<double> plus = base, minus = base;
    plus[i] += h;
    minus[i] -= h;
    const double f_plus =
        sum(softmax_scale_mask(Tensor::from_vector(plus, x0.shape()), 0.3, mask) * w)
            .item<double>();
    const double f_minus =
        sum(softmax_scale_mask(Tensor::from_vector(minus, x0.shape()), 0.3, mask) * w)
            .item<double>();
    CHECK(analytic[i] == doctest::Approx((f_plus - f_minus) / (2 * h)).epsilon(1e-6));
  }
  // create_graph: the gradient is a graph, whose own gradient matches the separate ops'.
  Tensor xa = x0.clone().set_requires_grad(), xb = x0.clone().set_requires_grad();
  GradOptions options;
  options.create_graph = true;
  const Tensor ga = grad({sum(softmax_scale_mask(xa, 0.3, mask) * w)}, {xa}, {}, options)[0];
  const Tensor gb = grad({sum(unfused(xb, 0.3, mask) * w)}, {xb}, {}, options)[0];
  const std::vector<double> ga_values = ga.to_vector<double>(), gb_values = gb.to_vector<double>();
  for (size_t i = 0; i < ga_values.size(); ++i) {
    CHECK(ga_values[i] == doctest::Approx(gb_values[i]).epsilon(1e-12));
  }
  const std::vector<double> ha = grad({sum(ga * ga)}, {xa})[0].to_vector<double>();
  const std::vector<double> hb = grad({sum(gb * gb)}, {xb})[0].to_vector<double>();
  for (size_t i = 0; i < ha.size(); ++i) {
    CHECK(ha[i] == doctest::Approx(hb[i]).epsilon(1e-10).scale(1.0));
  }
}
