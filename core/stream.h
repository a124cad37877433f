// CUDA streams and events, and the current stream of each device.
//
// Every op on a CUDA tensor is queued on the current stream of the tensor's device, which is the
// device's default (legacy) stream until set_current_stream or a StreamGuard picks another. The
// current stream is per thread and per device, so a data-loading thread can copy on its own
// stream while the training thread computes on another.
// Stream and Event own their CUDA handles (opaque here: no CUDA header is included); StreamView
// is a non-owning reference that is cheap to copy. Streams made by Stream do not synchronize
// implicitly with the legacy default stream: order work across streams with Event, and tell the
// caching allocator about cross-stream use with record_stream (core/cuda_allocator.h).
// In a build without CUDA, creating a Stream or asking for a CUDA device's stream throws.
#pragma once

#include <cstdint>

#include "mpigrad/core/device.h"

namespace mpigrad::core {

class Event;

// A stream of one device, not owned. A null handle is that device's legacy default stream.
class StreamView {
 public:
  StreamView() = default;
  // A stream that mpigrad did not create (NCCL's, a host code's), known by its handle: it must
  // stay alive while the caching allocator may hold blocks used on it (NcclCommunicator never
  // destroys its stream for that reason).
  StreamView(Device device, void* handle)
      : device_(device), handle_(handle), id_(foreign_id(handle)) {}

  Device device() const { return device_; }
  void* handle() const { return handle_; }  // a cudaStream_t
  // Who the stream is, for the caching allocator: 0 for the legacy default stream, a fresh
  // number for every Stream ever made (never reused, so a new stream that happens to get a
  // destroyed stream's handle is still a different stream), and one derived from the handle for
  // foreign streams.
  uint64_t id() const { return id_; }

  // Blocks until all work queued on the stream has finished.
  void synchronize() const;
  // True when all work queued on the stream has finished.
  bool query() const;
  // Later work on this stream waits until `event` has happened (nothing blocks on the host).
  void wait(const Event& event) const;

  friend bool operator==(const StreamView& a, const StreamView& b) {
    return a.device_ == b.device_ && a.id_ == b.id_;
  }

 private:
  friend class Stream;
  friend struct StreamViewAccess;  // core/cuda/stream.cpp: the per-thread current streams
  StreamView(Device device, void* handle, uint64_t id)
      : device_(device), handle_(handle), id_(id) {}
  static uint64_t foreign_id(void* handle) {
    return handle == nullptr ? 0 : (uint64_t(1) << 63) | uint64_t(uintptr_t(handle));
  }

  Device device_ = cuda(0);
  void* handle_ = nullptr;
  uint64_t id_ = 0;
};

// A new CUDA stream on `device`. Destroying it waits for the work queued on it, then frees the
// caching allocator's cached blocks that belong to it (and, later, the blocks of its tensors
// still alive when it went), so no other stream inherits memory that it may still be using.
class Stream {
 public:
  explicit Stream(Device device = cuda(0));
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  StreamView view() const { return StreamView(device_, handle_, id_); }
  operator StreamView() const { return view(); }  // NOLINT: a Stream is usable where a view is
  Device device() const { return device_; }
  void* handle() const { return handle_; }
  uint64_t id() const { return id_; }
  void synchronize() const { view().synchronize(); }
  bool query() const { return view().query(); }
  void wait(const Event& event) const { view().wait(event); }

 private:
  void release() noexcept;

  Device device_;
  void* handle_ = nullptr;
  uint64_t id_ = 0;
};

// A CUDA event: a point in a stream's work that other streams and the host can wait for, and,
// with timing enabled, a timestamp. The CUDA event is created on the first record().
class Event {
 public:
  explicit Event(bool enable_timing = false) : timing_(enable_timing) {}
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Marks the current end of `stream`'s queued work.
  void record(StreamView stream);
  // Blocks until the recorded work has finished; returns at once if never recorded.
  void synchronize() const;
  // True when the recorded work has finished (or nothing was recorded).
  bool query() const;
  // Milliseconds from this event to `end`; both recorded with timing enabled and finished.
  float elapsed_ms(const Event& end) const;

  void* handle() const { return handle_; }  // a cudaEvent_t, null before the first record
  Device device() const { return device_; }

 private:
  bool timing_;
  Device device_ = cuda(0);
  void* handle_ = nullptr;
};

// The stream ops on `device` are queued on, for the calling thread.
StreamView current_stream(Device device);
// The legacy default stream of `device`.
StreamView default_stream(Device device);
// Makes `stream` the calling thread's current stream of its device.
void set_current_stream(StreamView stream);

// Makes `stream` current for its device for this object's lifetime, then restores the previous.
class StreamGuard {
 public:
  explicit StreamGuard(StreamView stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  StreamView previous_;
};

}  // namespace mpigrad::core
