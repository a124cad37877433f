// main() of the GPU test binaries (tests/cuda, tests/nn_cuda): runs the GPU cases when a GPU is
// visible; otherwise prints one line saying how many were skipped and exits with kSkipCode,
// which ctest reports as skipped. MPIGRAD_GPU_SUITE names the suite in that line.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "gpu_test_count.h"
#include "mpigrad/core/cuda.h"

namespace mpigrad::test {

namespace {
int& counter() {
  static int count = 0;
  return count;
}
}  // namespace

int register_gpu_test_case() { return ++counter(); }
int gpu_test_case_count() { return counter(); }

}  // namespace mpigrad::test

int main(int argc, char** argv) {
  constexpr int kSkipCode = 77;  // SKIP_RETURN_CODE of the GPU suites' ctest entries
  if (!mpigrad::core::cuda_is_available()) {
    std::printf("%d %s test cases skipped: no GPU visible%s\n",
                mpigrad::test::gpu_test_case_count(), MPIGRAD_GPU_SUITE,
                mpigrad::core::cuda_built() ? "" : " (built without CUDA)");
    return kSkipCode;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
