// main() of the GPU test binaries (tests/cuda, tests/nn_cuda): runs the GPU cases when a GPU is
// visible; otherwise prints one line saying how many cases were skipped or failed and why, and
// exits as tests/gpu_suite_gate.h decides (a skip ctest reports as skipped, or a failure for a
// broken GPU or under MPIGRAD_REQUIRE_GPU=1). MPIGRAD_GPU_SUITE names the suite in that line.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "gpu_suite_gate.h"
#include "gpu_test_count.h"

namespace mpigrad::test {

namespace {
int& counter() {
  static int count = 0;
  return count;
}
}  // namespace

int register_gpu_test_case() {
  return ++counter();
}
int gpu_test_case_count() {
  return counter();
}

}  // namespace mpigrad::test

int main(int argc, char** argv) {
  const mpigrad::test::GpuSuiteGate gate = mpigrad::test::gate_gpu_suite(
      mpigrad::core::cuda_visibility(), mpigrad::test::gpu_required_by_environment(),
      mpigrad::test::gpu_test_case_count(), MPIGRAD_GPU_SUITE);
  if (!gate.run) {
    std::printf("%s\n", gate.line.c_str());
    return gate.exit_code;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
