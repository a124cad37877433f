// Internal to core/cuda: the CUDA backend of a build with cuDNN, which runs convolution, batch
// norm and pooling on cuDNN (core/cuda/cudnn_conv.cpp, cudnn_batch_norm.cpp, cudnn_pooling.cpp)
// and everything else as CudaBackend does; with cuDNN's error checking and RAII owners of its
// handle and descriptors.
//
// A .cuh because it includes cudnn.h: never installed (the install copies *.h only) and never
// included by a public header, nor by any file of a build without cuDNN (MPIGRAD_WITHOUT_CUDNN:
// the check below keeps that true even where the toolkit's include folder has cudnn.h).
// Each backend owns its device's cuDNN handle, created on first use. A handle carries a stream,
// so every call takes it through a HandleLease, which holds the backend's handle mutex, binds the
// calling thread's current stream, and releases on scope exit. The convolution plans of a device
// live in its backend too, one per (dtype, shape), used only under the lease.
#pragma once

#if defined(MPIGRAD_WITHOUT_CUDNN)
#error "cudnn_backend.cuh included in a build without cuDNN; use core/cuda/cuda_backend.cuh"
#endif

#include <cudnn.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "mpigrad/core/cuda/algorithm_plan.h"
#include "mpigrad/core/cuda/cuda_backend.cuh"
#include "mpigrad/core/dtype.h"
#include "mpigrad/core/error.h"

namespace mpigrad::core::cuda_detail {

// Every cuDNN call goes through this: a failure throws core::Error naming the call and device.
inline void check_cudnn(cudnnStatus_t status, const char* call, int device) {
  if (status != CUDNN_STATUS_SUCCESS) {
    fail("cuDNN call ", call, " failed on cuda:", device, ": ", cudnnGetErrorString(status));
  }
}

#define MPIGRAD_CUDNN_CHECK(call, device) \
  ::mpigrad::core::cuda_detail::check_cudnn((call), #call, (device))

inline cudnnDataType_t cudnn_dtype(DType dtype, const char* op) {
  if (dtype == kFloat32) return CUDNN_DATA_FLOAT;
  if (dtype == kFloat64) return CUDNN_DATA_DOUBLE;
  fail(op, ": cuDNN path supports float32 and float64, got ", dtype);
}

// ---- RAII owners --------------------------------------------------------------------------------

// Owns one cuDNN descriptor; Create/Destroy are the cuDNN pair for its type.
template <typename Handle, cudnnStatus_t (*Create)(Handle*), cudnnStatus_t (*Destroy)(Handle)>
class Descriptor {
 public:
  explicit Descriptor(int device) {
    check_cudnn(Create(&handle_), "cudnnCreate*Descriptor", device);
  }
  ~Descriptor() {
    if (handle_ != nullptr) (void)Destroy(handle_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Handle get() const { return handle_; }

 private:
  Handle handle_ = nullptr;
};

using TensorDescriptor =
    Descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDescriptor =
    Descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor =
    Descriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
               cudnnDestroyConvolutionDescriptor>;
using PoolingDescriptor = Descriptor<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor,
                                     cudnnDestroyPoolingDescriptor>;

// cuDNN's alpha/beta scaling factors: double for double data, float otherwise.
struct Scale {
  float f;
  double d;
  const void* get(DType dtype) const {
    return dtype == kFloat64 ? static_cast<const void*>(&d) : static_cast<const void*>(&f);
  }
};
inline Scale scale(double value) {
  return Scale{float(value), value};
}

// A dense NCHW descriptor.
inline void set_nchw(const TensorDescriptor& desc, DType dtype, int64_t n, int64_t c, int64_t h,
                     int64_t w, const char* op, int device) {
  MPIGRAD_CHECK(n <= INT32_MAX && c <= INT32_MAX && h <= INT32_MAX && w <= INT32_MAX, op,
                ": tensor dims exceed cuDNN's int range");
  MPIGRAD_CUDNN_CHECK(
      cudnnSetTensor4dDescriptor(desc.get(), CUDNN_TENSOR_NCHW, cudnn_dtype(dtype, op), int(n),
                                 int(c), int(h), int(w)),
      device);
}

// The descriptors of one convolution, and per direction (forward, backward data, backward
// filter) the algorithm plan built on its first call (core/cuda/cudnn_conv.cpp).
struct ConvPlan {
  TensorDescriptor x, y;
  FilterDescriptor w;
  ConvolutionDescriptor conv;
  std::array<std::unique_ptr<AlgorithmPlan>, 3> algorithms;
  ConvPlan(const Conv2dShape& shape, DType dtype, int device);
};

class CudnnBackend final : public CudaBackend {
 public:
  explicit CudnnBackend(int device) : CudaBackend(device) {}
  ~CudnnBackend() override;

  void conv2d_forward(DType dtype, const Conv2dShape& shape, const void* x, const void* w,
                      void* y) override;
  void conv2d_backward_data(DType dtype, const Conv2dShape& shape, const void* grad_y,
                            const void* w, void* grad_x) override;
  void conv2d_backward_filter(DType dtype, const Conv2dShape& shape, const void* x,
                              const void* grad_y, void* grad_w) override;
  void pool2d_forward(Pool2dMode mode, DType dtype, const Pool2dGeometry& geometry, const void* x,
                      void* y, int64_t* indices) override;
  void pool2d_backward(Pool2dMode mode, DType dtype, const Pool2dGeometry& geometry, const void* x,
                       const void* y, const int64_t* indices, const void* grad_y,
                       void* grad_x) override;
  void batch_norm_forward_training(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                                   double factor, double eps, const void* x, const void* weight,
                                   const void* bias, void* running_mean, void* running_var, void* y,
                                   void* mean, void* invstd) override;
  void batch_norm_forward_inference(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                                    double eps, const void* x, const void* weight, const void* bias,
                                    const void* mean, const void* variance, const void* invstd,
                                    void* y) override;
  void batch_norm_backward(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                           bool training, double eps, const void* x, const void* grad_y,
                           const void* mean, const void* invstd, const void* weight, void* grad_x,
                           void* grad_weight, void* grad_bias) override;

 private:
  // Exclusive use of this backend's handle, bound to the calling thread's current stream.
  // Taken inside launch(), with the device current.
  class HandleLease {
   public:
    explicit HandleLease(CudnnBackend& backend);
    cudnnHandle_t get() const { return handle_; }

   private:
    std::lock_guard<std::mutex> lock_;
    cudnnHandle_t handle_ = nullptr;
  };

  // Runs one direction of `shape` (0 forward, 1 backward data, 2 backward filter): `a` and `b`
  // are its inputs and `out` its output, in the order the cuDNN call of that direction takes
  // them.
  void conv_run(int direction, DType dtype, const Conv2dShape& shape, const void* a, const void* b,
                void* out);
  ConvPlan& conv_plan(const Conv2dShape& shape, DType dtype);  // under the lease

  std::mutex handle_mutex_;
  cudnnHandle_t handle_ = nullptr;
  std::map<std::tuple<int, std::array<int64_t, 16>>, std::unique_ptr<ConvPlan>> conv_plans_;
};

}  // namespace mpigrad::core::cuda_detail
