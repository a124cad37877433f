// max_difference: the largest absolute elementwise difference of two tensors of equal size, on
// any device (both are copied to the host as float64). Shared by the tests that compare a
// distributed result with a reference computed another way.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "mpigrad/core/tensor.h"

namespace mpigrad::test {

inline double max_difference(const core::Tensor& a, const core::Tensor& b) {
  std::vector<double> x = a.to(core::kCPU).to_vector<double>();
  std::vector<double> y = b.to(core::kCPU).to_vector<double>();
  REQUIRE(x.size() == y.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(x[i] - y[i]));
  return worst;
}

}  // namespace mpigrad::test
