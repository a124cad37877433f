// main() of the nn CUDA test binary: runs the GPU cases when a GPU is visible; otherwise prints
// one line saying how many were skipped and exits with kSkipCode, which ctest reports as skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "mpigrad/core/cuda.h"
#include "nn_cuda_test.h"

namespace mpigrad::test {

namespace {
int& counter() {
  static int count = 0;
  return count;
}
}  // namespace

int register_nn_cuda_test_case() { return ++counter(); }
int nn_cuda_test_case_count() { return counter(); }

}  // namespace mpigrad::test

int main(int argc, char** argv) {
  constexpr int kSkipCode = 77;  // SKIP_RETURN_CODE in tests/nn_cuda/CMakeLists.txt
  if (!mpigrad::core::cuda_is_available()) {
    std::printf("%d nn CUDA test cases skipped: no GPU visible%s\n",
                mpigrad::test::nn_cuda_test_case_count(),
                mpigrad::core::cuda_built() ? "" : " (built without CUDA)");
    return kSkipCode;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
