// Checked arithmetic for sizes that come from users, configs and files.
//
// An extent, a batch size or a layer width is only as trustworthy as the file or config it came
// from: a product of such sizes that wraps around int64 is undefined behaviour, and in practice a
// small or negative number that a later allocation or loop believes. Every such product or sum
// goes through these functions instead, and one that does not fit is a core::Error whose message
// starts with what the caller says was being computed ("[model] hidden", "file.h5:/x extents").
// The message parts are only put together when the check fails, so the checks cost one
// overflow-flag test on the hot paths (Shape::numel is one of them).
#pragma once

#include <cstdint>

#include "mpigrad/core/error.h"

namespace mpigrad::core {

// a * b; throws core::Error "<what...>: a x b does not fit in 64 bits" when it overflows.
template <typename... What>
int64_t checked_mul(int64_t a, int64_t b, const What&... what) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) [[unlikely]] {
    fail(what..., ": ", a, " x ", b, " does not fit in 64 bits");
  }
  return product;
}

// a + b; throws core::Error "<what...>: a + b does not fit in 64 bits" when it overflows.
template <typename... What>
int64_t checked_add(int64_t a, int64_t b, const What&... what) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) [[unlikely]] {
    fail(what..., ": ", a, " + ", b, " does not fit in 64 bits");
  }
  return sum;
}

// ceil(a / b) for a >= 0 and b >= 1, without the (a + b - 1) that overflows for large a or b.
inline int64_t ceil_div(int64_t a, int64_t b) {
  return a / b + (a % b != 0 ? 1 : 0);
}

}  // namespace mpigrad::core
