// Op tests driven by the table in op_cases.h: every case is checked forward (float64 and float32)
// against its hand-computed values, and every differentiable case has its backward checked
// against central finite differences computed in float64. A few behaviours that a table row
// cannot express (tie-breaking of gradients, promotion, sum_to) have their own cases below.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "op_cases.h"

namespace {

using namespace mpigrad::core;  // NOLINT
using mpigrad::test::OpCase;
using mpigrad::test::OpInputs;

// Describes the first element of `actual` that differs from `expected` by more than
// atol + rtol * |expected|, or returns "" when all agree.
std::string first_mismatch(const std::vector<double>& actual, const std::vector<double>& expected,
                           double atol, double rtol) {
  if (actual.size() != expected.size()) {
    return "size " + std::to_string(actual.size()) + " vs expected " +
           std::to_string(expected.size());
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    const double allowed = atol + rtol * std::abs(expected[i]);
    if (!(std::abs(actual[i] - expected[i]) <= allowed)) {
      std::ostringstream out;
      out.precision(12);
      out << "element " << i << ": got " << actual[i] << ", expected " << expected[i];
      return out.str();
    }
  }
  return "";
}

// Fixed pseudo-random weights in [-1, -0.25] U [0.25, 1]: the gradient check differentiates
// sum(out * w), so every output element contributes with a distinct, non-zero weight.
std::vector<double> fixed_weights(int64_t n, uint64_t seed) {
  std::vector<double> weights;
  uint64_t state = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int64_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const double u = double(state >> 11) / double(1ull << 53);
    weights.push_back((u < 0.5 ? -1.0 : 1.0) * (0.25 + 1.5 * std::abs(u - 0.5)));
  }
  return weights;
}

bool is_float_input(const mpigrad::test::OpInput& in) {
  return !in.fixed_dtype.has_value();
}

// sum(build(values) * weights), evaluated without recording a graph.
double weighted_output(const OpCase& op, const std::vector<std::vector<double>>& values,
                       const std::vector<double>& weights) {
  NoGradGuard no_grad;
  const std::vector<double> out =
      op.build(mpigrad::test::make_inputs(op, kFloat64, &values)).to_vector<double>();
  double total = 0.0;
  for (size_t i = 0; i < out.size(); ++i) total += out[i] * weights[i];
  return total;
}

void check_forward(const OpCase& op, DType dtype, double tolerance) {
  INFO("op case: ", op.name, ", dtype ", dtype_name(dtype));
  try {
    Tensor out = op.build(mpigrad::test::make_inputs(op, dtype));
    CHECK(out.shape() == op.expected_shape);
    CHECK(out.dtype() == op.output_dtype.value_or(dtype));
    const std::string mismatch =
        first_mismatch(out.to_vector<double>(), op.expected, tolerance, tolerance);
    CHECK_MESSAGE(mismatch.empty(), mismatch);
  } catch (const std::exception& e) {
    FAIL_CHECK("threw: " << e.what());
  }
}

}  // namespace

TEST_CASE("op table: forward values match the hand-computed ones") {
  for (const OpCase& op : mpigrad::test::op_cases()) {
    // The table's values carry 10 significant digits; float32 adds its own rounding.
    check_forward(op, kFloat64, 1e-8);
    check_forward(op, kFloat32, 2e-5);
  }
}

