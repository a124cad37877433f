// The device-side check queue of core/cuda/device_checks.cuh and check_device_errors().
#include "mpigrad/core/cuda/device_checks.cuh"

#include <utility>

#include "mpigrad/core/cuda/cuda_backend.cuh"
#include "mpigrad/core/cuda/cuda_check.cuh"
#include "mpigrad/core/device_checks.h"
#include "mpigrad/core/error.h"

namespace mpigrad::core {

namespace cuda_detail {

namespace {
constexpr size_t kSlotPage = 4096;  // pinned bytes per page: 512 slots
}  // namespace

uint64_t* DeviceCheckQueue::take_slot() {
  if (free_slots_.empty()) {
    void* page = nullptr;
    // Never freed: the queue lives as long as its backend, which lives as long as the process.
    MPIGRAD_CUDA_CHECK(cudaHostAlloc(&page, kSlotPage, cudaHostAllocPortable));
    auto* slots = static_cast<uint64_t*>(page);
    for (size_t i = 0; i < kSlotPage / sizeof(uint64_t); ++i) free_slots_.push_back(slots + i);
  }
  uint64_t* slot = free_slots_.back();
  free_slots_.pop_back();
  return slot;
}

std::string DeviceCheckQueue::collect(bool wait) {
  std::string failure;
  size_t kept = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending& check = pending_[i];
    if (!failure.empty()) {
      pending_[kept++] = std::move(check);  // later failures wait for the next poll
      continue;
    }
    if (wait) {
      MPIGRAD_CUDA_CHECK(cudaEventSynchronize(check.done));
    } else {
      const cudaError_t status = cudaEventQuery(check.done);
      if (status == cudaErrorNotReady) {
        pending_[kept++] = std::move(check);
        continue;
      }
      MPIGRAD_CUDA_CHECK(status);
    }
    const uint64_t code = *check.slot;
    if (code != check.passed) failure = check.report(code);
    free_events_.push_back(check.done);
    free_slots_.push_back(check.slot);
  }
  pending_.resize(kept);
  return failure;
}

void DeviceCheckQueue::push(cudaStream_t stream, const void* device_code, uint64_t passed,
                            Report report) {
  // A captured copy would land in the slot on every replay, long after the slot went to another
  // check: checks are not part of CUDA graphs (core/cuda_graph.h says so).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MPIGRAD_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string failure = collect(false);
  MPIGRAD_CHECK(failure.empty(), failure);
  Pending check;
  check.slot = take_slot();
  check.passed = passed;
  check.report = std::move(report);
  if (free_events_.empty()) {
    MPIGRAD_CUDA_CHECK(cudaEventCreateWithFlags(&check.done, cudaEventDisableTiming));
  } else {
    check.done = free_events_.back();
    free_events_.pop_back();
  }
  MPIGRAD_CUDA_CHECK(
      cudaMemcpyAsync(check.slot, device_code, sizeof(uint64_t), cudaMemcpyDeviceToHost, stream));
  MPIGRAD_CUDA_CHECK(cudaEventRecord(check.done, stream));
  pending_.push_back(std::move(check));
}

void DeviceCheckQueue::poll(bool wait) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (pending_.empty()) return;
  DeviceGuard guard(device_);
  const std::string failure = collect(wait);
  MPIGRAD_CHECK(failure.empty(), failure);
}

}  // namespace cuda_detail

void check_device_errors(Device device) {
  if (device.is_cpu()) return;
  cuda_detail::cuda_backend(device.index).device_checks().poll(true);
}

}  // namespace mpigrad::core
