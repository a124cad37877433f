// Checked size arithmetic: products and sums of sizes from users, configs and files that do not
// fit in int64 are core::Errors naming what was computed, never a wrapped (undefined) value.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "../error_message.h"
#include "mpigrad/core/checked_math.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/shape.h"
#include "mpigrad/core/tensor.h"

namespace {

using namespace mpigrad::core;  // NOLINT

using mpigrad::test::error_message;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

}  // namespace

TEST_CASE("checked math: products and sums that fit, and those that do not") {
  CHECK(checked_mul(int64_t(1) << 31, int64_t(1) << 31, "test") == int64_t(1) << 62);
  CHECK(checked_add(kMax - 1, 1, "test") == kMax);
  CHECK(checked_mul(0, kMax, "test") == 0);
  std::string error =
      error_message([] { checked_mul(int64_t(1) << 32, int64_t(1) << 32, "[model] hidden"); });
  CHECK(contains(error, "[model] hidden"));
  CHECK(contains(error, "4294967296 x 4294967296"));
  error = error_message([] { checked_add(kMax, 1, "[train] batch_size ", 7); });
  CHECK(contains(error, "[train] batch_size 7"));
  CHECK(contains(error, "9223372036854775807 + 1"));
  // Rounding up a division must not overflow either (batches of a batch_size near the maximum).
  CHECK(ceil_div(kMax, kMax - 1) == 2);
  CHECK(ceil_div(1, kMax) == 1);
  CHECK(ceil_div(0, 5) == 0);
}

TEST_CASE("checked math: Shape::numel, strides and tensor bytes throw on overflow") {
  const int64_t big = int64_t(1) << 31;
  CHECK(Shape{2, 1, big, big / 2}.numel() == int64_t(1) << 62);
  std::string error = error_message([&] { (void)Shape{2, 1, big, big}.numel(); });
  CHECK(contains(error, "[2, 1, 2147483648, 2147483648]"));
  CHECK(contains(error, "overflow"));
  error = error_message([&] { (void)contiguous_strides(Shape{4, big, big}); });
  CHECK(contains(error, "[4, 2147483648, 2147483648]"));
  // 2^61 float32 elements: the count fits, the bytes do not.
  error = error_message([] { (void)Tensor::empty(Shape{int64_t(1) << 61}, kFloat32); });
  CHECK(contains(error, "[2305843009213693952]"));
  CHECK(contains(error, "bytes"));
}

TEST_CASE("checked math: a tensor too large to allocate is an AllocationError naming the bytes") {
  // 2^50 bytes (1 PiB) fits in int64 but in no machine's memory (nor address space, mostly).
  const int64_t elements = int64_t(1) << 48;
  try {
    (void)Tensor::empty(Shape{elements}, kFloat32);
    FAIL("expected an AllocationError");
  } catch (const AllocationError& e) {
    CHECK(e.bytes() == elements * 4);
    CHECK(contains(e.what(), "1125899906842624 bytes"));
    CHECK(contains(e.what(), "[281474976710656]"));
  }
}