TEST_CASE("op table: gradients match float64 central finite differences") {
  constexpr double kStep = 1e-6;
  constexpr double kTolerance = 1e-6;
  uint64_t seed = 0;
  for (const OpCase& op : mpigrad::test::op_cases()) {
    ++seed;
    if (!op.differentiable) continue;
    INFO("op case: ", op.name);
    try {
      OpInputs inputs = mpigrad::test::make_inputs(op, kFloat64);
      for (size_t k = 0; k < inputs.size(); ++k) {
        if (is_float_input(op.inputs[k])) inputs[k].set_requires_grad(true);
      }
      Tensor out = op.build(inputs);
      REQUIRE(out.requires_grad());
      const std::vector<double> weights = fixed_weights(out.numel(), seed);
      // backward(w) is the gradient of sum(out * w) without adding ops of our own to the graph.
      out.backward(Tensor::from_vector(weights, out.shape(), kFloat64));

      std::vector<std::vector<double>> values;
      for (const auto& in : op.inputs) values.push_back(in.values);
      for (size_t k = 0; k < inputs.size(); ++k) {
        if (!is_float_input(op.inputs[k])) continue;
        INFO("input ", k);
        const Tensor grad = inputs[k].grad();
        REQUIRE(grad.defined());
        CHECK(grad.shape() == inputs[k].shape());
        std::vector<double> numeric;
        for (size_t i = 0; i < values[k].size(); ++i) {
          const double original = values[k][i];
          values[k][i] = original + kStep;
          const double plus = weighted_output(op, values, weights);
          values[k][i] = original - kStep;
          const double minus = weighted_output(op, values, weights);
          values[k][i] = original;
          numeric.push_back((plus - minus) / (2 * kStep));
        }
        const std::string mismatch =
            first_mismatch(grad.to_vector<double>(), numeric, kTolerance, kTolerance);
        CHECK_MESSAGE(mismatch.empty(), mismatch);
      }
    } catch (const std::exception& e) {
      FAIL_CHECK("threw: " << e.what());
    }
  }
}

TEST_CASE("forward-only ops do not require grad even with inputs that do") {
  Tensor x = Tensor::from_vector<double>({1, 5, 3}, {3}).set_requires_grad(true);
  CHECK_FALSE(gt(x, x * 0.5).requires_grad());
  CHECK_FALSE(argmax(x, 0).requires_grad());
  CHECK_FALSE(max(x, 0).indices.requires_grad());
  CHECK(max(x, 0).values.requires_grad());
}

TEST_CASE("maximum and minimum split the gradient at ties") {
  Tensor a = Tensor::from_vector<double>({1.0, 2.0, 3.0}, {3}).set_requires_grad(true);
  Tensor b = Tensor::from_vector<double>({1.0, 5.0, 0.0}, {3}).set_requires_grad(true);
  sum(maximum(a, b)).backward();
  CHECK(a.grad().to_vector<double>() == std::vector<double>{0.5, 0.0, 1.0});
  CHECK(b.grad().to_vector<double>() == std::vector<double>{0.5, 1.0, 0.0});

  Tensor c = Tensor::from_vector<double>({1.0, 2.0, 3.0}, {3}).set_requires_grad(true);
  Tensor d = Tensor::from_vector<double>({1.0, 5.0, 0.0}, {3}).set_requires_grad(true);
  sum(minimum(c, d)).backward();
  CHECK(c.grad().to_vector<double>() == std::vector<double>{0.5, 1.0, 0.0});
  CHECK(d.grad().to_vector<double>() == std::vector<double>{0.5, 0.0, 1.0});
}

TEST_CASE("max and min along a dim pick and differentiate the first extreme element") {
  Tensor x = Tensor::from_vector<double>({2, 7, 7, 1, 4, 4, 4, 0}, {2, 4}).set_requires_grad(true);
  ValuesIndices top = max(x, 1);
  CHECK(top.values.to_vector<double>() == std::vector<double>{7, 4});
  CHECK(top.indices.to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  CHECK(argmax(x, 1).to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  sum(top.values).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 1, 0, 0, 1, 0, 0, 0});

  Tensor y = Tensor::from_vector<double>({3, 1, 1, 5}, {4}).set_requires_grad(true);
  ValuesIndices bottom = min(y, 0);
  CHECK(bottom.values.item<double>() == 1.0);
  CHECK(bottom.indices.item<int64_t>() == 1);
  bottom.values.backward();
  CHECK(y.grad().to_vector<double>() == std::vector<double>{0, 1, 0, 0});
}

