// The CPU fused cross-entropy kernel (kernels/cross_entropy.h) against log_softmax + NLL and the
// closed-form gradient, including ignored rows and bad targets. The CUDA version is compared
// with this one in tests/cuda.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "mpigrad/core/ops/softmax.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/kernels/cross_entropy.h"

namespace {

using namespace mpigrad::core;  // NOLINT

}  // namespace

TEST_CASE("cross_entropy kernel: loss is -log_softmax at the target, grad is scaled p - onehot") {
  const int64_t rows = 3, cols = 4;
  const std::vector<double> logits = {0.5, -1.0, 2.0,  0.0,  1.0, 1.0,
                                      1.0, 1.0,  -3.0, 0.25, 4.0, -0.5};
  const std::vector<int64_t> targets = {2, -100, 0};
  for (DType dtype : {kFloat32, kFloat64}) {
    INFO("dtype ", dtype_name(dtype));
    Tensor x = Tensor::from_vector(logits, {rows, cols}, dtype);
    const DType loss_dtype = dtype == kFloat64 ? kFloat64 : kFloat32;
    Tensor losses = empty({rows}, loss_dtype);
    Tensor grad = empty({rows, cols}, dtype);
    CHECK(mpigrad::kernels::cpu::cross_entropy(dtype, rows, cols, x.data_ptr(), targets.data(),
                                               -100, 0.5, losses.data_ptr(),
                                               grad.data_ptr()) == -1);
    const std::vector<double> log_p = log_softmax(x.to(kFloat64)).to_vector<double>();
    const std::vector<double> loss = losses.to_vector<double>();
    const std::vector<double> g = grad.to_vector<double>();
    const double tol = dtype == kFloat64 ? 1e-12 : 1e-6;
    for (int64_t r = 0; r < rows; ++r) {
      const bool ignored = targets[size_t(r)] == -100;
      CHECK(loss[size_t(r)] ==
            doctest::Approx(ignored ? 0.0 : -log_p[size_t(r * cols + targets[size_t(r)])])
                .epsilon(tol));
      for (int64_t j = 0; j < cols; ++j) {
        const double p = std::exp(log_p[size_t(r * cols + j)]);
        const double expected = ignored ? 0.0 : 0.5 * (p - (j == targets[size_t(r)] ? 1.0 : 0.0));
        CHECK(g[size_t(r * cols + j)] == doctest::Approx(expected).epsilon(tol).scale(1.0));
      }
    }
  }
}

TEST_CASE("cross_entropy kernel: forward only, bad targets, unsupported dtypes") {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 4.0f};
  float losses[2] = {-1.0f, -1.0f};
  const std::vector<int64_t> good = {1, 0};
  CHECK(mpigrad::kernels::cpu::cross_entropy(kFloat32, 2, 2, logits.data(), good.data(), -100, 1.0,
                                             losses, nullptr) == -1);
  CHECK(losses[0] == doctest::Approx(std::log(1.0 + std::exp(-1.0))));
  CHECK(losses[1] == doctest::Approx(std::log(1.0 + std::exp(1.0))));
  const std::vector<int64_t> bad = {1, 2};
  losses[0] = losses[1] = -1.0f;
  CHECK(mpigrad::kernels::cpu::cross_entropy(kFloat32, 2, 2, logits.data(), bad.data(), -100, 1.0,
                                             losses, nullptr) == 1);
  CHECK(losses[0] == -1.0f);  // nothing written
  const std::vector<int32_t> ints = {1, 2, 3, 4};
  CHECK_THROWS_AS(mpigrad::kernels::cpu::cross_entropy(kInt32, 2, 2, ints.data(), good.data(), -100,
                                                       1.0, losses, nullptr),
                  std::invalid_argument);
}

// The Float32 rows run in vector code (kernels/cpu/vector_math.h) on AVX2 CPUs: every row
// length around the 8- and 32-float blocks, GPT-2's 50,257-token vocabulary, an ignored row and
// a target in the tail, against the same formulas in double.
TEST_CASE("cross_entropy kernel: Float32 rows of every length against a double reference") {
  for (int64_t cols : {1, 2, 7, 8, 9, 31, 32, 33, 100, 50257}) {
    INFO("cols ", cols);
    const int64_t rows = 3;
    std::vector<float> logits(size_t(rows * cols));
    for (size_t i = 0; i < logits.size(); ++i) {
      logits[i] = float(8.0 * std::sin(0.37 * double(i) + 0.1 * double(cols)));
    }
    const std::vector<int64_t> targets = {cols - 1, -100, cols / 2};
    std::vector<float> losses(size_t(rows), -1.0f), grad(logits.size(), -1.0f);
    const double scale = 0.25;
    REQUIRE(mpigrad::kernels::cpu::cross_entropy(kFloat32, rows, cols, logits.data(),
                                                 targets.data(), -100, scale, losses.data(),
                                                 grad.data()) == -1);
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = logits.data() + r * cols;
      const int64_t t = targets[size_t(r)];
      if (t == -100) {
        CHECK(losses[size_t(r)] == 0.0f);
        for (int64_t j = 0; j < cols; ++j) CHECK(grad[size_t(r * cols + j)] == 0.0f);
        continue;
      }
      double row_max = -INFINITY, sum = 0;
      for (int64_t j = 0; j < cols; ++j) row_max = std::max(row_max, double(x[j]));
      for (int64_t j = 0; j < cols; ++j) sum += std::exp(double(x[j]) - row_max);
      CHECK(losses[size_t(r)] ==
            doctest::Approx(row_max + std::log(sum) - double(x[t])).epsilon(1e-5));
      double worst = 0;
      for (int64_t j = 0; j < cols; ++j) {
        const double p = std::exp(double(x[j]) - row_max) / sum;
        const double expected = scale * (p - (j == t ? 1.0 : 0.0));
        worst = std::max(worst, std::abs(double(grad[size_t(r * cols + j)]) - expected) /
                                    std::max(std::abs(expected), 1e-30));
      }
      CHECK(worst < 1e-5);
    }
  }
}

TEST_CASE("cross_entropy kernel: -inf logits (masked classes) get probability 0") {
  const float inf = INFINITY;
  const std::vector<float> logits = {-inf, 0.0f, -inf, 1.0f, -inf, -inf, -inf, -inf, -inf, 2.0f};
  const std::vector<int64_t> targets = {9};
  float loss = -1.0f;
  std::vector<float> grad(logits.size(), -1.0f);
  REQUIRE(mpigrad::kernels::cpu::cross_entropy(kFloat32, 1, 10, logits.data(), targets.data(), -100,
                                               1.0, &loss, grad.data()) == -1);
  const double sum = std::exp(-2.0) + std::exp(-1.0) + 1.0;
  CHECK(loss == doctest::Approx(std::log(sum)).epsilon(1e-6));
  for (size_t j : {0u, 2u, 4u, 5u, 6u, 7u, 8u}) CHECK(grad[j] == 0.0f);
  CHECK(grad[9] == doctest::Approx(1.0 / sum - 1.0).epsilon(1e-6));
}
