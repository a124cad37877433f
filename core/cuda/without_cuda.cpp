// The CUDA-facing API in a build without CUDA: the same symbols, answering "no CUDA".
//
// Compiled instead of the rest of core/cuda when MPIGRAD_WITH_CUDA is off, so code written
// against core/cuda.h, core/stream.h, core/cuda_allocator.h and core/pinned.h links and runs in
// every build: queries say zero devices, everything that needs a GPU throws core::Error.
#include "mpigrad/core/backend.h"
#include "mpigrad/core/cuda.h"
#include "mpigrad/core/cuda_allocator.h"
#include "mpigrad/core/cuda_graph.h"
#include "mpigrad/core/device_checks.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/pinned.h"
#include "mpigrad/core/stream.h"

namespace mpigrad::core {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  fail(what, ": this mpigrad was built without CUDA support");
}
}  // namespace

namespace detail {
Backend& cuda_backend_for(Device device) {
  fail("device ", device, " is not available: this mpigrad was built without CUDA support");
}
}  // namespace detail

bool cuda_built() {
  return false;
}
const CudaVisibility& cuda_visibility() {
  static const CudaVisibility visibility = [] {
    CudaVisibility none;
    none.built = false;
    return none;
  }();
  return visibility;
}
int cuda_device_count() {
  return 0;
}
bool cuda_is_available() {
  return false;
}
std::string cuda_device_name(Device) {
  no_cuda("cuda_device_name");
}
CudaDeviceInfo cuda_device_info(Device) {
  no_cuda("cuda_device_info");
}
std::string cuda_versions() {
  return "built without CUDA";
}
void set_cuda_home_device(Device) {
  no_cuda("set_cuda_home_device");
}
std::optional<Device> cuda_home_device() {
  return std::nullopt;
}
Device cuda_current_device() {
  no_cuda("cuda_current_device");
}
void cuda_synchronize(Device) {
  no_cuda("cuda_synchronize");
}
void check_device_errors(Device device) {
  if (device.is_cuda()) no_cuda("check_device_errors");
}

void StreamView::synchronize() const {
  no_cuda("StreamView::synchronize");
}
bool StreamView::query() const {
  no_cuda("StreamView::query");
}
void StreamView::wait(const Event&) const {
  no_cuda("StreamView::wait");
}
Stream::Stream(Device device) : device_(device) {
  no_cuda("Stream");
}
Stream::~Stream() = default;
void Stream::release() noexcept {}
Stream::Stream(Stream&& other) noexcept
    : device_(other.device_), handle_(other.handle_), id_(other.id_) {
  other.handle_ = nullptr;
}
Stream& Stream::operator=(Stream&& other) noexcept {
  device_ = other.device_;
  handle_ = other.handle_;
  id_ = other.id_;
  other.handle_ = nullptr;
  return *this;
}
Event::~Event() = default;
Event::Event(Event&& other) noexcept
    : timing_(other.timing_), device_(other.device_), handle_(other.handle_) {
  other.handle_ = nullptr;
}
Event& Event::operator=(Event&& other) noexcept {
  timing_ = other.timing_;
  device_ = other.device_;
  handle_ = other.handle_;
  other.handle_ = nullptr;
  return *this;
}
void Event::record(StreamView) {
  no_cuda("Event::record");
}
void Event::synchronize() const {}
bool Event::query() const {
  return true;
}
float Event::elapsed_ms(const Event&) const {
  no_cuda("Event::elapsed_ms");
}
StreamView current_stream(Device) {
  no_cuda("current_stream");
}
StreamView default_stream(Device) {
  no_cuda("default_stream");
}
void set_current_stream(StreamView) {
  no_cuda("set_current_stream");
}
StreamGuard::StreamGuard(StreamView) {
  no_cuda("StreamGuard");
}
StreamGuard::~StreamGuard() = default;

CudaMemoryStats cuda_memory_stats(Device) {
  no_cuda("cuda_memory_stats");
}
void reset_cuda_peak_stats(Device) {
  no_cuda("reset_cuda_peak_stats");
}
void cuda_empty_cache(Device) {
  no_cuda("cuda_empty_cache");
}
void record_stream(const Tensor&, StreamView) {
  no_cuda("record_stream");
}

Allocator& pinned_host_allocator() {
  no_cuda("pinned_host_allocator");
}
Tensor empty_pinned(const Shape&, DType) {
  no_cuda("empty_pinned");
}
Tensor pin_memory(const Tensor&) {
  no_cuda("pin_memory");
}
bool is_pinned(const Tensor&) {
  return false;
}
Tensor to_async(const Tensor&, Device) {
  no_cuda("to_async");
}

CudaGraph::~CudaGraph() = default;
void CudaGraph::reset() noexcept {}
bool CudaGraph::capture(StreamView, const std::function<void()>&, std::string*) {
  no_cuda("CudaGraph::capture");
}
void CudaGraph::replay(StreamView) const {
  no_cuda("CudaGraph::replay");
}

}  // namespace mpigrad::core