TEST_CASE("relu, abs and clamp have the documented gradients away from their kinks") {
  Tensor x = Tensor::from_vector<double>({-2.0, -0.5, 0.5, 3.0}, {4}).set_requires_grad(true);
  sum(clamp(x, -1.0, 1.0) + relu(x) + abs(x)).backward();
  // clamp: 1 inside the bounds, 0 where clamped; relu: step; abs: sign.
  CHECK(x.grad().to_vector<double>() ==
        std::vector<double>{0 + 0 - 1, 1 + 0 - 1, 1 + 1 + 1, 0 + 1 + 1});
}

TEST_CASE("binary ops promote dtypes; a scalar takes the tensor's dtype") {
  Tensor f32 = ones({2}, kFloat32);
  Tensor f64 = ones({2}, kFloat64);
  Tensor i64 = ones({2}, kInt64);
  CHECK((f32 + f64).dtype() == kFloat64);
  CHECK((i64 * f32).dtype() == kFloat32);
  CHECK((i64 + i64).dtype() == kInt64);
  CHECK((f32 * 2.5).dtype() == kFloat32);
  CHECK((f32 * 2.5).to_vector<float>() == std::vector<float>{2.5f, 2.5f});
  CHECK((i64 + i64).to_vector<int64_t>() == std::vector<int64_t>{2, 2});
}

TEST_CASE("integer and Bool sums are Int64") {
  Tensor flags = Tensor::from_vector<bool>({true, false, true, true}, {4});
  Tensor total = sum(flags);
  CHECK(total.dtype() == kInt64);
  CHECK(total.item<int64_t>() == 3);
  Tensor ints = Tensor::from_vector<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor rows = sum(ints, {1});
  CHECK(rows.dtype() == kInt64);
  CHECK(rows.to_vector<int64_t>() == std::vector<int64_t>{6, 15});
}

TEST_CASE("sum_to reduces a broadcast gradient back to the operand's shape") {
  Tensor grad = Tensor::from_vector(mpigrad::test::ramp(24, 1.0, 0.0), {2, 3, 4}, kFloat64);
  Tensor reduced = sum_to(grad, {3, 1});
  CHECK(reduced.shape() == Shape{3, 1});
  // Row r collects elements b*12 + r*4 + c for b in {0,1}, c in {0..3}.
  CHECK(reduced.to_vector<double>() == std::vector<double>{60, 92, 124});
  CHECK(sum_to(grad, {4}).to_vector<double>() == std::vector<double>{60, 66, 72, 78});
  CHECK(sum_to(grad, {2, 3, 4}).to_vector<double>() == grad.to_vector<double>());
}

TEST_CASE("sums over leading and trailing axes around kept ones, as a bias gradient takes") {
  // [2, 3, 4, 5] over {0, 2, 3} (trailing rows of 20: two passes, no copy), over {0, 3} (rows
  // of 5: the permuted copy), and [3, 2, 40] over {0, 2}; integers, so every order is exact.
  for (DType dtype : {kFloat32, kFloat64}) {
    CAPTURE(dtype);
    Tensor x = Tensor::from_vector(mpigrad::test::ramp(120, 1.0, 1.0), {2, 3, 4, 5}, dtype);
    std::vector<double> bias(3, 0.0), rows(12, 0.0);
    for (int n = 0; n < 2; ++n)
      for (int c = 0; c < 3; ++c)
        for (int i = 0; i < 20; ++i) {
          bias[size_t(c)] += double(((n * 3 + c) * 20 + i) + 1);
          rows[size_t(c * 4 + i / 5)] += double(((n * 3 + c) * 20 + i) + 1);
        }
    CHECK(sum(x, {0, 2, 3}).to_vector<double>() == bias);
    CHECK(sum(x, {0, 2, 3}).dtype() == dtype);
    CHECK(sum(x, {0, 2, 3}, true).shape() == Shape{1, 3, 1, 1});
    CHECK(sum(x, {0, 3}).to_vector<double>() == rows);
    const std::vector<double> means = mean(x, {0, 2, 3}).to_vector<double>();
    for (size_t c = 0; c < 3; ++c) CHECK(means[c] == doctest::Approx(bias[c] / 40));
    Tensor y = Tensor::from_vector(mpigrad::test::ramp(240, 1.0, 0.0), {3, 2, 40}, dtype);
    CHECK(sum(y, {0, 2}).to_vector<double>() ==
          std::vector<double>{double(sum(y.select(1, 0)).item<double>()),
                              double(sum(y.select(1, 1)).item<double>())});
    // A view that is not contiguous reads right, and the gradient spreads back.
    Tensor z = x.transpose(2, 3).detach().set_requires_grad(true);
    CHECK(sum(z, {0, 2, 3}).to_vector<double>() == bias);
    sum(mul(sum(z, {0, 2, 3}), Tensor::from_vector<double>({1, 2, 3}, {3}).to(dtype))).backward();
    CHECK(z.grad().select(1, 2).to_vector<double>() == std::vector<double>(40, 3.0));
  }
}

