// Internal to core/cuda: the CUDA implementation of core::Backend for one device.
//
// CudaBackend runs everything on kernels/cuda and cuBLAS; the families it has no kernel for
// (convolution, batch norm, pooling) throw, naming cuDNN. A build with cuDNN creates the
// subclass CudnnBackend instead (core/cuda/cudnn_backend.cuh), which runs those on cuDNN.
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

#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <utility>

#include "mpigrad/core/backend.h"
#include "mpigrad/core/cuda/caching_allocator.cuh"
#include "mpigrad/core/cuda/cuda_check.cuh"
#include "mpigrad/core/cuda/device_checks.cuh"
#include "mpigrad/core/error.h"

namespace mpigrad::core::cuda_detail {

// Runs a kernels/cuda launcher (or a cuDNN call) with the device current; standard exceptions
// become core::Error with the same message, so callers see one exception type for every failure.
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
      : allocator_(allocator),
        nbytes_(nbytes),
        ptr_(nbytes > 0 ? allocator.allocate(nbytes) : nullptr) {}
  ~Scratch() { allocator_.deallocate(ptr_, nbytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return ptr_; }

 private:
  Allocator& allocator_;
  size_t nbytes_;
  void* ptr_;
};

class CudaBackend : public Backend {
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

  void unary(UnaryOp op, DType dtype, const StridedLoop& loop, void* out, const void* in) override;
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
  // cuBLAS with 16-bit operands and fp32 output: tensor cores. (CudnnBackend runs the 16-bit
  // convolutions.)
  void gemm_mixed(DType operand, const GemmShape& shape, double alpha, const void* a, const void* b,
                  double beta, float* c) override;
  std::string mixed_precision_kernels(DType operand) override;
  void softmax_forward(bool log, DType dtype, int64_t rows, int64_t cols, void* out, const void* in,
                       const kernels::SoftmaxScaleMask& input) override;
  void softmax_backward(bool log, DType dtype, int64_t rows, int64_t cols, void* grad_in,
                        const void* grad_out, const void* out, double scale) override;
  int64_t index_select(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                       const int64_t* index, int64_t count, void* out, const void* in) override;
  int64_t index_add(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
                    int64_t count, void* out, const void* in) override;
  int64_t gather(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
                 int64_t count, void* out, const void* in) override;
  int64_t scatter_add(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                      const int64_t* index, int64_t count, void* out, const void* in) override;
  int64_t scatter_reduce(ScatterReduceOp op, DType dtype, int64_t outer, int64_t extent,
                         int64_t inner, const int64_t* index, int64_t count, void* out,
                         const void* in) override;
  void scatter_winner(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                      const int64_t* index, int64_t count, const void* out, const void* base,
                      const void* in, int64_t* winner) override;
  int64_t gather_mul_scatter(DType dtype, const kernels::GatherMulScatterArgs& args) override;
  int64_t radius_graph_count(const kernels::RadiusGraphArgs& args, int64_t* counts) override;
  void radius_graph_write(const kernels::RadiusGraphArgs& args,
                          const kernels::RadiusGraphOutput& out) override;
  void uniform(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset, double lo,
               double hi) override;
  void normal(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset, double mean,
              double std) override;
  void bernoulli(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset,
                 double p) override;
  void cross_entropy(DType dtype, int64_t rows, int64_t cols, const void* logits,
                     const int64_t* targets, int64_t ignore_index, double grad_scale, void* losses,
                     void* grad, const TargetCheck& check) override;

  // The cuDNN families: these throw (a build without cuDNN); CudnnBackend overrides them.
  void conv2d_forward(DType dtype, const Conv2dShape& shape, const void* x, const void* w,
                      void* y) override;
  void conv2d_backward_data(DType dtype, const Conv2dShape& shape, const void* grad_y,
                            const void* w, void* grad_x) override;
  void conv2d_backward_filter(DType dtype, const Conv2dShape& shape, const void* x,
                              const void* grad_y, void* grad_w) override;
  MaxPoolIndices max_pool2d_indices(const Pool2dGeometry& geometry) override;
  void pool2d_forward(Pool2dMode mode, DType dtype, const Pool2dGeometry& geometry, const void* x,
                      void* y, void* indices) override;
  void pool2d_backward(Pool2dMode mode, DType dtype, const Pool2dGeometry& geometry, const void* x,
                       const void* y, const void* indices, const void* grad_y,
                       void* grad_x) override;
  void batch_norm_forward_training(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                                   double factor, double eps, const void* x, const void* weight,
                                   const void* bias, void* running_mean, void* running_var, void* y,
                                   void* mean, void* invstd) override;
  void batch_norm_forward_inference(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                                    double eps, const void* x, const void* weight, const void* bias,
                                    const void* mean, const void* variance, const void* invstd,
                                    void* y) override;
  // Eval mode (training == false) runs here on the elementwise and reduction kernels, with or
  // without cuDNN; training mode is cuDNN's.
  void batch_norm_backward(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                           bool training, double eps, const void* x, const void* grad_y,
                           const void* mean, const void* invstd, const void* weight, void* grad_x,
                           void* grad_weight, void* grad_bias) override;

  // Hand-written kernels (kernels/cuda/normalization.cu, optimizer.cu).
  void layer_norm_forward(DType dtype, int64_t rows, int64_t cols, double eps, const void* x,
                          const void* weight, const void* bias, void* y, void* mean,
                          void* rstd) override;
  void layer_norm_backward(DType dtype, int64_t rows, int64_t cols, const void* x,
                           const void* grad_y, const void* mean, const void* rstd,
                           const void* weight, void* grad_x, void* grad_weight,
                           void* grad_bias) override;
  void sgd_step(DType dtype, int64_t count, const SgdSlot* slots) override;
  void adam_step(DType dtype, int64_t count, const AdamSlot* slots) override;

 protected:
  void batch_norm_backward_eval(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                                const void* x, const void* grad_y, const void* mean,
                                const void* invstd, const void* weight, void* grad_x,
                                void* grad_weight, void* grad_bias);

 private:
  void* blas_handle();  // created on first use

  const int device_;
  CudaCachingAllocator allocator_;
  DeviceCheckQueue checks_;
  std::mutex blas_mutex_;
  void* blas_ = nullptr;  // cublasHandle_t
};

// The backend of visible device `index` (a CudnnBackend in a build with cuDNN), created on first
// use and never destroyed (tensors in static objects may be freed after static destructors have
// run). Throws core::Error when the device is not visible.
CudaBackend& cuda_backend(int index);

// The pinned host allocator's bookkeeping, used by core/pinned.h.
bool pinned_contains(const void* ptr);
void pinned_record_use(const void* ptr, cudaStream_t stream);

}  // namespace mpigrad::core::cuda_detail
