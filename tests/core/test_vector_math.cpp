// kernels/cpu/vector_math.h's exp8 against std::exp: within 2 ulp wherever the result is a normal
// float, 0 below, +inf above, NaN kept. Skipped (with a line saying so) on a CPU without AVX2.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "mpigrad/kernels/cpu/vector_math.h"

namespace {

#if defined(MPIGRAD_HAS_AVX2_MATH)
MPIGRAD_AVX2 void exp_of(const float* in, float* out) {
  _mm256_storeu_ps(out, mpigrad::kernels::cpu::vector_math::exp8(_mm256_loadu_ps(in)));
}

int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::abs(int64_t(ia) - int64_t(ib));
}
#endif

}  // namespace

TEST_CASE("vector_math: exp8 within 2 ulp of std::exp, and its edges") {
#if defined(MPIGRAD_HAS_AVX2_MATH)
  if (!mpigrad::kernels::cpu::has_avx2_fma()) {
    std::printf("vector_math: this CPU has no AVX2/FMA; exp8 is not used, not tested\n");
    return;
  }
  int64_t worst = 0;
  float worst_at = 0;
  for (float x = -87.0f; x < 88.3f; x += 0.000731f * (1.0f + std::abs(x))) {
    float in[8], out[8];
    for (int k = 0; k < 8; ++k) in[k] = x + 1e-4f * float(k);
    exp_of(in, out);
    for (int k = 0; k < 8; ++k) {
      const int64_t u = ulps(out[k], float(std::exp(double(in[k]))));
      if (u > worst) {
        worst = u;
        worst_at = in[k];
      }
    }
  }
  INFO("worst ", worst, " ulp at x = ", worst_at);
  CHECK(worst <= 2);

  const float inf = std::numeric_limits<float>::infinity();
  const float in[8] = {0.0f, -inf, inf, std::nanf(""), -100.0f, 100.0f, 1.0f, -1.0f};
  float out[8];
  exp_of(in, out);
  CHECK(out[0] == 1.0f);
  CHECK(out[1] == 0.0f);
  CHECK(out[2] == inf);
  CHECK(std::isnan(out[3]));
  CHECK(out[4] == 0.0f);
  CHECK(out[5] == inf);
  CHECK(ulps(out[6], float(std::exp(1.0))) <= 2);
  CHECK(ulps(out[7], float(std::exp(-1.0))) <= 2);
#else
  std::printf("vector_math: not an x86-64 GCC/Clang build; exp8 is not used, not tested\n");
#endif
}
