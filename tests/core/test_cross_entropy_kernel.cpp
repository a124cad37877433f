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
