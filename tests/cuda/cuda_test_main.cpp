// main() of the CUDA test binary: runs the GPU cases when a GPU is visible; otherwise prints one
// line saying how many were skipped and exits with kSkipCode, which ctest reports as skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "cuda_test.h"
#include "mpigrad/core/cuda.h"

namespace mpigrad::test {

namespace {
int& counter() {
  static int count = 0;
  return count;
}
}  // namespace

int register_cuda_test_case() { return ++counter(); }
int cuda_test_case_count() { return counter(); }

}  // namespace mpigrad::test

int main(int argc, char** argv) {
  constexpr int kSkipCode = 77;  // SKIP_RETURN_CODE in tests/cuda/CMakeLists.txt
  if (!mpigrad::core::cuda_is_available()) {
    std::printf("%d CUDA test cases skipped: no GPU visible%s\n",
                mpigrad::test::cuda_test_case_count(),
                mpigrad::core::cuda_built() ? "" : " (built without CUDA)");
    return kSkipCode;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
