// kernels/cpu/vector_math.h's exp8 against std::exp: within 2 ulp wherever the result is a normal
// float, 0 below, +inf above, NaN kept; log1p8 against std::log1p. Skipped (with a line saying so)
// on a CPU without AVX2. And what they serve: Float32 GELU, softplus, sigmoid and SiLU (forward
// and backward, dense and strided) against a double reference, and Float32 softmax rows against
// Float64.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/softmax.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/kernels/cpu/vector_math.h"
#include "mpigrad/kernels/elementwise.h"

namespace {

#if defined(MPIGRAD_HAS_AVX2_MATH)
MPIGRAD_AVX2 void exp_of(const float* in, float* out) {
  _mm256_storeu_ps(out, mpigrad::kernels::cpu::vector_math::exp8(_mm256_loadu_ps(in)));
}

MPIGRAD_AVX2 void log1p_of(const float* in, float* out) {
  _mm256_storeu_ps(out, mpigrad::kernels::cpu::vector_math::log1p8(_mm256_loadu_ps(in)));
}

int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::abs(int64_t(ia) - int64_t(ib));
}

// The largest distance in ulps seen so far between a vector function and its double reference,
// and where.
struct WorstUlps {
  int64_t most = 0;
  float at = 0;

  // One 8-lane call on lanes in[k] = lane(x, k), each lane against reference(double).
  template <typename Lane, typename Vector, typename Reference>
  void add(float x, Lane lane, Vector vector, Reference reference) {
    float in[8], out[8];
    for (int k = 0; k < 8; ++k) in[k] = lane(x, k);
    vector(in, out);
    for (int k = 0; k < 8; ++k) {
      const int64_t u = ulps(out[k], float(reference(double(in[k]))));
      if (u > most) {
        most = u;
        at = in[k];
      }
    }
  }
};
#endif

// An elementwise op applied to x, with the gradient of sum(weights * op(x)): x is dense, or
// (strided) every other element of an [n, 2] buffer, which sends the op to its scalar loops.
struct UnaryRun {
  std::vector<float> forward, backward;
};

template <typename Op>
UnaryRun run_unary(Op op, const std::vector<float>& values, const std::vector<float>& weights,
                   bool strided) {
  using mpigrad::core::Tensor;
  const auto n = int64_t(values.size());
  Tensor x;
  if (strided) {
    std::vector<float> wide;
    for (float v : values) wide.insert(wide.end(), {v, 99.0f});
    x = Tensor::from_vector(wide, {n, 2}).set_requires_grad(true);
  } else {
    x = Tensor::from_vector(values, {n}).set_requires_grad(true);
  }
  Tensor y = op(strided ? x.select(1, 0) : x);
  y.backward(Tensor::from_vector(weights, {n}));
  const Tensor grad = x.grad();
  return {y.contiguous().to_vector<float>(),
          (strided ? grad.select(1, 0) : grad).contiguous().to_vector<float>()};
}

// n inputs evenly from low to high (mid when n is 1), and weights between 0.5 and 1.5.
void ramp(int64_t n, double low, double high, std::vector<float>& values,
          std::vector<float>& weights) {
  values.assign(size_t(n), 0.0f);
  weights.assign(size_t(n), 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    values[size_t(i)] =
        n == 1 ? float((low + high) / 2) : float(low + (high - low) * double(i) / double(n - 1));
    weights[size_t(i)] = float(1.0 + 0.5 * std::sin(double(i)));
  }
}

}  // namespace

