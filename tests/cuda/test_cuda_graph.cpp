// CUDA graphs (core/cuda_graph.h): a replay recomputes from the inputs' current contents into
// the captured outputs, the graph's memory pool keeps its blocks from everything else, a capture
// of code that waits for the device fails cleanly and leaves no error behind, and the legacy
// default stream is refused.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cuda_test.h"
#include "mpigrad/core/cuda_allocator.h"
#include "mpigrad/core/cuda_graph.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/stream.h"

namespace {

using namespace mpigrad::core;  // NOLINT

const Device kGpu = cuda(0);

}  // namespace

MPIGRAD_CUDA_TEST_CASE("a replayed graph recomputes its outputs from the inputs' new contents") {
  Stream stream(kGpu);
  StreamGuard on(stream);
  Tensor x = full({1000}, 1.0, TensorOptions().device(kGpu));
  Tensor y;
  CudaGraph graph;
  std::string why;
  REQUIRE(graph.capture(
      stream, [&] { y = sum(x * 2.0 + 1.0); }, &why));
  CHECK(why.empty());
  graph.replay(stream);
  CHECK(y.item<double>() == doctest::Approx(3000.0));
  x.fill_(2.0);
  graph.replay(stream);
  CHECK(y.item<double>() == doctest::Approx(5000.0));
}

MPIGRAD_CUDA_TEST_CASE("replays allocate nothing, and the graph's blocks go to no one else") {
  Stream stream(kGpu);
  StreamGuard on(stream);
  Tensor x = full({1 << 16}, 1.0, TensorOptions().device(kGpu));
  Tensor y;
  const void* temporary = nullptr;
  CudaGraph graph;
  std::string why;
  REQUIRE(graph.capture(
      stream,
      [&] {
        Tensor scratch = x * 3.0;  // freed inside the capture: the pool keeps it
        temporary = scratch.data_ptr();
        y = scratch + 1.0;
      },
      &why));
  const CudaMemoryStats before = cuda_memory_stats(kGpu);
  for (int i = 0; i < 10; ++i) graph.replay(stream);
  stream.synchronize();
  CHECK(cuda_memory_stats(kGpu).device_allocations == before.device_allocations);
  // An ordinary allocation of the same size on the same stream must not get the block a replay
  // writes into.
  Tensor other = empty({1 << 16}, TensorOptions().device(kGpu));
  CHECK(other.data_ptr() != temporary);
  CHECK(other.data_ptr() != y.data_ptr());
  CHECK(y.to(kCPU).to_vector<float>()[0] == doctest::Approx(4.0));
}

MPIGRAD_CUDA_TEST_CASE("a capture that waits for the device fails, runs nothing, leaves no error") {
  Stream stream(kGpu);
  StreamGuard on(stream);
  Tensor x = full({16}, 1.0, TensorOptions().device(kGpu));
  CudaGraph graph;
  std::string why;
  CHECK_FALSE(graph.capture(
      stream, [&] { (void)sum(x).item<double>(); }, &why));
  CHECK_FALSE(why.empty());
  CHECK_FALSE(graph.captured());
  // The device and the allocator work as before.
  CHECK(sum(x * 2.0).item<double>() == doctest::Approx(32.0));
  // And a later capture on the same stream succeeds.
  Tensor y;
  CHECK(graph.capture(
      stream, [&] { y = x + 1.0; }, &why));
}

MPIGRAD_CUDA_TEST_CASE("the legacy default stream cannot be captured") {
  CudaGraph graph;
  std::string why;
  CHECK_THROWS_WITH(graph.capture(
                        default_stream(kGpu), [] {}, &why),
                    doctest::Contains("legacy default stream"));
}

MPIGRAD_CUDA_TEST_CASE("a destroyed graph gives its memory back") {
  Stream stream(kGpu);
  StreamGuard on(stream);
  Tensor x = full({1 << 20}, 1.0, TensorOptions().device(kGpu));
  cuda_empty_cache(kGpu);
  const int64_t reserved_before = cuda_memory_stats(kGpu).reserved_bytes;
  {
    CudaGraph graph;
    std::string why;
    REQUIRE(graph.capture(
        stream, [&] { (void)(x * 2.0 + 1.0); }, &why));
    graph.replay(stream);
    CHECK(cuda_memory_stats(kGpu).reserved_bytes > reserved_before);
  }
  CHECK(cuda_memory_stats(kGpu).reserved_bytes == reserved_before);
}
