// Shared by the NCCL test files: the skip rule.
//
// Every NCCL test case is declared with MPIGRAD_NCCL_TEST_CASE, which counts it. When no GPU is
// visible (or the build has no CUDA backend, or a node has fewer GPUs than ranks), main() runs
// none of them; rank 0 prints one line, "N NCCL test cases skipped: no GPU visible: ...", and
// every rank exits with the code ctest reads as skipped (a failure with MPIGRAD_REQUIRE_GPU=1,
// or when the GPU is broken: tests/gpu_suite_gate.h).
#pragma once

#include <doctest/doctest.h>

namespace mpigrad::test {

// Counts an NCCL test case at registration; returns the new count.
int register_nccl_test_case();
int nccl_test_case_count();

// `mpigrad-test-nccl withhold-rank-1` (nccl_withheld_rank.cpp): the collective timeout's job,
// run instead of the cases; returns the exit code.
int withhold_rank_1();

}  // namespace mpigrad::test

#define MPIGRAD_NCCL_TEST_CASE(name)                       \
  static const int DOCTEST_ANONYMOUS(mpigrad_nccl_case_) = \
      ::mpigrad::test::register_nccl_test_case();          \
  TEST_CASE(name)
