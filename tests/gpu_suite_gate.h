// Whether a GPU test suite runs, is skipped, or fails before running, and the one line it prints.
//
// Shared by the mains of the GPU suites (tests/gpu_test_main.cpp for tests/cuda and
// tests/nn_cuda, tests/comm/nccl/nccl_test_main.cpp). The rule:
// - a GPU that is there but broken (any cudaGetDeviceCount error but "no device" and "no
//   driver", see core/cuda.h) fails the suite with the CUDA error: never a skip;
// - no GPU (or a build without CUDA, or fewer GPUs on a node than the suite's ranks there) skips
//   it with one line saying how many cases and why, and exit code kGpuSkipCode, which ctest
//   reports as "Skipped";
// - with MPIGRAD_REQUIRE_GPU=1 in the environment (scripts/gpu-check.sh sets it on GPU machines)
//   every such skip is a failure instead, so a run that was meant to use the GPU cannot pass
//   without having used it.
// A pure function of its inputs, so tests/core checks the rule on machines without a GPU.
#pragma once

#include <cstdlib>
#include <string>

#include "mpigrad/core/cuda.h"

namespace mpigrad::test {

inline constexpr int kGpuSkipCode = 77;  // SKIP_RETURN_CODE of the GPU suites' ctest entries

struct GpuSuiteGate {
  bool run = false;   // run the cases
  int exit_code = 0;  // otherwise exit with this (kGpuSkipCode or 1) after printing `line`
  std::string line;
};

// MPIGRAD_REQUIRE_GPU set to anything but "" or "0".
inline bool gpu_required_by_environment() {
  const char* value = std::getenv("MPIGRAD_REQUIRE_GPU");
  return value != nullptr && *value != '\0' && std::string(value) != "0";
}

// `cases` test cases of `suite` ("CUDA", "nn CUDA", "NCCL"); `ranks_on_node` processes of the
// suite share this node, each needing its own GPU (1 for the single-process suites).
inline GpuSuiteGate gate_gpu_suite(const core::CudaVisibility& visibility, bool require_gpu,
                                   int cases, const std::string& suite, int ranks_on_node = 1) {
  const std::string what = std::to_string(cases) + " " + suite + " test cases";
  GpuSuiteGate gate;
  if (visibility.broken) {
    gate.exit_code = 1;
    gate.line = "FAILED: " + what + " cannot run: " + visibility.describe();
    return gate;
  }
  std::string reason;
  if (!visibility.has_gpu()) {
    reason = visibility.describe();
  } else if (visibility.device_count < ranks_on_node) {
    // NCCL refuses two ranks of one communicator on the same GPU.
    reason = std::to_string(ranks_on_node) + " ranks on a node with " +
             std::to_string(visibility.device_count) + " visible GPU(s); each rank needs its own";
  }
  if (reason.empty()) {
    gate.run = true;
    return gate;
  }
  if (require_gpu) {
    gate.exit_code = 1;
    gate.line =
        "FAILED: " + what + " not run: " + reason + "; MPIGRAD_REQUIRE_GPU=1 makes that a failure";
  } else {
    gate.exit_code = kGpuSkipCode;
    gate.line = what + " skipped: " + reason;
  }
  return gate;
}

}  // namespace mpigrad::test
