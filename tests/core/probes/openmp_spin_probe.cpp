// A program that starts the way `mpigrad` does (core::apply_openmp_wait_defaults first thing in
// main) and prints the spin count its OpenMP runtime ended up with, then OMP_WAIT_POLICY and
// GOMP_SPINCOUNT as its environment has them. tests/core/test_threads.cpp runs it under
// different environments.
#include <cstdio>
#include <cstdlib>

#include "mpigrad/core/threads.h"

int main(int /*argc*/, char** argv) {
  mpigrad::core::apply_openmp_wait_defaults(argv);
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  std::printf("%ld %s %s\n", mpigrad::core::openmp_spin_count(), policy ? policy : "unset",
              spin ? spin : "unset");
  return 0;
}
