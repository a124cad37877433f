// The CUDA runtime queries (core/cuda.h), the per-device backend registry, and the allocator
// controls of core/cuda_allocator.h.
#include <cuda_runtime.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mpigrad/core/backend.h"
#include "mpigrad/core/cuda.h"
#include "mpigrad/core/cuda/cuda_backend.cuh"
#if !defined(MPIGRAD_WITHOUT_CUDNN)
#include "mpigrad/core/cuda/cudnn_backend.cuh"
#endif
#include "mpigrad/core/cuda/cuda_check.cuh"
#include "mpigrad/core/cuda_allocator.h"

namespace mpigrad::core {

namespace cuda_detail {

namespace {

// The home device (core/cuda.h). `home_generation` changes whenever `home_index` does, so each
// thread knows without locking whether it still has to switch.
std::mutex home_mutex;
int home_index = -1;                       // guarded by home_mutex
std::atomic<unsigned> home_generation{0};  // 0: no home device chosen yet
thread_local unsigned applied_generation = 0;

}  // namespace

cudaError_t make_home_device_current(int fallback) {
  if (applied_generation != 0 &&
      applied_generation == home_generation.load(std::memory_order_acquire)) {
    return cudaSuccess;
  }
  int home = -1;
  unsigned generation = 0;
  {
    std::lock_guard<std::mutex> lock(home_mutex);
    if (home_index < 0) {
      if (fallback < 0) return cudaSuccess;  // nothing chosen yet: leave the thread as it is
      home_index = fallback;
      home_generation.fetch_add(1, std::memory_order_acq_rel);
    }
    home = home_index;
    generation = home_generation.load(std::memory_order_acquire);
  }
  const cudaError_t status = cudaSetDevice(home);
  if (status == cudaSuccess) applied_generation = generation;
  return status;
}

CudaBackend& cuda_backend(int index) {
  const int count = cuda_device_count();
  if (count == 0) fail("device cuda:", index, " is not available: no CUDA device is visible");
  MPIGRAD_CHECK(index >= 0 && index < count, "device cuda:", index, " is not available: ", count,
                " CUDA device", count == 1 ? " is" : "s are", " visible (cuda:0..cuda:", count - 1,
                ")");
  // Leaked on purpose: tensors held by static objects may be freed after static destructors.
  static std::mutex mutex;
  static auto* backends = new std::vector<std::unique_ptr<CudaBackend>>();
  std::lock_guard<std::mutex> lock(mutex);
  if (backends->empty()) backends->resize(size_t(count));
  auto& backend = (*backends)[size_t(index)];
  if (!backend) {
    // The one place where the build's cuDNN matters: with it, the backend runs convolution,
    // batch norm and pooling; without it, those throw.
#if defined(MPIGRAD_WITHOUT_CUDNN)
    backend = std::make_unique<CudaBackend>(index);
#else
    backend = std::make_unique<CudnnBackend>(index);
#endif
  }
  return *backend;
}

}  // namespace cuda_detail

namespace detail {
// backend_for()'s way to the CUDA backends (declared in core/backend.cpp).
Backend& cuda_backend_for(Device device) {
  return cuda_detail::cuda_backend(device.index);
}
}  // namespace detail

bool cuda_built() {
  return true;
}

static_assert(int(cudaErrorStubLibrary) == kCudaErrorStubLibrary);
static_assert(int(cudaErrorInsufficientDriver) == kCudaErrorInsufficientDriver);
static_assert(int(cudaErrorNoDevice) == kCudaErrorNoDevice);

const CudaVisibility& cuda_visibility() {
  static const CudaVisibility visibility = [] {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) (void)cudaGetLastError();  // the answer is kept; clear the error
    return classify_cuda_device_count(int(status), count, cudaGetErrorName(status),
                                      cudaGetErrorString(status));
  }();
  return visibility;
}

