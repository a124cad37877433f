// Shared by the nn CUDA test files: the skip rule, and running a module (or any function of
// tensors) on the CPU and on CUDA with the same parameters and inputs, then comparing outputs,
// input gradients, parameter gradients and the state dict (running statistics included).
//
// Every case is declared with MPIGRAD_NN_CUDA_TEST_CASE, which counts it: when no GPU is
// visible, main() runs none and prints "N nn CUDA test cases skipped: no GPU visible".
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_test_count.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/nn/module.h"

namespace mpigrad::test {

using core::Tensor;

struct Tolerance {
  double atol, rtol;
};

inline Tolerance tolerance_for(core::DType dtype) {
  return dtype == core::kFloat64 ? Tolerance{1e-9, 1e-9} : Tolerance{2e-4, 2e-4};
}

inline std::vector<double> host_values(const Tensor& t) {
  return t.detach().to(core::kCPU, core::kFloat64).contiguous().to_vector<double>();
}

// "" when every element of `actual` is within atol + rtol*|expected| of `expected`.
inline std::string mismatch(const Tensor& actual, const Tensor& expected, Tolerance tol) {
  if (actual.shape() != expected.shape()) {
    std::ostringstream out;
    out << "shape " << actual.shape() << " vs expected " << expected.shape();
    return out.str();
  }
  const auto a = host_values(actual), e = host_values(expected);
  for (size_t i = 0; i < a.size(); ++i) {
    const bool both_nan = std::isnan(a[i]) && std::isnan(e[i]);
    if (!both_nan && !(std::abs(a[i] - e[i]) <= tol.atol + tol.rtol * std::abs(e[i]))) {
      std::ostringstream out;
      out.precision(12);
      out << "element " << i << ": got " << a[i] << ", expected " << e[i];
      return out.str();
    }
  }
  return "";
}

#define MPIGRAD_CHECK_CLOSE(what, actual, expected, tol)                                    \
  do {                                                                                      \
    const std::string mpigrad_mismatch_ = ::mpigrad::test::mismatch(actual, expected, tol); \
    INFO(what);                                                                             \
    CHECK_MESSAGE(mpigrad_mismatch_.empty(), mpigrad_mismatch_);                            \
  } while (0)

// A random input of `shape` drawn on the CPU from `seed`.
inline Tensor random_input(const core::Shape& shape, core::DType dtype, uint64_t seed) {
  core::Generator generator(seed);
  return core::randn(shape, generator, core::TensorOptions(dtype));
}

// Runs `make()`'s module on the CPU and a second `make()` moved to cuda:0 on the same input,
// `steps` times (so running statistics evolve), with loss sum(out * weights); compares the
// outputs, the input gradient, every parameter gradient and the state dict after each step.
inline void compare_module(const std::string& label,
                           const std::function<std::unique_ptr<nn::Module>()>& make,
                           const core::Shape& input_shape, core::DType dtype, bool training,
                           int steps = 1, Tolerance tol = {-1, -1}) {
  if (tol.atol < 0) tol = tolerance_for(dtype);
  INFO(label);
  auto cpu = make();
  auto gpu = make();
  cpu->to(dtype);
  gpu->to(core::cuda(0), dtype);
  cpu->train(training);
  gpu->train(training);
  for (int step = 0; step < steps; ++step) {
    INFO("step " << step);
    Tensor x = random_input(input_shape, dtype, 100 + uint64_t(step));
    x.set_requires_grad(true);
    Tensor xg = x.detach().to(core::cuda(0));
    xg.set_requires_grad(true);
    Tensor out = cpu->forward(x);
    Tensor out_g = gpu->forward(xg);
    MPIGRAD_CHECK_CLOSE("output", out_g, out, tol);
    Tensor weights = random_input(out.shape(), dtype, 900 + uint64_t(step));
    core::sum(out * weights).backward();
    core::sum(out_g * weights.to(core::cuda(0))).backward();
    MPIGRAD_CHECK_CLOSE("input gradient", xg.grad(), x.grad(), tol);
    const auto params_c = cpu->named_parameters();
    const auto params_g = gpu->named_parameters();
    REQUIRE(params_c.size() == params_g.size());
    for (size_t i = 0; i < params_c.size(); ++i) {
      INFO("gradient of " << params_c[i].first);
      REQUIRE(params_g[i].second.grad().defined() == params_c[i].second.grad().defined());
      if (params_c[i].second.grad().defined()) {
        MPIGRAD_CHECK_CLOSE("parameter gradient", params_g[i].second.grad(),
                            params_c[i].second.grad(), tol);
      }
    }
    const auto state_c = cpu->state_dict();
    const auto state_g = gpu->state_dict();
    REQUIRE(state_c.tensors().size() == state_g.tensors().size());
    for (size_t i = 0; i < state_c.tensors().size(); ++i) {
      MPIGRAD_CHECK_CLOSE(state_c.tensors()[i].first, state_g.tensors()[i].second,
                          state_c.tensors()[i].second, tol);
    }
    cpu->zero_grad();
    gpu->zero_grad();
  }
}

}  // namespace mpigrad::test

#define MPIGRAD_NN_CUDA_TEST_CASE(name)                       \
  static const int DOCTEST_ANONYMOUS(mpigrad_nn_cuda_case_) = \
      ::mpigrad::test::register_gpu_test_case();              \
  TEST_CASE(name)