TEST_CASE("vector_math: exp8 within 2 ulp of std::exp, and its edges") {
#if defined(MPIGRAD_HAS_AVX2_MATH)
  if (!mpigrad::kernels::cpu::has_avx2_fma()) {
    std::printf("vector_math: this CPU has no AVX2/FMA; exp8 is not used, not tested\n");
    return;
  }
  WorstUlps worst;
  for (float x = -87.0f; x < 88.3f; x += 0.000731f * (1.0f + std::abs(x))) {
    worst.add(
        x, [](float v, int k) { return v + 1e-4f * float(k); }, exp_of,
        [](double v) { return std::exp(v); });
  }
  INFO("worst ", worst.most, " ulp at x = ", worst.at);
  CHECK(worst.most <= 2);

  const float inf = std::numeric_limits<float>::infinity();
  const float in[8] = {0.0f, -inf, inf, std::nanf(""), -100.0f, 100.0f, 1.0f, -1.0f};
  float out[8];
  exp_of(in, out);
  CHECK(out[0] == 1.0f);
  CHECK(out[1] == 0.0f);
  CHECK(out[2] == inf);
  CHECK(std::isnan(out[3]));
  CHECK(out[4] == 0.0f);
  CHECK(out[5] == inf);
  CHECK(ulps(out[6], float(std::exp(1.0))) <= 2);
  CHECK(ulps(out[7], float(std::exp(-1.0))) <= 2);
#else
  std::printf("vector_math: not an x86-64 GCC/Clang build; exp8 is not used, not tested\n");
#endif
}

TEST_CASE("vector_math: log1p8 within 2 ulp of std::log1p from 1e-30 to 1e30, and its edges") {
#if defined(MPIGRAD_HAS_AVX2_MATH)
  if (!mpigrad::kernels::cpu::has_avx2_fma()) {
    std::printf("vector_math: this CPU has no AVX2/FMA; log1p8 is not used, not tested\n");
    return;
  }
  WorstUlps worst;
  // Tiny u (where 1 + u keeps none of u's bits), around 1 and the sqrt(2) split, and huge u.
  for (float u = 1e-30f; u < 1e30f; u *= 1.0007f) {
    worst.add(
        u, [](float v, int k) { return v * (1.0f + 1e-5f * float(k)); }, log1p_of,
        [](double v) { return std::log1p(v); });
  }
  INFO("worst ", worst.most, " ulp at u = ", worst.at);
  CHECK(worst.most <= 2);

  const float inf = std::numeric_limits<float>::infinity();
  const float in[8] = {0.0f, inf, std::nanf(""), 1.0f, 1e-45f, 0.41421356f, 0.41421360f, 3e38f};
  float out[8];
  log1p_of(in, out);
  CHECK(out[0] == 0.0f);
  CHECK(out[1] == inf);
  CHECK(std::isnan(out[2]));
  CHECK(ulps(out[3], float(std::log(2.0))) <= 1);
  CHECK(out[4] == 1e-45f);
  for (int k = 5; k < 8; ++k) CHECK(ulps(out[k], float(std::log1p(double(in[k])))) <= 2);
#else
  std::printf("vector_math: not an x86-64 GCC/Clang build; log1p8 is not used, not tested\n");
#endif
}

// softplus, sigmoid and SiLU and their derivatives in double: softplus as max(x, 0) +
// log1p(e^-|x|), sigmoid from e^-|x| on both sides, so that neither cancels nor overflows.
double activation_reference(mpigrad::kernels::UnaryOp op, double x, double* slope) {
  const double e = std::exp(-std::abs(x));
  const double s = x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
  switch (op) {
    case mpigrad::kernels::UnaryOp::Softplus:
      *slope = s;
      return std::max(x, 0.0) + std::log1p(e);
    case mpigrad::kernels::UnaryOp::Sigmoid:
      *slope = s * (1.0 - s);
      return s;
    default:  // Silu
      *slope = s * (1.0 + x * (1.0 - s));
      return x * s;
  }
}