TEST_CASE("float32 sums accumulate in double") {
  // A float accumulator drifts by about 1% on this sum; a double one is exact to ~1e-9.
  Tensor x = full({1000000}, 0.1, kFloat32);
  const double expected = 1e6 * double(0.1f);
  CHECK(std::abs(sum(x).item<double>() - expected) < 0.05);
  CHECK(std::abs(mean(x).item<double>() - double(0.1f)) < 1e-6);
}

TEST_CASE("softmax rows sum to one and log_softmax is its log") {
  std::vector<double> logits;
  for (int i = 0; i < 5 * 7; ++i) logits.push_back(std::sin(i * 1.3) * 4.0);
  Tensor x = Tensor::from_vector(logits, {5, 7}, kFloat32);
  const std::vector<double> rows = sum(softmax(x), {1}).to_vector<double>();
  for (double r : rows) CHECK(r == doctest::Approx(1.0).epsilon(1e-6));
  const std::vector<double> p = softmax(x).to_vector<double>();
  const std::vector<double> lp = log_softmax(x).to_vector<double>();
  for (size_t i = 0; i < p.size(); ++i) {
    CHECK(std::log(p[i]) == doctest::Approx(lp[i]).epsilon(1e-5));
  }
}

TEST_CASE("matmul gradients come out in their operand's layout (W of x W^T stays row-major)") {
  // Linear computes x W^T. MatmulBackward must hand W^T's gradient over column-major like W^T,
  // so that W's gradient is row-major like W: a transposed one makes every accumulation into
  // W.grad and every DDP bucket copy walk memory a whole row at a time (3x slower steps).
  Tensor w = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}).set_requires_grad();
  Tensor x = Tensor::from_vector<float>({1, 0, 2, -1, 3, 1}, {2, 3});
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2}).set_requires_grad();
  Tensor y = matmul(a.t(), w.t());  // both operands column-major views
  std::vector<Tensor> grads(2);
  y.grad_fn()->apply(ones({2, 2}), grads);
  CHECK(grads[0].strides() == a.t().strides());
  CHECK(grads[1].strides() == w.t().strides());
  // Through the whole graph the values are unchanged: d sum((x + A^T) W^T) / dW is the column
  // sums of x + A^T for each row of W, and dA[k][i] = sum_j W[j][k].
  sum(matmul(x, w.t()) + y).backward();
  CHECK(w.grad().to_vector<float>() == std::vector<float>{3, 10, 14, 3, 10, 14});
  CHECK(a.grad().to_vector<float>() == std::vector<float>{5, 5, 7, 7, 9, 9});
}

