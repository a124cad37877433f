// Shared by the CUDA test files: the skip rule and comparison helpers.
//
// Every GPU test case is declared with MPIGRAD_CUDA_TEST_CASE, which counts it. When no GPU is
// visible (or the build has no CUDA backend), main() runs none of them and prints one line,
// "N CUDA test cases skipped: no GPU visible", then exits with the code ctest reads as skipped.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_test_count.h"

namespace mpigrad::test {

// The first element that differs by more than atol + rtol * |expected|, or "" when all agree.
inline std::string first_mismatch(const std::vector<double>& actual,
                                  const std::vector<double>& expected, double atol, double rtol) {
  if (actual.size() != expected.size()) {
    return "size " + std::to_string(actual.size()) + " vs expected " +
           std::to_string(expected.size());
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    const double allowed = atol + rtol * std::abs(expected[i]);
    const bool both_nan = std::isnan(actual[i]) && std::isnan(expected[i]);
    if (!both_nan && !(std::abs(actual[i] - expected[i]) <= allowed)) {
      std::ostringstream out;
      out.precision(12);
      out << "element " << i << ": got " << actual[i] << ", expected " << expected[i];
      return out.str();
    }
  }
  return "";
}

}  // namespace mpigrad::test

#define MPIGRAD_CUDA_TEST_CASE(name)                       \
  static const int DOCTEST_ANONYMOUS(mpigrad_cuda_case_) = \
      ::mpigrad::test::register_gpu_test_case();           \
  TEST_CASE(name)