// Float32 softplus, sigmoid and SiLU, forward and backward, dense (the AVX2 loops) and strided
// (the scalar ones), held to a few float roundings of the double reference. Inputs run from -80
// (where the results are tiny but still normal floats) to 80.
TEST_CASE("vector_math: Float32 softplus, sigmoid and SiLU against a double reference") {
  using namespace mpigrad::core;  // NOLINT
  using mpigrad::kernels::UnaryOp;
  for (UnaryOp op : {UnaryOp::Softplus, UnaryOp::Sigmoid, UnaryOp::Silu}) {
    const auto apply = [op](const Tensor& x) {
      return op == UnaryOp::Softplus ? softplus(x) : op == UnaryOp::Sigmoid ? sigmoid(x) : silu(x);
    };
    for (int64_t n : {1, 7, 8, 9, 33, 4001}) {
      std::vector<float> values, weights;
      ramp(n, n == 1 ? 0.5 : -80.0, n == 1 ? 0.5 : 80.0, values, weights);
      for (bool strided : {false, true}) {
        INFO(std::string(mpigrad::kernels::unary_op_name(op)), ", n ", n, ", strided ", strided);
        const auto [forward, backward] = run_unary(apply, values, weights, strided);
        int bad = 0;
        for (int64_t i = 0; i < n; ++i) {
          const auto k = size_t(i);
          double slope = 0;
          const double expected = activation_reference(op, double(values[k]), &slope);
          const double expected_grad = slope * double(weights[k]);
          // 1 - s in float is off by up to float's epsilon where s nears 1 (sigmoid's and SiLU's
          // slopes, in both paths), and SiLU's slope crosses 0 near x = -1.28, where
          // s (1 + x (1 - s)) cancels.
          const double absolute_grad = op == UnaryOp::Softplus ? 1e-37 : 3e-7;
          bad += std::abs(double(forward[k]) - expected) > 1e-6 * std::abs(expected) + 1e-37;
          bad += std::abs(double(backward[k]) - expected_grad) >
                 1e-6 * std::abs(expected_grad) + absolute_grad;
        }
        CHECK(bad == 0);
      }
    }
  }
}

TEST_CASE("vector_math: Float32 softplus, sigmoid and SiLU keep the infinities and NaN") {
  using namespace mpigrad::core;  // NOLINT
  const float inf = std::numeric_limits<float>::infinity();
  // Nine values: the dense loop's vector of eight and a tail of one.
  const std::vector<float> in = {inf,    -inf, std::nanf(""), 0.0f, -200.0f,
                                 200.0f, 1.0f, -1.0f,         3.0f};
  const Tensor x = Tensor::from_vector(in, {9});
  const auto softplus_y = softplus(x).to_vector<float>();
  CHECK(softplus_y[0] == inf);
  CHECK(softplus_y[1] == 0.0f);
  CHECK(std::isnan(softplus_y[2]));
  CHECK(softplus_y[3] == doctest::Approx(std::log(2.0)).epsilon(1e-7));
  CHECK(softplus_y[4] == 0.0f);
  CHECK(softplus_y[5] == 200.0f);
  const auto sigmoid_y = sigmoid(x).to_vector<float>();
  CHECK(sigmoid_y[0] == 1.0f);
  CHECK(sigmoid_y[1] == 0.0f);
  CHECK(std::isnan(sigmoid_y[2]));
  CHECK(sigmoid_y[3] == 0.5f);
  CHECK(sigmoid_y[4] == 0.0f);
  CHECK(sigmoid_y[5] == 1.0f);
  const auto silu_y = silu(x).to_vector<float>();
  CHECK(silu_y[0] == inf);
  CHECK(std::isnan(silu_y[1]));  // -inf * 0, as the scalar formula gives
  CHECK(std::isnan(silu_y[2]));
  CHECK(silu_y[5] == 200.0f);
}

// GELU and its derivative in double, in the forms that do not cancel for x far below 0 (where
// 1 + erf and 1 + tanh lose every digit even in double): erfc, and the tanh form as x sigmoid(2u).
double gelu_reference(bool tanh_form, double x, double* slope) {
  if (tanh_form) {
    const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
    const double s = 1.0 / (1.0 + std::exp(-2.0 * u));
    const double du = std::sqrt(2.0 / M_PI) * (1.0 + 3.0 * 0.044715 * x * x);
    *slope = s + 2.0 * x * s * (1.0 - s) * du;
    return x * s;
  }
  const double cdf = 0.5 * std::erfc(-x / std::sqrt(2.0));
  *slope = cdf + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
  return x * cdf;
}

