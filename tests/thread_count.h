// ThreadCount: a test's CPU thread count for one scope (core::set_num_threads), with the count
// before it restored when the scope ends, so that a failed check cannot leave the tests after it
// on another number of threads.
#pragma once

#include "mpigrad/core/threads.h"

namespace mpigrad::test {

class ThreadCount {
 public:
  ThreadCount() = default;  // restores only: the scope sets counts as it goes
  explicit ThreadCount(int threads) { core::set_num_threads(threads); }
  ~ThreadCount() { core::set_num_threads(previous_); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

 private:
  int previous_ = core::num_threads();  // read before the constructor's body sets the count
};

}  // namespace mpigrad::test
