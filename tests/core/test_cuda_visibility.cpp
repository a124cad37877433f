// The "no GPU" versus "broken GPU" rule of core/cuda.h and the GPU suites' gate built on it
// (tests/gpu_suite_gate.h), on any machine: cudaGetDeviceCount's answers are given, not asked.
#include <doctest/doctest.h>

#include <string>

#include "gpu_suite_gate.h"
#include "mpigrad/core/cuda.h"

namespace {

using mpigrad::core::classify_cuda_device_count;
using mpigrad::core::CudaVisibility;
using mpigrad::test::gate_gpu_suite;

constexpr int kSystemDriverMismatch = 803;  // cudaErrorSystemDriverMismatch
constexpr int kInitializationError = 3;     // cudaErrorInitializationError

CudaVisibility no_driver() {
  return classify_cuda_device_count(mpigrad::core::kCudaErrorInsufficientDriver, 0,
                                    "cudaErrorInsufficientDriver",
                                    "CUDA driver version is insufficient for CUDA runtime version");
}

}  // namespace

TEST_CASE("cudaGetDeviceCount: only no-device and no-driver mean there is no GPU") {
  const CudaVisibility two = classify_cuda_device_count(0, 2, "cudaSuccess", "no error");
  CHECK(two.has_gpu());
  CHECK(two.device_count == 2);
  CHECK_FALSE(two.broken);
  CHECK(two.describe() == "2 CUDA devices visible");

  const CudaVisibility none =
      classify_cuda_device_count(mpigrad::core::kCudaErrorNoDevice, 0, "cudaErrorNoDevice",
                                 "no CUDA-capable device is detected");
  CHECK_FALSE(none.has_gpu());
  CHECK_FALSE(none.broken);
  CHECK(none.describe() ==
        "no GPU visible: cudaGetDeviceCount failed with cudaErrorNoDevice "
        "(no CUDA-capable device is detected)");

  const CudaVisibility driverless = no_driver();
  CHECK_FALSE(driverless.broken);
  const CudaVisibility stub =
      classify_cuda_device_count(mpigrad::core::kCudaErrorStubLibrary, 0, "cudaErrorStubLibrary",
                                 "CUDA driver is a stub library");
  CHECK_FALSE(stub.broken);
  CHECK_FALSE(stub.has_gpu());
  CHECK(driverless.describe().find("no GPU visible") == 0);
  CHECK(driverless.describe().find("cudaErrorInsufficientDriver") != std::string::npos);

  // A count the runtime reports alongside an error is not trusted.
  for (int code : {kSystemDriverMismatch, kInitializationError}) {
    INFO("error code ", code);
    const CudaVisibility broken =
        classify_cuda_device_count(code, 1, "cudaErrorSomething", "it went wrong");
    CHECK(broken.broken);
    CHECK_FALSE(broken.has_gpu());
    CHECK(broken.describe() ==
          "CUDA is broken: cudaGetDeviceCount failed with "
          "cudaErrorSomething (it went wrong)");
  }
}

TEST_CASE("GPU suite gate: run, skip, or fail, and MPIGRAD_REQUIRE_GPU=1 turns skips to failures") {
  const CudaVisibility one = classify_cuda_device_count(0, 1, "cudaSuccess", "no error");
  CHECK(gate_gpu_suite(one, false, 5, "CUDA").run);
  CHECK(gate_gpu_suite(one, true, 5, "CUDA").run);

  const auto skipped = gate_gpu_suite(no_driver(), false, 5, "CUDA");
  CHECK_FALSE(skipped.run);
  CHECK(skipped.exit_code == mpigrad::test::kGpuSkipCode);
  CHECK(skipped.line.find("5 CUDA test cases skipped: no GPU visible: cudaGetDeviceCount failed "
                          "with cudaErrorInsufficientDriver") == 0);

  const auto required = gate_gpu_suite(no_driver(), true, 5, "CUDA");
  CHECK_FALSE(required.run);
  CHECK(required.exit_code == 1);
  CHECK(required.line.find("FAILED: 5 CUDA test cases not run: no GPU visible") == 0);
  CHECK(required.line.find("MPIGRAD_REQUIRE_GPU=1 makes that a failure") != std::string::npos);

  // A broken GPU fails whether or not a GPU is required.
  const CudaVisibility broken =
      classify_cuda_device_count(kSystemDriverMismatch, 0, "cudaErrorSystemDriverMismatch",
                                 "system has unsupported display driver / cuda driver combination");
  for (bool require : {false, true}) {
    const auto gate = gate_gpu_suite(broken, require, 3, "nn CUDA");
    CHECK_FALSE(gate.run);
    CHECK(gate.exit_code == 1);
    CHECK(gate.line.find("FAILED: 3 nn CUDA test cases cannot run: CUDA is broken") == 0);
    CHECK(gate.line.find("cudaErrorSystemDriverMismatch") != std::string::npos);
  }

  // More ranks on a node than GPUs: a skip, or a failure when required.
  const CudaVisibility two = classify_cuda_device_count(0, 2, "cudaSuccess", "no error");
  CHECK(gate_gpu_suite(two, true, 4, "NCCL", 2).run);
  const auto crowded = gate_gpu_suite(two, false, 4, "NCCL", 4);
  CHECK(crowded.exit_code == mpigrad::test::kGpuSkipCode);
  CHECK(crowded.line ==
        "4 NCCL test cases skipped: 4 ranks on a node with 2 visible GPU(s); "
        "each rank needs its own");
  CHECK(gate_gpu_suite(two, true, 4, "NCCL", 4).exit_code == 1);

  CudaVisibility cpu_build;
  cpu_build.built = false;
  CHECK(gate_gpu_suite(cpu_build, false, 2, "CUDA").line ==
        "2 CUDA test cases skipped: no GPU visible: this mpigrad was built without CUDA");
  CHECK(gate_gpu_suite(cpu_build, true, 2, "CUDA").exit_code == 1);
}

TEST_CASE("this process's own answer is consistent with cuda_device_count") {
  const CudaVisibility& visibility = mpigrad::core::cuda_visibility();
  CHECK(visibility.built == mpigrad::core::cuda_built());
  if (!visibility.broken) CHECK(mpigrad::core::cuda_device_count() == visibility.device_count);
}
