// The caching CUDA device allocator (see caching_allocator.cuh and core/cuda_allocator.h).
#include "mpigrad/core/cuda/caching_allocator.cuh"

#include <algorithm>
#include <atomic>

#include "mpigrad/core/cuda/cuda_check.cuh"
#include "mpigrad/core/error.h"
#include "mpigrad/core/stream.h"

namespace mpigrad::core::cuda_detail {

namespace {

constexpr size_t kGranule = 512;
constexpr size_t kFineBelow = 4096;
// Pool ids share the bins' key space with stream ids: Streams count up from 1 and foreign
// streams set the top bit, so pools set the one below it.
constexpr uint64_t kPoolBit = uint64_t(1) << 62;
std::atomic<uint64_t> next_pool{1};

// cudaMalloc during a capture: allowed once this thread relaxes its capture mode (the pattern
// the CUDA guide gives for allocators), restored right after.
cudaError_t malloc_while_capturing(void** ptr, size_t size) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaError_t status = cudaThreadExchangeStreamCaptureMode(&mode);
  if (status != cudaSuccess) return status;
  status = cudaMalloc(ptr, size);
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
  return status;
}

void update_peaks(CudaMemoryStats& stats) {
  stats.peak_allocated_bytes = std::max(stats.peak_allocated_bytes, stats.allocated_bytes);
  stats.peak_reserved_bytes = std::max(stats.peak_reserved_bytes, stats.reserved_bytes);
}

}  // namespace

size_t CudaCachingAllocator::round_size(size_t nbytes) {
  size_t rounded = (nbytes + kGranule - 1) / kGranule * kGranule;
  if (rounded < kFineBelow) return rounded;
  const size_t power = size_t(1) << (63 - __builtin_clzll(rounded));
  const size_t step = power / 8;
  return (rounded + step - 1) / step * step;
}

void* CudaCachingAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  const size_t size = round_size(nbytes);
  uint64_t stream = current_stream(cuda(device_)).id();

  std::lock_guard<std::mutex> lock(mutex_);
  const auto pool = capture_pools_.find(stream);
  const bool capturing = pool != capture_pools_.end();
  if (capturing) stream = pool->second;
  // Not while capturing: the events it queries may belong to work the capture holds back.
  if (!capturing) move_finished_parked();
  auto bin = bins_.find({stream, size});
  if (bin != bins_.end() && !bin->second.empty()) {
    void* ptr = bin->second.back();
    bin->second.pop_back();
    live_[ptr] = Block{size, stream, false, {}, false};
    stats_.allocated_bytes += int64_t(size);
    ++stats_.cache_hits;
    update_peaks(stats_);
    return ptr;
  }

  DeviceGuard guard(device_);
  void* ptr = nullptr;
  cudaError_t status = capturing ? malloc_while_capturing(&ptr, size) : cudaMalloc(&ptr, size);
  if (status == cudaErrorMemoryAllocation && !capturing) {
    // Give the cached blocks back (cudaFree waits for the device) and try once more.
    (void)cudaGetLastError();
    release_free_blocks();
    status = cudaMalloc(&ptr, size);
  }
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    fail("CUDA out of memory on cuda:", device_, ": cudaMalloc of ", size, " bytes failed (",
         cudaGetErrorString(status), "); ", stats_.allocated_bytes,
         " bytes are in use by tensors and ", stats_.reserved_bytes,
         " reserved by mpigrad's caching allocator");
  }
  live_[ptr] = Block{size, stream, false, {}, false};
  stats_.allocated_bytes += int64_t(size);
  stats_.reserved_bytes += int64_t(size);
  ++stats_.device_allocations;
  update_peaks(stats_);
  return ptr;
}

void CudaCachingAllocator::deallocate(void* ptr, size_t) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return;  // not ours; nothing sensible to do in a destructor
  Block block = std::move(it->second);
  live_.erase(it);
  stats_.allocated_bytes -= int64_t(block.size);
  if (block.lost) return;
  if (const auto pool = capture_pools_.find(block.stream_id); pool != capture_pools_.end()) {
    block.stream_id = pool->second;  // the captured work may read it on every replay
  }
  if (block.used_on.empty()) {
    if (!block.orphan) {
      bins_[{block.stream_id, block.size}].push_back(ptr);
      return;
    }
    try {
      free_block(ptr, block.size);
    } catch (...) {
      (void)cudaGetLastError();  // the runtime is failing (often: the process is exiting)
    }
    return;
  }
  Parked parked{ptr, std::move(block), {}};
  int previous = 0;
  bool ok = make_home_device_current(device_) == cudaSuccess &&
            cudaGetDevice(&previous) == cudaSuccess &&
            (previous == device_ || cudaSetDevice(device_) == cudaSuccess);
  for (const UsedOn& stream : parked.block.used_on) {
    if (!ok) break;
    cudaEvent_t event = nullptr;
    ok = cudaEventCreateWithFlags(&event, cudaEventDisableTiming) == cudaSuccess;
    if (ok) {
      parked.events.push_back(event);
      ok = cudaEventRecord(event, stream.handle) == cudaSuccess;
    }
  }
  if (previous != device_) (void)cudaSetDevice(previous);
  if (!ok) {
    // The runtime is failing (often: the process is exiting). Never reuse the block.
    (void)cudaGetLastError();
    return;
  }
  parked_.push_back(std::move(parked));
}

