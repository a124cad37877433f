// The CPU kernels' loop splitters (kernels/cpu/parallel.h): parallel_for_balanced visits every
// index once, runs serially below its grain and on one thread, splits evenly when there are too
// few pieces to balance, and otherwise hands out pieces that a slower thread takes fewer of.
#include <doctest/doctest.h>
#include <omp.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "../thread_count.h"
#include "mpigrad/kernels/cpu/parallel.h"

namespace {

using mpigrad::kernels::cpu::parallel_for_balanced;
using mpigrad::test::ThreadCount;

struct Call {
  int64_t begin, end;
  int thread;
};

// Runs parallel_for_balanced over [begin, end) and returns its calls, checking that together
// they visit every index exactly once.
std::vector<Call> calls_of(int64_t begin, int64_t end, int64_t grain, int64_t piece) {
  std::vector<int> visits(size_t(end - begin), 0);
  std::vector<Call> calls;
  std::mutex lock;
  parallel_for_balanced(begin, end, grain, piece, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) ++visits[size_t(i - begin)];  // disjoint ranges: no race
    const std::lock_guard<std::mutex> guard(lock);
    calls.push_back({b, e, omp_get_thread_num()});
  });
  for (size_t i = 0; i < visits.size(); ++i) {
    CAPTURE(i);
    REQUIRE(visits[i] == 1);
  }
  return calls;
}

}  // namespace

TEST_CASE("parallel_for_balanced: one call on the caller below the grain and on one thread") {
  {
    const ThreadCount count(2);
    const std::vector<Call> calls = calls_of(5, 1005, 1000, 10);
    REQUIRE(calls.size() == 1);
    CHECK(calls[0].begin == 5);
    CHECK(calls[0].end == 1005);
  }
  const ThreadCount count(1);
  const std::vector<Call> calls = calls_of(0, 100000, 10, 100);
  REQUIRE(calls.size() == 1);
  CHECK(calls[0].end == 100000);
  CHECK(calls_of(7, 7, 1, 1).empty());
}

TEST_CASE("parallel_for_balanced: under 4 pieces a thread, an even split, one range a thread") {
  const ThreadCount count(2);
  // 7 pieces of 100 for 2 threads: split as parallel_for does, 350 each.
  std::vector<Call> calls = calls_of(0, 700, 10, 100);
  REQUIRE(calls.size() == 2);
  CHECK(calls[0].end - calls[0].begin == 350);
  CHECK(calls[1].end - calls[1].begin == 350);
}

TEST_CASE("parallel_for_balanced: pieces from the start of the range, the last one short") {
  const ThreadCount count(2);
  const int64_t begin = 3, end = 3 + 20 * 64 + 17, piece = 64;
  const std::vector<Call> calls = calls_of(begin, end, 100, piece);
  REQUIRE(calls.size() == 21);
  for (const Call& c : calls) {
    CAPTURE(c.begin);
    CHECK((c.begin - begin) % piece == 0);
    CHECK(c.end == std::min(end, c.begin + piece));
  }
}

TEST_CASE("parallel_for_balanced: a thread slowed down takes fewer pieces than an even half") {
  const ThreadCount count(2);
  const int64_t pieces = 32;
  std::vector<int> taken(2, 0);
  std::mutex lock;
  parallel_for_balanced(0, pieces, 1, 1, [&](int64_t, int64_t) {
    const int thread = omp_get_thread_num();
    // Thread 0 stands for a core shared with other work: each of its pieces takes 2 ms longer.
    if (thread == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const std::lock_guard<std::mutex> guard(lock);
    ++taken[size_t(thread)];
  });
  CHECK(taken[0] + taken[1] == pieces);
  // An even split would give each thread 16; taking pieces in turn leaves thread 0 fewer.
  CHECK(taken[0] < pieces / 2);
}
