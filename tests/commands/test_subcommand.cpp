// run_subcommand's two phases under mpirun: the checking phase ends the command on every rank
// when any rank's check throws, whatever the exception says, and the working phase runs only
// after every rank's check returned.
#include <doctest/doctest.h>
#include <mpi.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mpigrad/launch/commands/subcommand.h"

using mpigrad::launch::DistributedManager;
using mpigrad::launch::run_subcommand;

namespace {

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// Runs a subcommand whose check calls `check` on every rank; returns its exit code and whether
// its work ran on this rank.
std::pair<int, bool> run_with_check(const std::function<void()>& check) {
  std::vector<std::string> words = {"mpigrad-test"};
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  bool worked = false;
  const int code = run_subcommand(
      int(argv.size()), argv.data(), "mpigrad test", "usage: mpigrad test\n",
      [&](DistributedManager&, const std::vector<std::string>&) { check(); },
      [&](DistributedManager&) {
        worked = true;
        return 7;
      });
  return {code, worked};
}

}  // namespace

TEST_CASE("run_subcommand runs the work when every rank's check returns") {
  const auto [code, worked] = run_with_check([] {});
  CHECK(code == 7);
  CHECK(worked);
}

TEST_CASE("a check that throws on the last rank stops every rank before the work") {
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const auto [code, worked] = run_with_check([&] {
    if (world_rank() == ranks - 1) throw std::runtime_error("the last rank refuses");
  });
  CHECK(code == 1);
  CHECK_FALSE(worked);
}

TEST_CASE("a check that throws an exception with an empty message still fails") {
  const auto [code, worked] = run_with_check([] { throw std::runtime_error(""); });
  CHECK(code == 1);
  CHECK_FALSE(worked);
}
