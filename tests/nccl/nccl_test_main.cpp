// main() of the NCCL test binary: starts MPI (a failure to start fails the test, it never skips),
// decides on every rank together whether GPUs are there to run on, and then either runs the
// doctest cases on every rank and reports failures from any rank (like tests/doctest_mpi_main.cpp),
// or prints one "skipped" line on rank 0 and exits kSkipCode on every rank.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "mpigrad/core/cuda.h"
#include "nccl_test.h"

namespace mpigrad::test {

namespace {
int& counter() {
  static int count = 0;
  return count;
}
}  // namespace

int register_nccl_test_case() { return ++counter(); }
int nccl_test_case_count() { return counter(); }

}  // namespace mpigrad::test

namespace {

// Why this rank cannot run the suite, or "" when it can.
std::string skip_reason(int local_size) {
  if (!mpigrad::core::cuda_built()) return "no GPU visible (built without CUDA)";
  const int gpus = mpigrad::core::cuda_device_count();
  if (gpus == 0) return "no GPU visible";
  if (gpus < local_size) {
    // NCCL refuses two ranks of one communicator on the same GPU.
    return std::to_string(local_size) + " ranks on a node with " + std::to_string(gpus) +
           " visible GPU(s); NCCL needs one GPU per rank";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  constexpr int kSkipCode = 77;  // SKIP_RETURN_CODE in tests/nccl/CMakeLists.txt
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

  // Every rank skips, or none does (one node without enough GPUs skips the whole job).
  const std::string reason = skip_reason(local_size);
  int skip = reason.empty() ? 0 : 1, any_skip = 0;
  MPI_Allreduce(&skip, &any_skip, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_skip) {
    if (rank == 0) {
      std::printf("%d NCCL test cases skipped: %s\n", mpigrad::test::nccl_test_case_count(),
                  reason.empty() ? "another node lacks GPUs" : reason.c_str());
      std::fflush(stdout);
    }
    MPI_Finalize();
    return kSkipCode;
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
