// The home device (core/cuda.h): every thread's CUDA work starts on it and returns to it after
// touching another GPU, and pinned allocations are made in its context, so a process never
// creates a context on a GPU it does not use. Where the machine has one GPU the switch to another
// is not exercised, but the worker-thread half still is.
#include <doctest/doctest.h>

#include <thread>
#include <vector>

#include "cuda_test.h"
#include "mpigrad/core/cuda.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/pinned.h"
#include "mpigrad/core/stream.h"

namespace {

using namespace mpigrad::core;  // NOLINT

// Puts the default home device back when a case ends, even through a failed REQUIRE: the other
// cases of this suite expect it.
struct RestoreDefaultHome {
  ~RestoreDefaultHome() { set_cuda_home_device(cuda(0)); }
};

}  // namespace

MPIGRAD_CUDA_TEST_CASE("worker threads start on the home device and return to it") {
  const int count = cuda_device_count();
  // The last GPU, so that on a machine with several the home is not CUDA's default cuda:0.
  const Device home = cuda(count - 1);
  RestoreDefaultHome restore;
  set_cuda_home_device(home);
  CHECK(cuda_home_device() == home);
  CHECK(cuda_current_device() == home);

  std::vector<Device> seen;
  double total = 0;
  std::thread worker([&] {
    Tensor pinned = empty_pinned({256}, kFloat32);  // cudaHostAlloc in the home context
    seen.push_back(cuda_current_device());
    pinned.fill_(1.0);
    Tensor x = to_async(pinned, home);
    seen.push_back(cuda_current_device());
    if (count > 1) {
      Tensor other = ones({8}, TensorOptions().device(cuda(0))) * 3.0;
      total += sum(other).item<double>();
      seen.push_back(cuda_current_device());  // back on the home device after cuda:0's ops
    }
    total += sum(x * 2.0).item<double>();
    seen.push_back(cuda_current_device());
  });
  worker.join();
  REQUIRE(!seen.empty());
  for (Device device : seen) CHECK(device == home);
  CHECK(total == doctest::Approx(512.0 + (count > 1 ? 24.0 : 0.0)));
}
