// Autocast (core/autocast.h): the op table's 16-bit cases against float32, the per-version cache
// of parameter copies, and the guard's scoping.
//
// Tolerances: a bf16 operand keeps 8 significant bits (relative rounding 2^-9), an fp16 one 11
// (2^-12); the table's inputs are O(1) with inner sizes of at most 3, so each output and each
// gradient element of a product may move by a few roundings of its largest term: atol = rtol =
// 2e-2 for bf16 and 3e-3 for fp16. Sums are fp32 in both, so the error does not grow with k
// beyond the operands' rounding (checked on a k = 1024 product below).
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "mpigrad/core/autocast.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "op_cases.h"

namespace {

using namespace mpigrad::core;  // NOLINT
using mpigrad::test::OpCase;
using mpigrad::test::OpInputs;

double tolerance_for(DType dtype) {
  return dtype == kBFloat16 ? 2e-2 : 3e-3;
}

bool runs_low(const OpCase& op) {
  const std::string first_word = op.name.substr(0, op.name.find(' '));
  for (const AutocastPolicy& entry : autocast_policy()) {
    if (entry.op == first_word) return entry.rule == AutocastRule::LowPrecision;
  }
  return false;
}

// Forward values and the gradients of sum(out * ramp) for the case's float32 inputs.
struct Result {
  std::vector<double> out;
  std::vector<std::vector<double>> grads;
  DType out_dtype = kFloat32;
};

Result run(const OpCase& op, std::optional<DType> autocast) {
  OpInputs inputs = mpigrad::test::make_inputs(op, kFloat32);
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!op.inputs[k].fixed_dtype) inputs[k].set_requires_grad(true);
  }
  Result result;
  Tensor out;
  {
    AutocastGuard guard(autocast);
    out = op.build(inputs);
  }
  result.out = out.to_vector<double>();
  result.out_dtype = out.dtype();
  std::vector<double> weights;
  for (int64_t i = 0; i < out.numel(); ++i) weights.push_back(0.5 + 0.25 * double(i % 5));
  out.backward(Tensor::from_vector(weights, out.shape(), kFloat32));
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!op.inputs[k].fixed_dtype) result.grads.push_back(inputs[k].grad().to_vector<double>());
  }
  return result;
}

void check_close(const std::vector<double>& actual, const std::vector<double>& expected,
                 double tolerance) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    INFO("element ", i, ": got ", actual[i], ", float32 gave ", expected[i]);
    CHECK(std::abs(actual[i] - expected[i]) <= tolerance + tolerance * std::abs(expected[i]));
  }
}

}  // namespace

TEST_CASE("op table: the cases autocast runs in 16 bits match float32, forward and backward") {
  int checked = 0;
  for (const OpCase& op : mpigrad::test::op_cases()) {
    if (!runs_low(op)) continue;
    const Result reference = run(op, std::nullopt);
    for (DType dtype : {kBFloat16, kFloat16}) {
      INFO("op case: ", op.name, " under autocast ", dtype_name(dtype));
      const Result low = run(op, dtype);
      CHECK(low.out_dtype == kFloat32);  // 16-bit operands, float32 result
      check_close(low.out, reference.out, tolerance_for(dtype));
      REQUIRE(low.grads.size() == reference.grads.size());
      for (size_t k = 0; k < low.grads.size(); ++k) {
        INFO("gradient of input ", k);
        check_close(low.grads[k], reference.grads[k], tolerance_for(dtype));
      }
      ++checked;
    }
  }
  CHECK(checked >= 20);  // every matmul case, twice
}

