// A finite-difference gradient checker for the nn tests: float64 central differences of
// sum(f() * w) with fixed, distinct weights w, against the backward pass, for every element of
// every given leaf (layer inputs and module parameters alike).
//
// f reads the leaves by reference, so the checker perturbs them in place through their raw
// buffers (under NoGradGuard, where nothing records a graph), one element at a time.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::test {

inline std::vector<double> fd_weights(int64_t n, uint64_t seed) {
  std::vector<double> weights;
  uint64_t state = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int64_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const double u = double(state >> 11) / double(1ull << 53);
    weights.push_back((u < 0.5 ? -1.0 : 1.0) * (0.25 + 1.5 * std::abs(u - 0.5)));
  }
  return weights;
}

// A float64 tensor of `shape` with values from a fixed generator in [lo, hi).
inline core::Tensor fd_input(const core::Shape& shape, uint64_t seed, double lo = -1.0,
                             double hi = 1.0) {
  core::Generator generator(seed);
  core::Tensor t = core::rand(shape, generator, core::kFloat64);
  core::NoGradGuard no_grad;
  return (t * (hi - lo) + lo).detach();
}

// Returns "" when every gradient agrees with finite differences within atol + rtol*|numeric|,
// otherwise a description of the first disagreement.
inline std::string gradient_mismatch(const std::vector<core::Tensor>& leaves,
                                     const std::function<core::Tensor()>& f, uint64_t seed = 1,
                                     double step = 1e-6, double atol = 1e-6, double rtol = 1e-5) {
  for (const core::Tensor& leaf : leaves) {
    REQUIRE(leaf.dtype() == core::kFloat64);
    REQUIRE(leaf.is_contiguous());
    core::Tensor l = leaf;
    if (l.grad().defined()) l.set_grad(core::Tensor());
    if (!l.requires_grad()) l.set_requires_grad(true);
  }
  core::Tensor out = f();
  const std::vector<double> weights = fd_weights(out.numel(), seed);
  out.backward(core::Tensor::from_vector(weights, out.shape(), core::kFloat64));

  auto weighted = [&]() {
    core::NoGradGuard no_grad;
    const std::vector<double> values = f().to_vector<double>();
    double total = 0.0;
    for (size_t i = 0; i < values.size(); ++i) total += values[i] * weights[i];
    return total;
  };
  for (size_t k = 0; k < leaves.size(); ++k) {
    const core::Tensor& leaf = leaves[k];
    core::Tensor grad = leaf.grad();
    if (!grad.defined()) return "leaf " + std::to_string(k) + " got no gradient";
    if (!(grad.shape() == leaf.shape())) return "leaf " + std::to_string(k) + ": gradient shape";
    const std::vector<double> analytic = grad.to_vector<double>();
    double* data = static_cast<double*>(leaf.data_ptr());
    for (int64_t i = 0; i < leaf.numel(); ++i) {
      const double original = data[i];
      data[i] = original + step;
      const double plus = weighted();
      data[i] = original - step;
      const double minus = weighted();
      data[i] = original;
      const double numeric = (plus - minus) / (2 * step);
      if (!(std::abs(analytic[size_t(i)] - numeric) <= atol + rtol * std::abs(numeric))) {
        std::ostringstream message;
        message.precision(10);
        message << "leaf " << k << " element " << i << ": backward " << analytic[size_t(i)]
                << ", finite differences " << numeric;
        return message.str();
      }
    }
  }
  return "";
}

}  // namespace mpigrad::test
