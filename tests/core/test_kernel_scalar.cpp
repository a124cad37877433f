// What the CPU and the CUDA kernels share, written once in kernels/: the scalar conversions of
// kernels/scalar.h and the gemm argument checks of kernels/matmul.h. Both run on the host, so
// the CUDA side of each is checked here too, without a GPU.
#include <doctest/doctest.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "mpigrad/kernels/matmul.h"
#include "mpigrad/kernels/scalar.h"

namespace {

namespace kernels = mpigrad::kernels;
using kernels::DType;
using kernels::GemmShape;

GemmShape square(int64_t size) {
  GemmShape shape;
  shape.m = shape.n = shape.k = size;
  shape.lda = shape.ldb = shape.ldc = size;
  return shape;
}

}  // namespace

TEST_CASE("kernel scalars: float to integer truncates, saturates and sends NaN to 0") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  CHECK(kernels::cast_to<int32_t>(2.9) == 2);
  CHECK(kernels::cast_to<int32_t>(-2.9) == -2);
  CHECK(kernels::cast_to<int32_t>(nan) == 0);
  CHECK(kernels::cast_to<int32_t>(1e20) == std::numeric_limits<int32_t>::max());
  CHECK(kernels::cast_to<int64_t>(-inf) == std::numeric_limits<int64_t>::min());
  // Through int64, as a C cast chain: -1.0 wraps to 255 instead of saturating to 0.
  CHECK(kernels::cast_to<uint8_t>(-1.0f) == 255);
  CHECK(kernels::cast_to<bool>(0.5) == true);
  CHECK(kernels::cast_to<uint8_t>(kernels::Half(300.0f)) == uint8_t(300 & 0xff));
}

TEST_CASE("kernel scalars: a clamp bound is brought into the element type's range") {
  const double inf = std::numeric_limits<double>::infinity();
  CHECK(kernels::saturate_bound<int32_t>(inf) == std::numeric_limits<int32_t>::max());
  CHECK(kernels::saturate_bound<int32_t>(-inf) == std::numeric_limits<int32_t>::min());
  CHECK(kernels::saturate_bound<uint8_t>(-5.0) == 0);
  CHECK(kernels::saturate_bound<int64_t>(std::nan("")) == 0);
  CHECK(kernels::saturate_bound<int64_t>(-7.0) == -7);
  CHECK(kernels::saturate_bound<bool>(0.25) == true);
  CHECK(kernels::saturate_bound<bool>(0.0) == false);
  CHECK(kernels::saturate_bound<kernels::BFloat16>(1.5) == 1.5f);
}

TEST_CASE("kernel scalars: integer arithmetic wraps instead of overflowing") {
  CHECK(kernels::wrap_add<int32_t>(std::numeric_limits<int32_t>::max(), 1) ==
        std::numeric_limits<int32_t>::min());
  CHECK(kernels::wrap_mul<uint8_t>(16, 16) == 0);
  CHECK(kernels::wrap_sub<int64_t>(std::numeric_limits<int64_t>::min(), 1) ==
        std::numeric_limits<int64_t>::max());
}

TEST_CASE("kernel scalars: integer division and power are defined for every input") {
  CHECK(kernels::int_div<int32_t>(7, 0) == 0);
  CHECK(kernels::int_div<int32_t>(-7, 2) == -3);
  CHECK(kernels::int_div<int32_t>(std::numeric_limits<int32_t>::min(), -1) ==
        std::numeric_limits<int32_t>::min());
  CHECK(kernels::int_pow<int64_t>(3, 4) == 81);
  CHECK(kernels::int_pow<int64_t>(-1, -3) == -1);
  CHECK(kernels::int_pow<int64_t>(2, -1) == 0);
  CHECK(kernels::int_pow<uint8_t>(2, 8) == 0);  // wraps
  CHECK(kernels::sign_of<double>(-0.5) == -1.0);
  CHECK(kernels::sign_of<double>(std::nan("")) == 0.0);
  CHECK(kernels::sign_of<uint8_t>(9) == 1);
  CHECK(kernels::sign_of<int32_t>(0) == 0);
}

TEST_CASE("gemm argument checks: each names the backend and what is wrong") {
  std::vector<float> a(4, 1.0f), b(4, 1.0f), c(4, 0.0f);
  GemmShape narrow = square(2);
  narrow.lda = 1;
  CHECK_THROWS_WITH_AS(
      kernels::cpu::gemm(DType::Float32, narrow, 1.0, a.data(), b.data(), 0.0, c.data()),
      "mpigrad::kernels::cpu::gemm: lda 1 is too small", std::invalid_argument);
  GemmShape negative = square(2);
  negative.k = -1;
  CHECK_THROWS_WITH_AS(
      kernels::cpu::gemm(DType::Float32, negative, 1.0, a.data(), b.data(), 0.0, c.data()),
      "mpigrad::kernels::cpu::gemm: negative size", std::invalid_argument);
  // A transposed A is stored k x m: lda counts m columns.
  GemmShape transposed = square(2);
  transposed.n = 1;
  transposed.ldb = transposed.ldc = 1;
  transposed.transpose_a = true;
  transposed.m = 3;
  transposed.lda = 2;
  CHECK_THROWS_WITH_AS(kernels::check_gemm_shape(transposed, "cpu", "CBLAS", false),
                       "mpigrad::kernels::cpu::gemm: lda 2 is too small", std::invalid_argument);
  transposed.lda = 3;
  CHECK_NOTHROW(kernels::check_gemm_shape(transposed, "cpu", "CBLAS", false));

  // The CPU walks the batch itself; cuBLAS takes the batch count as an int.
  GemmShape many = square(1);
  many.batch = int64_t(INT_MAX) + 1;
  CHECK_NOTHROW(kernels::check_gemm_shape(many, "cpu", "CBLAS", false));
  CHECK_THROWS_WITH_AS(
      kernels::check_gemm_shape(many, "cuda", "cuBLAS", true),
      "mpigrad::kernels::cuda::gemm: the batch count exceeds the 32-bit range of cuBLAS",
      std::invalid_argument);
  GemmShape wide = square(1);
  wide.ldc = int64_t(INT_MAX) + 1;
  CHECK_THROWS_WITH_AS(
      kernels::check_gemm_shape(wide, "cpu", "CBLAS", false),
      "mpigrad::kernels::cpu::gemm: a size or leading dimension exceeds the 32-bit range of CBLAS",
      std::invalid_argument);
}
