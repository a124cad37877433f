// Internal to kernels/cpu: the lane sums that batch norm (normalization.cpp) and layer norm
// (normalization_layer.cpp) accumulate their statistics and gradient sums in, and the dtype
// dispatch of both files' entry points.
#pragma once

#include <cstdint>

namespace mpigrad::kernels::cpu {

// Runs CALL with T = float or double for `dtype` and returns; any other dtype throws naming
// `kernel` (kernels/unsupported.h). For the normalization files' entry points, which take `dtype`.
#define MPIGRAD_NORM_DISPATCH(kernel, CALL) \
  switch (dtype) {                          \
    case DType::Float32: {                  \
      using T = float;                      \
      CALL;                                 \
      return;                               \
    }                                       \
    case DType::Float64: {                  \
      using T = double;                     \
      CALL;                                 \
      return;                               \
    }                                       \
    default:                                \
      throw_unsupported(kernel, "", dtype); \
  }

// Sums in double over kLanes independent running sums, element i of a row going to lane i % 8:
// one running sum is a single chain of dependent additions (4 cycles each), while the lanes
// vectorize and overlap - 4-5x faster. The order is fixed, so results still do not depend on the
// thread count.
constexpr int kLanes = 8;

struct LaneSums {
  double lane[kLanes] = {};
  double total() const {
    double pairs[kLanes / 2];
    for (int k = 0; k < kLanes / 2; ++k) pairs[k] = lane[k] + lane[k + kLanes / 2];
    return (pairs[0] + pairs[2]) + (pairs[1] + pairs[3]);
  }
};

// For i in [0, n): term(i) is added to sums[j] lane i % kLanes, for each of the sums term returns.
template <int Sums, typename Term>
void add_lanes(int64_t n, LaneSums (&sums)[Sums], Term term) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const auto terms = term(i + k);
      for (int j = 0; j < Sums; ++j) sums[j].lane[k] += terms[j];
    }
  }
  for (int k = 0; i < n; ++i, ++k) {
    const auto terms = term(i);
    for (int j = 0; j < Sums; ++j) sums[j].lane[k] += terms[j];
  }
}

}  // namespace mpigrad::kernels::cpu