TEST_CASE("autocast matmul differs from float32 by operand rounding only, even at k = 1024") {
  const int64_t m = 8, k = 1024, n = 16;
  std::vector<float> a_values, b_values;
  for (int64_t i = 0; i < m * k; ++i) a_values.push_back(std::sin(0.37f * float(i)));
  for (int64_t i = 0; i < k * n; ++i) b_values.push_back(std::cos(0.11f * float(i)));
  const Tensor a = Tensor::from_vector(a_values, {m, k});
  const Tensor b = Tensor::from_vector(b_values, {k, n});
  const std::vector<float> exact = matmul(a, b).to_vector<float>();
  // The same product from operands rounded to bf16 first, summed in fp32: what autocast must give.
  const std::vector<float> rounded =
      matmul(a.to(kBFloat16).to(kFloat32), b.to(kBFloat16).to(kFloat32)).to_vector<float>();
  AutocastGuard guard(kBFloat16);
  const std::vector<float> low = matmul(a, b).to_vector<float>();
  double worst_rounded = 0, worst_exact = 0;
  for (size_t i = 0; i < low.size(); ++i) {
    worst_rounded = std::max(worst_rounded, double(std::abs(low[i] - rounded[i])));
    worst_exact = std::max(worst_exact, double(std::abs(low[i] - exact[i])));
  }
  CHECK(worst_rounded < 1e-3);  // fp32 accumulation: only the summation order differs
  CHECK(worst_exact < 0.5);     // sums of ~1024 terms of magnitude <= 1, operands off by 2^-9
}

TEST_CASE("autocast is scoped by its guard and leaves other ops and float64 alone") {
  CHECK_FALSE(autocast_dtype().has_value());
  const Tensor a = Tensor::from_vector(std::vector<double>{1.0 / 3, 2, 3, 4}, {2, 2});
  {
    AutocastGuard guard(kBFloat16);
    CHECK(autocast_dtype() == kBFloat16);
    {
      AutocastGuard off(kFloat32);
      CHECK_FALSE(autocast_dtype().has_value());
    }
    CHECK(autocast_dtype() == kBFloat16);
    // float64 operands are not cast: the exact third survives.
    CHECK(matmul(a, a).to_vector<double>()[0] == doctest::Approx(1.0 / 9 + 6.0).epsilon(1e-15));
    const Tensor f = a.to(kFloat32);
    CHECK(autocast_dtype_for("softmax", {&f}) == std::nullopt);
    CHECK(autocast_dtype_for("matmul", {&f}) == kBFloat16);
  }
  CHECK_FALSE(autocast_dtype().has_value());
  CHECK_THROWS_AS(AutocastGuard{kInt64}, Error);
}

TEST_CASE("a parameter is cast once per version of its storage, however often it is used") {
  clear_autocast_cache();
  Tensor w = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  w.set_requires_grad(true);
  const Tensor x = Tensor::from_vector(std::vector<float>{0.5f, -1, 2}, {1, 3});
  AutocastGuard guard(kBFloat16);
  // Linear's x W^T, three times (micro-batches, or a layer used twice): one cast of W.
  for (int use = 0; use < 3; ++use) sum(matmul(x, w.t())).backward();
  CHECK(autocast_cache_stats().casts == 1 + 3);  // W once, plus x (no grad) at every use
  CHECK(autocast_cache_stats().hits == 2);
  {
    NoGradGuard no_grad;  // an optimizer step: in place, so the version moves on
    w.sub_(w.grad() * 0.1);
  }
  const std::vector<float> after = matmul(x, w.t()).to_vector<float>();
  CHECK(autocast_cache_stats().casts == 1 + 3 + 2);  // the new W, and x
  // The stepped weights, not the cached old ones: W - 0.3 * (3 * x) row by row.
  const std::vector<float> expected = {0.5f * 0.85f - 1 * 2.3f + 2 * 2.4f,
                                       0.5f * 3.85f - 1 * 5.3f + 2 * 5.4f};
  CHECK(after[0] == doctest::Approx(expected[0]).epsilon(2e-2));
  CHECK(after[1] == doctest::Approx(expected[1]).epsilon(2e-2));
  clear_autocast_cache();
  CHECK(autocast_cache_stats().casts == 0);
}
