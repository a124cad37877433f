// main() of the NCCL test binary: starts MPI (a failure to start fails the test, it never skips),
// decides on every rank together whether GPUs are there to run on (tests/gpu_suite_gate.h), and
// then either runs the doctest cases on every rank and reports failures from any rank (like
// tests/doctest_mpi_main.cpp), or prints one line on rank 0 and exits on every rank with the
// skip code (no GPU) or 1 (a broken GPU, or any skip under MPIGRAD_REQUIRE_GPU=1). With the
// argument withhold-rank-1 it runs the collective timeout's job instead of the cases.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_suite_gate.h"
#include "mpigrad/core/cuda.h"
#include "nccl_test.h"

namespace mpigrad::test {

namespace {
int& counter() {
  static int count = 0;
  return count;
}
}  // namespace

int register_nccl_test_case() {
  return ++counter();
}
int nccl_test_case_count() {
  return counter();
}

}  // namespace mpigrad::test

int main(int argc, char** argv) {
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    std::fprintf(stderr, "mpigrad-test-nccl: MPI_Init_thread failed; MPI tests cannot run\n");
    return 1;
  }
  int rank = 0, size = 1, local_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);

  // `withhold-rank-1`: the collective timeout's job (nccl_withheld_rank.cpp) instead of the cases.
  const bool withhold = argc > 1 && std::string(argv[1]) == "withhold-rank-1";
  // Every rank runs, or none does (one node without enough GPUs stops the whole job); the worst
  // outcome of any rank (a failure over a skip) decides, and rank 0 prints it.
  const mpigrad::test::GpuSuiteGate gate = mpigrad::test::gate_gpu_suite(
      mpigrad::core::cuda_visibility(), mpigrad::test::gpu_required_by_environment(),
      withhold ? 1 : mpigrad::test::nccl_test_case_count(), withhold ? "NCCL timeout" : "NCCL",
      local_size);
  const int outcome = gate.run ? 0 : gate.exit_code == 1 ? 2 : 1;  // 0 run, 1 skip, 2 fail
  int worst = 0;
  MPI_Allreduce(&outcome, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (worst != 0) {
    if (rank == 0) {
      std::printf("%s\n", outcome == worst ? gate.line.c_str()
                          : worst == 2
                              ? "FAILED: NCCL test cases not run: another rank cannot use its GPU"
                              : "NCCL test cases skipped: another node lacks GPUs");
      std::fflush(stdout);
    }
    MPI_Finalize();
    return worst == 2 ? 1 : mpigrad::test::kGpuSkipCode;
  }

  if (withhold) {
    const int rc = mpigrad::test::withhold_rank_1();
    MPI_Finalize();
    return rc;
  }

  doctest::Context context(argc, argv);
  std::ostringstream buffer;
  if (rank != 0) context.setCout(&buffer);
  const int result = context.run();
  if (context.shouldExit()) {
    MPI_Finalize();
    return result;
  }
  int failed = result != 0 ? 1 : 0;
  std::vector<int> failed_by_rank(size_t(size), 0);
  MPI_Gather(&failed, 1, MPI_INT, failed_by_rank.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (rank != 0 && failed) {
    const std::string report = buffer.str();
    MPI_Send(report.data(), int(report.size()), MPI_CHAR, 0, 0, MPI_COMM_WORLD);
  }
  int failures = 0;
  if (rank == 0) {
    for (int r = 0; r < size; ++r) {
      if (!failed_by_rank[size_t(r)]) continue;
      ++failures;
      if (r == 0) continue;
      MPI_Status status;
      int length = 0;
      MPI_Probe(r, 0, MPI_COMM_WORLD, &status);
      MPI_Get_count(&status, MPI_CHAR, &length);
      std::string report(size_t(length), '\0');
      MPI_Recv(report.data(), length, MPI_CHAR, r, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      std::istringstream lines(report);
      for (std::string line; std::getline(lines, line);) {
        std::printf("[rank %d/%d] %s\n", r, size, line.c_str());
      }
    }
    std::printf("[nccl-test] %s\n", failures == 0 ? "all ranks passed" : "some ranks failed");
    std::fflush(stdout);
  }
  MPI_Bcast(&failures, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
