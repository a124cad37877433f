// The CUDA backend: core::Backend on one device, forwarding to kernels/cuda on the current
// stream (see cuda_backend.cuh).
#include "mpigrad/core/cuda/cuda_backend.cuh"

#include <cublas_v2.h>

#include <exception>
#include <stdexcept>
#include <string>
#include <utility>

#include "mpigrad/core/cuda/cuda_check.cuh"
#include "mpigrad/core/stream.h"
#include "mpigrad/kernels/cross_entropy.h"
#include "mpigrad/kernels/random.h"

namespace mpigrad::core::cuda_detail {

namespace {

// Runs a kernels/cuda launcher with the device current; its standard exceptions become
// core::Error with the same message, so callers see one exception type for every failure.
template <typename Fn>
decltype(auto) launch(int device, Fn&& fn) {
  DeviceGuard guard(device);
  try {
    return std::forward<Fn>(fn)();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& error) {
    throw Error(error.what());
  }
}

// Device scratch memory from the caching allocator for the duration of one launch.
class Scratch {
 public:
  Scratch(Allocator& allocator, size_t nbytes)
      : allocator_(allocator), nbytes_(nbytes), ptr_(nbytes > 0 ? allocator.allocate(nbytes) : nullptr) {}
  ~Scratch() { allocator_.deallocate(ptr_, nbytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return ptr_; }

 private:
  Allocator& allocator_;
  size_t nbytes_;
  void* ptr_;
};

void check_cublas(cublasStatus_t status, const char* call, int device) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    fail("cuBLAS call ", call, " failed on cuda:", device, ": ", cublasGetStatusName(status), " (",
         cublasGetStatusString(status), ")");
  }
}

}  // namespace

CudaBackend::CudaBackend(int device) : device_(device), allocator_(device), checks_(device) {}

// Never runs for the registry's backends (they are leaked on purpose); kept correct anyway.
CudaBackend::~CudaBackend() {
  if (blas_ != nullptr) (void)cublasDestroy(static_cast<cublasHandle_t>(blas_));
}

cudaStream_t CudaBackend::stream() const {
  return static_cast<cudaStream_t>(current_stream(cuda(device_)).handle());
}

void* CudaBackend::blas_handle() {
  // Caller holds blas_mutex_.
  if (blas_ == nullptr) {
    cublasHandle_t handle = nullptr;
    check_cublas(cublasCreate(&handle), "cublasCreate", device_);
    blas_ = handle;
  }
  return blas_;
}

void CudaBackend::copy_from_host(void* dst, const void* src, int64_t nbytes) {
  if (nbytes <= 0) return;
  DeviceGuard guard(device_);
  cudaStream_t s = stream();
  MPIGRAD_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(nbytes), cudaMemcpyHostToDevice, s));
  // The caller may free or reuse the host buffer as soon as this returns.
  MPIGRAD_CUDA_CHECK(cudaStreamSynchronize(s));
}

void CudaBackend::copy_to_host(void* dst, const void* src, int64_t nbytes) {
  if (nbytes <= 0) return;
  DeviceGuard guard(device_);
  cudaStream_t s = stream();
  MPIGRAD_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(nbytes), cudaMemcpyDeviceToHost, s));
  MPIGRAD_CUDA_CHECK(cudaStreamSynchronize(s));
  checks_.poll(false);  // the host has waited anyway: raise a failed device check now
}

void CudaBackend::copy_from_host_async(void* dst, const void* src, int64_t nbytes) {
  if (nbytes <= 0) return;
  DeviceGuard guard(device_);
  cudaStream_t s = stream();
  MPIGRAD_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(nbytes), cudaMemcpyHostToDevice, s));
  if (pinned_contains(src)) pinned_record_use(src, s);
}

void CudaBackend::copy_to_host_async(void* dst, const void* src, int64_t nbytes) {
  if (nbytes <= 0) return;
  DeviceGuard guard(device_);
  cudaStream_t s = stream();
  MPIGRAD_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(nbytes), cudaMemcpyDeviceToHost, s));
  if (pinned_contains(dst)) pinned_record_use(dst, s);
}

void CudaBackend::unary(UnaryOp op, DType dtype, const StridedLoop& loop, void* out,
                        const void* in) {
  launch(device_, [&] { kernels::cuda::unary(op, dtype, loop, out, in, stream()); });
}

void CudaBackend::unary_backward(UnaryOp op, DType dtype, const StridedLoop& loop, void* grad_in,
                                 const void* grad_out, const void* in, const void* out) {
  launch(device_, [&] {
    kernels::cuda::unary_backward(op, dtype, loop, grad_in, grad_out, in, out, stream());
  });
}

void CudaBackend::binary(BinaryOp op, DType dtype, const StridedLoop& loop, void* out,
                         const void* a, const void* b) {
  launch(device_, [&] { kernels::cuda::binary(op, dtype, loop, out, a, b, stream()); });
}

void CudaBackend::where(DType dtype, const StridedLoop& loop, void* out, const void* cond,
                        const void* a, const void* b) {
  launch(device_, [&] { kernels::cuda::where(dtype, loop, out, cond, a, b, stream()); });
}

void CudaBackend::clamp(DType dtype, const StridedLoop& loop, void* out, const void* in,
                        double lo, double hi) {
  launch(device_, [&] { kernels::cuda::clamp(dtype, loop, out, in, lo, hi, stream()); });
}