TEST_CASE("matmul [..., m, k] x [k, n] folds the batch into rows: one GEMM, no broadcast weight") {
  // ConvNeXt's Linear on NHWC, MatMul(x, W^T): broadcast over the batch, W^T would be expanded,
  // its gradient a [N, H, C, 4C] stack copied contiguous and summed. Folded, the product is one
  // [N*H*W, C] x [C, 4C] GEMM behind a view, whether x is contiguous or a permuted NCHW tensor
  // (which the fold's reshape copies). Small integers, so every value is exact.
  std::vector<float> x_values(48), w_values(20);
  for (int i = 0; i < 48; ++i) x_values[size_t(i)] = float(i % 7 - 3);
  for (int i = 0; i < 20; ++i) w_values[size_t(i)] = float(i % 5 - 2);
  Tensor nchw = Tensor::from_vector<float>(x_values, {2, 4, 3, 2}).set_requires_grad();
  for (bool permuted : {false, true}) {
    Tensor w = Tensor::from_vector<float>(w_values, {5, 4}).set_requires_grad();
    Tensor x = permuted ? nchw.permute({0, 2, 3, 1}) : nchw.detach().view({2, 3, 2, 4});
    Tensor y = matmul(x, w.t());
    CHECK(y.shape() == Shape{2, 3, 2, 5});
    CHECK(std::string(y.grad_fn()->name()) == "ReshapeBackward");  // the GEMM sits behind a view
    const std::vector<float> xs = x.contiguous().to_vector<float>();
    const std::vector<float> ys = y.to_vector<float>();
    for (int row = 0; row < 12; ++row) {
      for (int j = 0; j < 5; ++j) {
        float expected = 0;
        for (int c = 0; c < 4; ++c)
          expected += xs[size_t(row * 4 + c)] * w_values[size_t(j * 4 + c)];
        CHECK(ys[size_t(row * 5 + j)] == expected);
      }
    }
    sum(y).backward();
    // d sum(x W^T) / dW[j][c] = the sum of column c of x over all 12 rows, for every j.
    std::vector<float> column_sums(4, 0.0f);
    for (int row = 0; row < 12; ++row) {
      for (int c = 0; c < 4; ++c) column_sums[size_t(c)] += xs[size_t(row * 4 + c)];
    }
    CHECK(w.grad().strides() == w.strides());
    const std::vector<float> w_grad = w.grad().to_vector<float>();
    for (int j = 0; j < 5; ++j) {
      for (int c = 0; c < 4; ++c) CHECK(w_grad[size_t(j * 4 + c)] == column_sums[size_t(c)]);
    }
  }
  // d sum(x W^T) / dx[.., c] = sum_j W[j][c], in NCHW for the permuted input.
  const std::vector<float> x_grad = nchw.grad().to_vector<float>();
  for (int i = 0; i < 48; ++i) {
    const int c = (i / 6) % 4;
    float expected = 0;
    for (int j = 0; j < 5; ++j) expected += w_values[size_t(j * 4 + c)];
    CHECK(x_grad[size_t(i)] == expected);
  }
}

TEST_CASE("binary ops with an operand fixed along each row (a broadcast bias) on either side") {
  // [2, 3, 4] against [1, 3, 1]: after coalescing, every row of 4 sees one value of the other
  // operand, which the kernels hoist out of the row; sub checks the operand order both ways.
  std::vector<float> values(24);
  for (int i = 0; i < 24; ++i) values[size_t(i)] = float(i);
  Tensor x = Tensor::from_vector<float>(values, {2, 3, 4});
  Tensor bias = Tensor::from_vector<float>({100, 200, 300}, {1, 3, 1});
  std::vector<float> x_minus_bias = (x - bias).to_vector<float>();
  std::vector<float> bias_minus_x = (bias - x).to_vector<float>();
  for (int i = 0; i < 24; ++i) {
    const float b = 100.0f * float((i / 4) % 3 + 1);
    CHECK(x_minus_bias[size_t(i)] == float(i) - b);
    CHECK(bias_minus_x[size_t(i)] == b - float(i));
  }
}
