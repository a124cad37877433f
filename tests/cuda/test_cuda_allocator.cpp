// The caching device allocator, pinned memory, streams and events: reuse without cudaMalloc in
// a steady loop, statistics, empty_cache, per-stream bins, record_stream, and asynchronous copies.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "cuda_test.h"
#include "mpigrad/core/cuda.h"
#include "mpigrad/core/cuda_allocator.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/pinned.h"
#include "mpigrad/core/stream.h"

namespace {

using namespace mpigrad::core;  // NOLINT

const Device kGpu = cuda(0);

// One "training step" worth of temporaries: a few sizes, all freed at the end.
double step(const Tensor& x) {
  Tensor y = x * 2.0 + 1.0;
  Tensor z = exp(y - x) * y;
  return sum(z).item<double>();
}

}  // namespace

MPIGRAD_CUDA_TEST_CASE("a steady loop reuses cached blocks and stops calling cudaMalloc") {
  Tensor x = ones({1 << 18}, TensorOptions().device(kGpu));
  step(x);  // warm-up fills the cache
  const CudaMemoryStats before = cuda_memory_stats(kGpu);
  for (int i = 0; i < 20; ++i) step(x);
  const CudaMemoryStats after = cuda_memory_stats(kGpu);
  CHECK(after.device_allocations == before.device_allocations);
  CHECK(after.cache_hits > before.cache_hits);
  CHECK(after.allocated_bytes == before.allocated_bytes);
}

MPIGRAD_CUDA_TEST_CASE("allocated, reserved and peak bytes, and empty_cache") {
  cuda_empty_cache(kGpu);
  reset_cuda_peak_stats(kGpu);
  const CudaMemoryStats start = cuda_memory_stats(kGpu);
  const int64_t nbytes = int64_t(3) << 20;  // 3 MiB: a size class of its own
  {
    Tensor t = empty({nbytes / 4}, TensorOptions().device(kGpu));
    const CudaMemoryStats held = cuda_memory_stats(kGpu);
    CHECK(held.allocated_bytes - start.allocated_bytes >= nbytes);
    CHECK(held.reserved_bytes - start.reserved_bytes >= nbytes);
    CHECK(held.peak_allocated_bytes >= held.allocated_bytes);
  }
  const CudaMemoryStats freed = cuda_memory_stats(kGpu);
  CHECK(freed.allocated_bytes == start.allocated_bytes);
  CHECK(freed.reserved_bytes - start.reserved_bytes >= nbytes);  // cached, not returned
  CHECK(freed.peak_allocated_bytes - start.allocated_bytes >= nbytes);
  cuda_empty_cache(kGpu);
  const CudaMemoryStats emptied = cuda_memory_stats(kGpu);
  CHECK(emptied.reserved_bytes == emptied.allocated_bytes);
  CHECK(emptied.device_frees > freed.device_frees);
  reset_cuda_peak_stats(kGpu);
  CHECK(cuda_memory_stats(kGpu).peak_allocated_bytes == emptied.allocated_bytes);
}

MPIGRAD_CUDA_TEST_CASE("blocks are reused per stream; record_stream delays reuse across streams") {
  cuda_empty_cache(kGpu);
  Stream side(kGpu);
  const Shape shape = {(int64_t(5) << 20) / 4};  // 5 MiB
  void* first = nullptr;
  {
    Tensor a = empty(shape, TensorOptions().device(kGpu));  // default stream
    first = a.data_ptr();
  }
  {
    StreamGuard guard(side);
    Tensor b = empty(shape, TensorOptions().device(kGpu));
    CHECK(b.data_ptr() != first);  // the default stream's free block is not handed to `side`
  }
  {
    Tensor c = empty(shape, TensorOptions().device(kGpu));
    CHECK(c.data_ptr() == first);  // but it is to the default stream again
    // Use c on `side`, free it: its block waits for `side` before the default stream reuses it.
    record_stream(c, side);
    Event done;
    done.record(current_stream(kGpu));
    side.wait(done);
    {
      StreamGuard guard(side);
      c.fill_(1.0);
    }
  }
  side.synchronize();
  Tensor d = empty(shape, TensorOptions().device(kGpu));
  CHECK(d.data_ptr() == first);  // side has finished, so the block is back in its bin
}