int cuda_device_count() {
  const CudaVisibility& visibility = cuda_visibility();
  MPIGRAD_CHECK(!visibility.broken, visibility.describe(),
                "; fix the driver or the CUDA runtime, or hide the GPUs (CUDA_VISIBLE_DEVICES=) "
                "to run on the CPU");
  return visibility.device_count;
}

bool cuda_is_available() {
  return cuda_device_count() > 0;
}

std::string cuda_device_name(Device device) {
  return cuda_device_info(device).name;
}

CudaDeviceInfo cuda_device_info(Device device) {
  cuda_detail::cuda_backend(device.index);  // checks that it is visible
  cudaDeviceProp properties{};
  MPIGRAD_CUDA_CHECK(cudaGetDeviceProperties(&properties, device.index));
  CudaDeviceInfo info;
  info.name = properties.name;
  info.total_memory_bytes = int64_t(properties.totalGlobalMem);
  info.compute_major = properties.major;
  info.compute_minor = properties.minor;
  info.multiprocessors = properties.multiProcessorCount;
  return info;
}

std::string cuda_versions() {
  int runtime = 0, driver = 0;
  MPIGRAD_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  MPIGRAD_CUDA_CHECK(cudaDriverGetVersion(&driver));
  auto version = [](int v) {
    return v == 0 ? std::string("none")
                  : std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  };
  return "CUDA runtime " + version(runtime) + ", driver " + version(driver);
}

void set_cuda_home_device(Device device) {
  MPIGRAD_CHECK(device.is_cuda(), "set_cuda_home_device: ", device, " is not a CUDA device");
  cuda_detail::cuda_backend(device.index);  // checks that it is visible
  {
    std::lock_guard<std::mutex> lock(cuda_detail::home_mutex);
    cuda_detail::home_index = device.index;
    cuda_detail::home_generation.fetch_add(1, std::memory_order_acq_rel);
  }
  MPIGRAD_CUDA_CHECK(cuda_detail::make_home_device_current(device.index));
}

std::optional<Device> cuda_home_device() {
  std::lock_guard<std::mutex> lock(cuda_detail::home_mutex);
  if (cuda_detail::home_index < 0) return std::nullopt;
  return cuda(cuda_detail::home_index);
}

Device cuda_current_device() {
  MPIGRAD_CHECK(cuda_device_count() > 0, "cuda_current_device: no CUDA device is visible");
  int index = 0;
  MPIGRAD_CUDA_CHECK(cudaGetDevice(&index));
  return cuda(index);
}

void cuda_synchronize(Device device) {
  cuda_detail::cuda_backend(device.index);
  cuda_detail::DeviceGuard guard(device.index);
  MPIGRAD_CUDA_CHECK(cudaDeviceSynchronize());
  cuda_detail::cuda_backend(device.index).device_checks().poll(false);
}

CudaMemoryStats cuda_memory_stats(Device device) {
  return cuda_detail::cuda_backend(device.index).caching_allocator().stats();
}

void reset_cuda_peak_stats(Device device) {
  cuda_detail::cuda_backend(device.index).caching_allocator().reset_peak();
}

void cuda_empty_cache(Device device) {
  cuda_detail::cuda_backend(device.index).caching_allocator().empty_cache();
}

void record_stream(const Tensor& tensor, StreamView stream) {
  MPIGRAD_CHECK(tensor.defined(), "record_stream: undefined tensor");
  MPIGRAD_CHECK(tensor.device().is_cuda(), "record_stream: the tensor is on ", tensor.device(),
                ", not on a CUDA device");
  MPIGRAD_CHECK(stream.device() == tensor.device(), "record_stream: the tensor is on ",
                tensor.device(), " but the stream belongs to ", stream.device());
  if (tensor.storage()->data() == nullptr) return;  // empty tensors own no block
  cuda_detail::cuda_backend(tensor.device().index)
      .caching_allocator()
      .record_stream(tensor.storage()->data(), stream);
}

}  // namespace mpigrad::core
