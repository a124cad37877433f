// Streams, events and the per-thread current stream of each device (core/stream.h).
#include "mpigrad/core/stream.h"

#include <cuda_runtime.h>

#include <atomic>
#include <utility>
#include <vector>

#include "mpigrad/core/cuda.h"
#include "mpigrad/core/cuda/cuda_backend.cuh"
#include "mpigrad/core/cuda/cuda_check.cuh"
#include "mpigrad/core/error.h"

namespace mpigrad::core {

struct StreamViewAccess {
  static StreamView make(Device device, void* handle, uint64_t id) {
    return StreamView(device, handle, id);
  }
};

namespace {

int checked_index(Device device, const char* what) {
  MPIGRAD_CHECK(device.is_cuda(), what, ": ", device, " is not a CUDA device");
  const int count = cuda_device_count();
  MPIGRAD_CHECK(count > 0, what, ": device ", device,
                " is not available: no CUDA device is visible");
  MPIGRAD_CHECK(device.index < count, what, ": device ", device, " is not available: ", count,
                " CUDA device(s) visible");
  return device.index;
}

// The calling thread's current stream per device, as (handle, id); the legacy default stream
// (null, 0) until set.
struct CurrentStream {
  void* handle = nullptr;
  uint64_t id = 0;
};
std::vector<CurrentStream>& current_streams() {
  thread_local std::vector<CurrentStream> streams;
  return streams;
}

// Ids of Streams: 0 is the legacy default stream, foreign streams have the top bit set.
std::atomic<uint64_t> next_stream_id{1};

cudaStream_t as_stream(void* handle) {
  return static_cast<cudaStream_t>(handle);
}
cudaEvent_t as_event(void* handle) {
  return static_cast<cudaEvent_t>(handle);
}

}  // namespace

// ---- StreamView ------------------------------------------------------------------------------

void StreamView::synchronize() const {
  const int index = checked_index(device_, "StreamView::synchronize");
  cuda_detail::DeviceGuard guard(index);
  MPIGRAD_CUDA_CHECK(cudaStreamSynchronize(as_stream(handle_)));
  cuda_detail::cuda_backend(index).device_checks().poll(false);
}

bool StreamView::query() const {
  cuda_detail::DeviceGuard guard(checked_index(device_, "StreamView::query"));
  const cudaError_t status = cudaStreamQuery(as_stream(handle_));
  if (status == cudaErrorNotReady) return false;
  MPIGRAD_CUDA_CHECK(status);
  return true;
}

void StreamView::wait(const Event& event) const {
  if (event.handle() == nullptr) return;  // never recorded: nothing to wait for
  cuda_detail::DeviceGuard guard(checked_index(device_, "StreamView::wait"));
  MPIGRAD_CUDA_CHECK(cudaStreamWaitEvent(as_stream(handle_), as_event(event.handle()), 0));
}

// ---- Stream ----------------------------------------------------------------------------------

Stream::Stream(Device device) : device_(device) {
  cuda_detail::DeviceGuard guard(checked_index(device, "Stream"));
  cudaStream_t stream = nullptr;
  MPIGRAD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  handle_ = stream;
  id_ = next_stream_id.fetch_add(1, std::memory_order_relaxed);
}

void Stream::release() noexcept {
  if (handle_ == nullptr) return;
  // Its queued work must end before its blocks can go: a block cached for this stream may still
  // be read by a kernel queued on it. Errors cannot be reported from here; the blocks are then
  // kept out of reuse by the allocator rather than freed.
  try {
    cuda_detail::DeviceGuard guard(device_.index);
    const bool drained = cudaStreamSynchronize(as_stream(handle_)) == cudaSuccess;
    cuda_detail::cuda_backend(device_.index).caching_allocator().stream_destroyed(id_, drained);
    (void)cudaStreamDestroy(as_stream(handle_));
  } catch (...) {
  }
  (void)cudaGetLastError();
  handle_ = nullptr;
}

Stream::~Stream() {
  release();
}

Stream::Stream(Stream&& other) noexcept
    : device_(other.device_),
      handle_(std::exchange(other.handle_, nullptr)),
      id_(std::exchange(other.id_, 0)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    release();
    device_ = other.device_;
    handle_ = std::exchange(other.handle_, nullptr);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

// ---- Event -----------------------------------------------------------------------------------

Event::~Event() {
  if (handle_ != nullptr) (void)cudaEventDestroy(as_event(handle_));
}

Event::Event(Event&& other) noexcept
    : timing_(other.timing_),
      device_(other.device_),
      handle_(std::exchange(other.handle_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) (void)cudaEventDestroy(as_event(handle_));
    timing_ = other.timing_;
    device_ = other.device_;
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

void Event::record(StreamView stream) {
  cuda_detail::DeviceGuard guard(checked_index(stream.device(), "Event::record"));
  if (handle_ != nullptr && !(device_ == stream.device())) {
    MPIGRAD_CUDA_CHECK(cudaEventDestroy(as_event(handle_)));  // events belong to one device
    handle_ = nullptr;
  }
  if (handle_ == nullptr) {
    cudaEvent_t event = nullptr;
    MPIGRAD_CUDA_CHECK(
        cudaEventCreateWithFlags(&event, timing_ ? cudaEventDefault : cudaEventDisableTiming));
    handle_ = event;
    device_ = stream.device();
  }
  MPIGRAD_CUDA_CHECK(cudaEventRecord(as_event(handle_), as_stream(stream.handle())));
}

void Event::synchronize() const {
  if (handle_ == nullptr) return;
  MPIGRAD_CUDA_CHECK(cudaEventSynchronize(as_event(handle_)));
}

bool Event::query() const {
  if (handle_ == nullptr) return true;
  const cudaError_t status = cudaEventQuery(as_event(handle_));
  if (status == cudaErrorNotReady) return false;
  MPIGRAD_CUDA_CHECK(status);
  return true;
}

float Event::elapsed_ms(const Event& end) const {
  MPIGRAD_CHECK(handle_ != nullptr && end.handle_ != nullptr,
                "Event::elapsed_ms: both events must have been recorded");
  MPIGRAD_CHECK(timing_ && end.timing_,
                "Event::elapsed_ms: both events need Event(/*enable_timing=*/true)");
  float ms = 0.0f;
  MPIGRAD_CUDA_CHECK(cudaEventElapsedTime(&ms, as_event(handle_), as_event(end.handle_)));
  return ms;
}

// ---- Current stream --------------------------------------------------------------------------

StreamView current_stream(Device device) {
  const int index = checked_index(device, "current_stream");
  const std::vector<CurrentStream>& streams = current_streams();
  const CurrentStream current =
      size_t(index) < streams.size() ? streams[size_t(index)] : CurrentStream{};
  return StreamViewAccess::make(device, current.handle, current.id);
}

StreamView default_stream(Device device) {
  checked_index(device, "default_stream");
  return StreamView(device, nullptr);
}

void set_current_stream(StreamView stream) {
  const int index = checked_index(stream.device(), "set_current_stream");
  std::vector<CurrentStream>& streams = current_streams();
  if (streams.size() <= size_t(index)) streams.resize(size_t(index) + 1);
  streams[size_t(index)] = CurrentStream{stream.handle(), stream.id()};
}

StreamGuard::StreamGuard(StreamView stream) : previous_(current_stream(stream.device())) {
  set_current_stream(stream);
}

StreamGuard::~StreamGuard() {
  // Cannot fail: the device was valid when the guard was made.
  current_streams()[size_t(previous_.device().index)] =
      CurrentStream{previous_.handle(), previous_.id()};
}

}  // namespace mpigrad::core