void CudaCachingAllocator::move_finished_parked() {
  for (size_t i = 0; i < parked_.size();) {
    Parked& parked = parked_[i];
    bool finished = true;
    for (cudaEvent_t event : parked.events) {
      const cudaError_t status = cudaEventQuery(event);
      if (status == cudaErrorNotReady) {
        finished = false;
        break;
      }
      MPIGRAD_CUDA_CHECK(status);
    }
    if (!finished) {
      ++i;
      continue;
    }
    for (cudaEvent_t event : parked.events) (void)cudaEventDestroy(event);
    void* ptr = parked.ptr;
    const Block block = std::move(parked.block);
    parked_[i] = std::move(parked_.back());
    parked_.pop_back();
    if (block.orphan) {
      free_block(ptr, block.size);
    } else {
      bins_[{block.stream_id, block.size}].push_back(ptr);
    }
  }
}

void CudaCachingAllocator::release_free_blocks() {
  DeviceGuard guard(device_);
  for (auto& [key, pointers] : bins_) {
    for (void* ptr : pointers) {
      MPIGRAD_CUDA_CHECK(cudaFree(ptr));
      stats_.reserved_bytes -= int64_t(key.second);
      ++stats_.device_frees;
    }
    pointers.clear();
  }
  bins_.clear();
}

void CudaCachingAllocator::free_block(void* ptr, size_t size) {
  DeviceGuard guard(device_);
  MPIGRAD_CUDA_CHECK(cudaFree(ptr));
  stats_.reserved_bytes -= int64_t(size);
  ++stats_.device_frees;
}

void CudaCachingAllocator::record_stream(void* ptr, StreamView stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  MPIGRAD_CHECK(it != live_.end(),
                "record_stream: the tensor's memory was not allocated by the "
                "CUDA caching allocator of cuda:",
                device_);
  Block& block = it->second;
  if (stream.id() == block.stream_id) return;
  for (const UsedOn& used : block.used_on) {
    if (used.id == stream.id()) return;
  }
  block.used_on.push_back({stream.id(), static_cast<cudaStream_t>(stream.handle())});
}

void CudaCachingAllocator::stream_destroyed(uint64_t stream_id, bool drained) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto bin = bins_.begin(); bin != bins_.end();) {
    if (bin->first.first != stream_id) {
      ++bin;
      continue;
    }
    // Undrained work may still use them: better lost than freed under a running kernel.
    if (drained) {
      for (void* ptr : bin->second) free_block(ptr, bin->first.second);
    }
    bin = bins_.erase(bin);
  }
  for (auto& [ptr, block] : live_) {
    const bool used_there =
        std::erase_if(block.used_on, [&](const UsedOn& used) { return used.id == stream_id; }) > 0;
    if (block.stream_id == stream_id) block.orphan = true;
    // Drained, its work on the destroyed stream is done: no event to wait for there. Not
    // drained, that work may still run: the block is lost rather than freed under it.
    if (!drained && (used_there || block.stream_id == stream_id)) block.lost = true;
  }
  for (Parked& parked : parked_) {
    if (parked.block.stream_id == stream_id) parked.block.orphan = true;
  }
}

uint64_t CudaCachingAllocator::begin_capture_pool(uint64_t stream_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  MPIGRAD_CHECK(!capture_pools_.contains(stream_id),
                "CUDA graph capture: the stream is being captured already");
  const uint64_t pool = kPoolBit | next_pool.fetch_add(1);
  capture_pools_[stream_id] = pool;
  return pool;
}

void CudaCachingAllocator::end_capture_pool(uint64_t stream_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  capture_pools_.erase(stream_id);
}

void CudaCachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Parked& parked : parked_) {
    for (cudaEvent_t event : parked.events) MPIGRAD_CUDA_CHECK(cudaEventSynchronize(event));
  }
  move_finished_parked();
  release_free_blocks();
}

CudaMemoryStats CudaCachingAllocator::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CudaCachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

}  // namespace mpigrad::core::cuda_detail