TEST_CASE("vector_math: Float32 GELU forward and backward against a double reference") {
  using namespace mpigrad::core;  // NOLINT
  for (bool tanh_form : {false, true}) {
    const GeluApproximation form = tanh_form ? GeluApproximation::Tanh : GeluApproximation::None;
    for (int64_t n : {1, 7, 8, 9, 33, 1001}) {
      std::vector<float> values, weights;
      ramp(n, -12.0, 12.0, values, weights);
      for (bool strided : {false, true}) {
        INFO("tanh form ", tanh_form, ", n ", n, ", strided ", strided);
        // Strided runs the scalar loops, whose 1 + erf and 1 + tanh cancel below x = -4 or so;
        // they are held to an absolute bound there.
        const auto [forward, backward] =
            run_unary([form](const Tensor& x) { return gelu(x, form); }, values, weights, strided);
        // gelu' crosses 0 near x = -0.75, where cdf + x pdf cancels to float's absolute error.
        const double absolute = strided ? 1e-6 : 1e-30, absolute_grad = strided ? 1e-6 : 1e-7;
        int bad = 0;
        for (int64_t i = 0; i < n; ++i) {
          const auto k = size_t(i);
          double slope = 0;
          const double expected = gelu_reference(tanh_form, double(values[k]), &slope);
          const double expected_grad = slope * double(weights[k]);
          bad += std::abs(double(forward[k]) - expected) > 2e-5 * std::abs(expected) + absolute;
          bad += std::abs(double(backward[k]) - expected_grad) >
                 2e-5 * std::abs(expected_grad) + absolute_grad;
        }
        CHECK(bad == 0);
      }
    }
  }
}

TEST_CASE("vector_math: Float32 GELU keeps the scalar path's infinities and NaN") {
  using namespace mpigrad::core;  // NOLINT
  const float inf = std::numeric_limits<float>::infinity();
  for (GeluApproximation form : {GeluApproximation::None, GeluApproximation::Tanh}) {
    const std::vector<float> in = {inf, -inf, std::nanf(""), 0.0f, -0.0f, 1.0f, -1.0f, 3.0f, 40.0f};
    const auto y = gelu(Tensor::from_vector(in, {9}), form).to_vector<float>();
    CHECK(y[0] == inf);
    CHECK(std::isnan(y[1]));  // -inf * 0, as the formula gives in double
    CHECK(std::isnan(y[2]));
    CHECK(y[3] == 0.0f);
    CHECK(y[4] == 0.0f);
    CHECK(y[8] == 40.0f);
  }
}

// Attention's rows: lengths around the vector blocks, a causal mask's -inf entries, in place.
TEST_CASE("vector_math: Float32 softmax and log_softmax rows against double") {
  using namespace mpigrad::core;  // NOLINT
  for (int64_t cols : {1, 5, 8, 13, 64, 77}) {
    const int64_t rows = 4;
    std::vector<double> values(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < cols; ++j) {
        // Row r masks the columns after r * cols / 4 as a causal mask does (never column 0).
        values[size_t(r * cols + j)] =
            j > r * cols / 4 ? -INFINITY : 6.0 * std::sin(0.7 * double(j) + double(r));
      }
    }
    for (bool log : {false, true}) {
      INFO("cols ", cols, ", log ", log);
      const Tensor x32 = Tensor::from_vector(values, {rows, cols}, kFloat32);
      const Tensor x64 = Tensor::from_vector(values, {rows, cols}, kFloat64);
      const auto got =
          (log ? log_softmax(x32, 1) : softmax(x32, 1)).to(kFloat64).to_vector<double>();
      const auto want = (log ? log_softmax(x64, 1) : softmax(x64, 1)).to_vector<double>();
      int bad = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        if (std::isinf(want[i])) {
          bad += got[i] != want[i];
        } else {
          bad += std::abs(got[i] - want[i]) > 1e-6 * std::abs(want[i]) + 1e-7;
        }
      }
      CHECK(bad == 0);
    }
  }
}
