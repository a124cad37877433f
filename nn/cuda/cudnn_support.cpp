// The per-device cuDNN handle cache of cudnn_support.cuh.
#include <memory>
#include <mutex>
#include <vector>

#include "mpigrad/core/cuda.h"
#include "mpigrad/nn/cuda/cudnn_support.cuh"

namespace mpigrad::nn::cuda_ops::detail {

CudnnHandle& cudnn_handle(int device) {
  const int count = core::cuda_device_count();
  MPIGRAD_CHECK(device >= 0 && device < count, "cuDNN: device cuda:", device,
                " is not available (", count, " CUDA devices visible)");
  // Leaked on purpose, like core's backend registry: work may be queued from static destructors.
  static std::mutex mutex;
  static auto* handles = new std::vector<std::unique_ptr<CudnnHandle>>();
  std::lock_guard<std::mutex> lock(mutex);
  if (handles->empty()) handles->resize(size_t(count));
  auto& handle = (*handles)[size_t(device)];
  if (!handle) handle = std::make_unique<CudnnHandle>(device);
  return *handle;
}

}  // namespace mpigrad::nn::cuda_ops::detail
