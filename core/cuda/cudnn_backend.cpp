// The cuDNN handle of a CudnnBackend (cudnn_backend.cuh): created on the first lease, bound to
// the caller's current stream on every lease.
#include "mpigrad/core/cuda/cudnn_backend.cuh"

namespace mpigrad::core::cuda_detail {

// Never runs for the registry's backends (they are leaked on purpose); kept correct anyway.
CudnnBackend::~CudnnBackend() {
  if (handle_ != nullptr) (void)cudnnDestroy(handle_);
}

CudnnBackend::HandleLease::HandleLease(CudnnBackend& backend) : lock_(backend.handle_mutex_) {
  if (backend.handle_ == nullptr) {
    MPIGRAD_CUDNN_CHECK(cudnnCreate(&backend.handle_), backend.device());
  }
  handle_ = backend.handle_;
  MPIGRAD_CUDNN_CHECK(cudnnSetStream(handle_, backend.stream()), backend.device());
}

}  // namespace mpigrad::core::cuda_detail
