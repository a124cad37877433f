// A program that starts the way `mpigrad` does (core::apply_openmp_wait_defaults first thing in
// main) and prints the spin count its OpenMP runtime ended up with, then OMP_WAIT_POLICY as its
// environment has it. tests/core/test_threads.cpp runs it under different environments.
#include <cstdio>
#include <cstdlib>

#include "mpigrad/core/threads.h"

int main(int /*argc*/, char** argv) {
  mpigrad::core::apply_openmp_wait_defaults(argv);
  const char* variable = std::getenv("OMP_WAIT_POLICY");
  std::printf("%ld %s\n", mpigrad::core::openmp_spin_count(), variable ? variable : "unset");
  return 0;
}
