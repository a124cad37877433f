// The main() of every MPI doctest binary (Debian's doctest has no MPI extension).
//
// Every rank runs every test case. Rank 0 prints its report as usual; the other ranks write
// theirs to a buffer, and a rank that failed sends it to rank 0, which prints it prefixed with
// the rank. The exit code is non-zero on every rank when any rank failed, so mpirun and ctest
// fail. If MPI cannot start, the binary fails: an MPI test never skips.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    std::fprintf(stderr, "doctest-mpi: MPI_Init_thread failed; MPI tests cannot run\n");
    return 1;
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  doctest::Context context(argc, argv);
  std::ostringstream buffer;
  if (rank != 0) context.setCout(&buffer);
  int result = context.run();
  if (context.shouldExit()) {  // --help, --list-test-cases, ...
    MPI_Finalize();
    return result;
  }

  int failed = result != 0 ? 1 : 0;
  std::vector<int> failed_by_rank(size_t(size), 0);
  MPI_Gather(&failed, 1, MPI_INT, failed_by_rank.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (rank != 0 && failed) {
    std::string report = buffer.str();
    MPI_Send(report.data(), int(report.size()), MPI_CHAR, 0, 0, MPI_COMM_WORLD);
  }
  int failures = 0;
  if (rank == 0) {
    std::string failing;
    for (int r = 0; r < size; ++r) {
      if (!failed_by_rank[size_t(r)]) continue;
      ++failures;
      failing += " " + std::to_string(r);
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
    if (failures == 0) {
      std::printf("[doctest-mpi] all %d ranks passed\n", size);
    } else {
      std::printf("[doctest-mpi] %d of %d ranks failed:%s\n", failures, size, failing.c_str());
    }
    std::fflush(stdout);
  }
  MPI_Bcast(&failures, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
