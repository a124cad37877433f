// Internal to core/cuda: the CUDA implementation of core::Backend for one device.
//
// Every op makes the backend's device current, takes the calling thread's current stream of that
// device, and queues kernels/cuda launchers on it; nothing waits except where a result must
// reach the host (copy_to_host, the index checks). Cross-entropy checks its targets on the device
// instead (core/device_checks.h); every copy to the host then raises a check that failed.
// Scratch memory (reduction partials, index check flags, the label check's code) comes from the
// same caching allocator and goes back to it right after the launch, which is safe because
// later users of the block are queued behind it on the stream.
// Standard exceptions from kernels/cuda are rethrown as core::Error with the same message.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "mpigrad/core/backend.h"
#include "mpigrad/core/cuda/caching_allocator.cuh"
#include "mpigrad/core/cuda/device_checks.cuh"

namespace mpigrad::core::cuda_detail {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;

  int device() const { return device_; }
  CudaCachingAllocator& caching_allocator() { return allocator_; }
  DeviceCheckQueue& device_checks() { return checks_; }
  cudaStream_t stream() const;  // the calling thread's current stream of this device

  Allocator& allocator() override { return allocator_; }
  void copy_from_host(void* device_dst, const void* host_src, int64_t nbytes) override;
  void copy_to_host(void* host_dst, const void* device_src, int64_t nbytes) override;
  // Non-blocking copies on the current stream (for core/pinned.h).
  void copy_from_host_async(void* device_dst, const void* host_src, int64_t nbytes);
  void copy_to_host_async(void* host_dst, const void* device_src, int64_t nbytes);

  void unary(UnaryOp op, DType dtype, const StridedLoop& loop, void* out,
             const void* in) override;
  void unary_backward(UnaryOp op, DType dtype, const StridedLoop& loop, void* grad_in,
                      const void* grad_out, const void* in, const void* out) override;
  void binary(BinaryOp op, DType dtype, const StridedLoop& loop, void* out, const void* a,
              const void* b) override;
  void where(DType dtype, const StridedLoop& loop, void* out, const void* cond, const void* a,
             const void* b) override;
  void clamp(DType dtype, const StridedLoop& loop, void* out, const void* in, double lo,
             double hi) override;
  void copy(DType out_dtype, DType in_dtype, const StridedLoop& loop, void* out,
            const void* in) override;
  void fill(DType dtype, int64_t n, void* out, double value) override;
  void arange(DType dtype, int64_t n, void* out, double start, double step) override;
  void reduce(ReduceOp op, DType dtype, int64_t outer, int64_t extent, int64_t inner, void* out,
              int64_t* indices, const void* in) override;
  void gemm(DType dtype, const GemmShape& shape, double alpha, const void* a, const void* b,
            double beta, void* c) override;
  void softmax_forward(bool log, DType dtype, int64_t rows, int64_t cols, void* out,
                       const void* in) override;
  void softmax_backward(bool log, DType dtype, int64_t rows, int64_t cols, void* grad_in,
                        const void* grad_out, const void* out) override;
  int64_t index_select(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                       const int64_t* index, int64_t count, void* out, const void* in) override;
  int64_t index_add(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                    const int64_t* index, int64_t count, void* out, const void* in) override;
  int64_t gather(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
                 int64_t count, void* out, const void* in) override;
  int64_t scatter_add(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                      const int64_t* index, int64_t count, void* out, const void* in) override;
  void uniform(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset, double lo,
               double hi) override;
  void normal(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset, double mean,
              double std) override;
  void bernoulli(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset,
                 double p) override;
  void cross_entropy(DType dtype, int64_t rows, int64_t cols, const void* logits,
                     const int64_t* targets, int64_t ignore_index, double grad_scale,
                     void* losses, void* grad, const TargetCheck& check) override;

 private:
  void* blas_handle();  // created on first use

  const int device_;
  CudaCachingAllocator allocator_;
  DeviceCheckQueue checks_;
  std::mutex blas_mutex_;
  void* blas_ = nullptr;  // cublasHandle_t
};

// The backend of visible device `index`, created on first use and never destroyed (tensors in
// static objects may be freed after static destructors have run). Throws core::Error when the
// device is not visible.
CudaBackend& cuda_backend(int index);

// The pinned host allocator's bookkeeping, used by core/pinned.h.
bool pinned_contains(const void* ptr);
void pinned_record_use(const void* ptr, cudaStream_t stream);

}  // namespace mpigrad::core::cuda_detail
