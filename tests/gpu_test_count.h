// The count of GPU test cases, shared by the GPU suites and their common main()
// (tests/gpu_test_main.cpp), which prints it when it skips them for want of a GPU.
#pragma once

namespace mpigrad::test {

// Counts a GPU test case at registration; returns the new count.
int register_gpu_test_case();
int gpu_test_case_count();

}  // namespace mpigrad::test
