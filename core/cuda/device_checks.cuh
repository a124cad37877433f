// Internal to core/cuda: the queue of device-side checks of one GPU (core/device_checks.h).
//
// push() queues, on a stream, the copy of an 8-byte code from device memory into a pinned slot,
// and an event after it; poll() reads the slots whose events have completed. The pinned slots
// come from 4 KiB pages allocated once and reused, and the events are reused too, so a check
// per step costs one small copy and one event record, and no allocation once warm.
// Thread-safe: one mutex guards the queue.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace mpigrad::core::cuda_detail {

class DeviceCheckQueue {
 public:
  // What a raised code means, as the message of the error to raise.
  using Report = std::function<std::string(uint64_t code)>;

  explicit DeviceCheckQueue(int device) : device_(device) {}
  DeviceCheckQueue(const DeviceCheckQueue&) = delete;
  DeviceCheckQueue& operator=(const DeviceCheckQueue&) = delete;

  // Copies `device_code` (8 bytes of device memory; `passed` means the check passed) behind the
  // work queued on `stream`. Before that, raises a failure of an earlier check that has finished.
  // The caller has the queue's device current.
  void push(cudaStream_t stream, const void* device_code, uint64_t passed, Report report);
  // Raises the first failure among the finished checks (all of them, waiting, when `wait`).
  void poll(bool wait);

 private:
  struct Pending {
    cudaEvent_t done = nullptr;
    uint64_t* slot = nullptr;
    uint64_t passed = 0;
    Report report;
  };
  uint64_t* take_slot();  // caller holds mutex_
  // Moves the finished checks out of pending_; returns the first failure's message or "".
  std::string collect(bool wait);  // caller holds mutex_

  const int device_;
  std::mutex mutex_;
  std::vector<Pending> pending_;  // in queue order
  std::vector<cudaEvent_t> free_events_;
  std::vector<uint64_t*> free_slots_;
};

}  // namespace mpigrad::core::cuda_detail