void CudaBackend::copy(DType out_dtype, DType in_dtype, const StridedLoop& loop, void* out,
                       const void* in) {
  launch(device_, [&] { kernels::cuda::copy(out_dtype, in_dtype, loop, out, in, stream()); });
}

void CudaBackend::fill(DType dtype, int64_t n, void* out, double value) {
  launch(device_, [&] { kernels::cuda::fill(dtype, n, out, value, stream()); });
}

void CudaBackend::arange(DType dtype, int64_t n, void* out, double start, double step) {
  launch(device_, [&] { kernels::cuda::arange(dtype, n, out, start, step, stream()); });
}

void CudaBackend::reduce(ReduceOp op, DType dtype, int64_t outer, int64_t extent, int64_t inner,
                         void* out, int64_t* indices, const void* in) {
  launch(device_, [&] {
    Scratch workspace(allocator_,
                      kernels::cuda::reduce_workspace_bytes(op, dtype, outer, extent, inner));
    kernels::cuda::reduce(op, dtype, outer, extent, inner, out, indices, in, workspace.get(),
                          stream());
  });
}

void CudaBackend::gemm(DType dtype, const GemmShape& shape, double alpha, const void* a,
                       const void* b, double beta, void* c) {
  launch(device_, [&] {
    std::lock_guard<std::mutex> lock(blas_mutex_);  // the handle's stream is set per call
    kernels::cuda::gemm(dtype, shape, alpha, a, b, beta, c, blas_handle(), stream());
  });
}

void CudaBackend::softmax_forward(bool log, DType dtype, int64_t rows, int64_t cols, void* out,
                                  const void* in) {
  launch(device_,
         [&] { kernels::cuda::softmax_forward(log, dtype, rows, cols, out, in, stream()); });
}

void CudaBackend::softmax_backward(bool log, DType dtype, int64_t rows, int64_t cols,
                                   void* grad_in, const void* grad_out, const void* out) {
  launch(device_, [&] {
    kernels::cuda::softmax_backward(log, dtype, rows, cols, grad_in, grad_out, out, stream());
  });
}

int64_t CudaBackend::index_select(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                                  const int64_t* index, int64_t count, void* out,
                                  const void* in) {
  return launch(device_, [&] {
    Scratch flag(allocator_, kernels::cuda::kIndexCheckBytes);
    return kernels::cuda::index_select(dtype, outer, extent, inner, index, count, out, in,
                                       flag.get(), stream());
  });
}

int64_t CudaBackend::index_add(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                               const int64_t* index, int64_t count, void* out, const void* in) {
  return launch(device_, [&] {
    Scratch flag(allocator_, kernels::cuda::kIndexCheckBytes);
    return kernels::cuda::index_add(dtype, outer, extent, inner, index, count, out, in,
                                    flag.get(), stream());
  });
}

int64_t CudaBackend::gather(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                            const int64_t* index, int64_t count, void* out, const void* in) {
  return launch(device_, [&] {
    Scratch flag(allocator_, kernels::cuda::kIndexCheckBytes);
    return kernels::cuda::gather(dtype, outer, extent, inner, index, count, out, in, flag.get(),
                                 stream());
  });
}

int64_t CudaBackend::scatter_add(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                                 const int64_t* index, int64_t count, void* out,
                                 const void* in) {
  return launch(device_, [&] {
    Scratch flag(allocator_, kernels::cuda::kIndexCheckBytes);
    return kernels::cuda::scatter_add(dtype, outer, extent, inner, index, count, out, in,
                                      flag.get(), stream());
  });
}

void CudaBackend::uniform(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset,
                          double lo, double hi) {
  launch(device_,
         [&] { kernels::cuda::uniform(dtype, n, out, seed, offset, lo, hi, stream()); });
}

void CudaBackend::normal(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset,
                         double mean, double std) {
  launch(device_,
         [&] { kernels::cuda::normal(dtype, n, out, seed, offset, mean, std, stream()); });
}

void CudaBackend::bernoulli(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset,
                            double p) {
  launch(device_, [&] { kernels::cuda::bernoulli(dtype, n, out, seed, offset, p, stream()); });
}

void CudaBackend::cross_entropy(DType dtype, int64_t rows, int64_t cols, const void* logits,
                                const int64_t* targets, int64_t ignore_index, double grad_scale,
                                void* losses, void* grad, const TargetCheck& check) {
  launch(device_, [&] {
    if (rows == 0) return;
    cudaStream_t s = stream();
    // The kernel lowers this code to the first bad row; the queue reads it back later.
    Scratch code(allocator_, sizeof(uint64_t));
    MPIGRAD_CUDA_CHECK(cudaMemsetAsync(code.get(), 0xff, sizeof(uint64_t), s));
    kernels::cuda::cross_entropy(dtype, rows, cols, logits, targets, ignore_index, grad_scale,
                                 losses, grad, static_cast<uint64_t*>(code.get()), s);
    const int device = device_;
    checks_.push(s, code.get(), kernels::cuda::kNoBadTarget,
                 [check, cols, device](uint64_t bad) {
                   return bad_target_message(check, kernels::cuda::bad_target_row(bad),
                                             kernels::cuda::bad_target_value(bad), cols) +
                          " (checked on cuda:" + std::to_string(device) +
                          " without waiting, and reported at a later synchronization: the "
                          "steps queued in between got NaN for that row)";
                 });
  });
}

}  // namespace mpigrad::core::cuda_detail