MPIGRAD_CUDA_TEST_CASE("a destroyed stream's blocks are freed, never inherited by a new stream") {
  cuda_empty_cache(kGpu);
  const Shape shape = {(int64_t(7) << 20) / 4};  // 7 MiB: a size class no other case uses
  Tensor kept;
  CudaMemoryStats before;
  {
    Stream old_stream(kGpu);
    StreamGuard guard(old_stream);
    { Tensor cached = empty(shape, TensorOptions().device(kGpu)); }  // cached for old_stream
    kept = empty(shape, TensorOptions().device(kGpu));               // still alive after it
    kept.fill_(2.0);
    before = cuda_memory_stats(kGpu);
  }
  // The cached block went with its stream.
  const CudaMemoryStats after_destroy = cuda_memory_stats(kGpu);
  CHECK(after_destroy.device_frees == before.device_frees + 1);
  CHECK(after_destroy.reserved_bytes < before.reserved_bytes);
  {
    // CUDA may hand the new stream the old one's handle; it must still get fresh memory.
    Stream new_stream(kGpu);
    StreamGuard guard(new_stream);
    Tensor fresh = empty(shape, TensorOptions().device(kGpu));
    CHECK(cuda_memory_stats(kGpu).device_allocations == after_destroy.device_allocations + 1);
    CHECK(new_stream.id() != 0);
  }
  // The tensor that outlived its stream still works, and its block is freed, not cached.
  CHECK(sum(kept).item<double>() == doctest::Approx(2.0 * double(shape[0])));
  const CudaMemoryStats before_release = cuda_memory_stats(kGpu);
  kept = Tensor();
  CHECK(cuda_memory_stats(kGpu).device_frees == before_release.device_frees + 1);
}

MPIGRAD_CUDA_TEST_CASE("stream ids are unique and survive copies of views") {
  Stream a(kGpu), b(kGpu);
  CHECK(a.id() != b.id());
  CHECK(a.view() == StreamView(a.view()));
  CHECK_FALSE(a.view() == b.view());
  CHECK(default_stream(kGpu).id() == 0);
  StreamGuard guard(a);
  CHECK(current_stream(kGpu).id() == a.id());
  CHECK(current_stream(kGpu).handle() == a.handle());
}

MPIGRAD_CUDA_TEST_CASE("asynchronous copies through pinned memory round-trip") {
  std::vector<float> values(1 << 20);
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(i % 1000) * 0.5f;
  Tensor host = pin_memory(Tensor::from_vector(values, {int64_t(values.size())}));
  CHECK(is_pinned(host));
  Stream copy_stream(kGpu);
  Tensor back;
  {
    StreamGuard guard(copy_stream);
    Tensor device = to_async(host, kGpu);
    back = to_async(device * 2.0, kCPU);
  }
  copy_stream.synchronize();
  CHECK(is_pinned(back));
  const std::vector<float> result = back.to_vector<float>();
  bool all_equal = true;
  for (size_t i = 0; i < values.size(); ++i) all_equal = all_equal && result[i] == values[i] * 2.0f;
  CHECK(all_equal);
}

MPIGRAD_CUDA_TEST_CASE("events time work and order streams") {
  Event start(true), stop(true);
  start.record(current_stream(kGpu));
  Tensor x = ones({1 << 22}, TensorOptions().device(kGpu));
  Tensor y = x * 3.0;
  stop.record(current_stream(kGpu));
  stop.synchronize();
  CHECK(stop.query());
  CHECK(start.elapsed_ms(stop) >= 0.0f);
  CHECK(sum(y).item<double>() == 3.0 * double(1 << 22));
  CHECK(!cuda_device_name(kGpu).empty());
  cuda_synchronize(kGpu);
}
