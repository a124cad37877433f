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
#include <string>
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
inline void set_nchw(const TensorDescriptor& desc, cudnnDataType_t type, int64_t n, int64_t c,
                     int64_t h, int64_t w, const char* op, int device) {
  MPIGRAD_CHECK(n <= INT32_MAX && c <= INT32_MAX && h <= INT32_MAX && w <= INT32_MAX, op,
                ": tensor dims exceed cuDNN's int range");
  MPIGRAD_CUDNN_CHECK(cudnnSetTensor4dDescriptor(desc.get(), CUDNN_TENSOR_NCHW, type, int(n),
                                                 int(c), int(h), int(w)),
                      device);
}
inline void set_nchw(const TensorDescriptor& desc, DType dtype, int64_t n, int64_t c, int64_t h,
                     int64_t w, const char* op, int device) {
  set_nchw(desc, cudnn_dtype(dtype, op), n, c, h, w, op, device);
}

// The descriptors of one convolution, and per direction (forward, backward data, backward
// filter) the algorithm plan built on its first call (core/cuda/cudnn_conv.cpp). A BFloat16 or
// Float16 plan is autocast's: 16-bit x, w and y, computed in float32.
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
  // Autocast's convolutions on cuDNN's 16-bit configurations (PSEUDO_BFLOAT16, PSEUDO_HALF:
  // fp32 compute, tensor-op math), then the 16-bit result widened into the fp32 output. Where
  // cuDNN can run no algorithm for a shape, that shape takes the base class's widening path and
  // the job's log says so once per dtype.
  void conv2d_forward_mixed(DType operand, const Conv2dShape& shape, const void* x, const void* w,
                            float* y) override;
  void conv2d_backward_data_mixed(DType operand, const Conv2dShape& shape, const void* grad_y,
                                  const void* w, float* grad_x) override;
  void conv2d_backward_filter_mixed(DType operand, const Conv2dShape& shape, const void* x,
                                    const void* grad_y, float* grad_w) override;
  // cuBLAS's part, and whether a small probe convolution in `operand` ran on cuDNN (once per
  // dtype) or anything so far fell back to widening.
  std::string mixed_precision_kernels(DType operand) override;
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
  // them. Returns "" once an algorithm ran. When none can, throws, or with `may_fail` returns
  // why (the plan remembers, so later calls of that shape return at once).
  std::string conv_run(int direction, DType dtype, const Conv2dShape& shape, const void* a,
                       const void* b, void* out, bool may_fail = false);
  // The same in 16 bits into a scratch y, widened into `out` (`out_count` floats); false, after
  // the once-per-dtype warning, when cuDNN could not run it and the caller should widen instead.
  bool conv_run_mixed(int direction, DType operand, const Conv2dShape& shape, const void* a,
                      const void* b, float* out, int64_t out_count);
  ConvPlan& conv_plan(const Conv2dShape& shape, DType dtype);  // under the lease

  std::mutex handle_mutex_;
  cudnnHandle_t handle_ = nullptr;
  std::map<std::tuple<int, std::array<int64_t, 16>>, std::unique_ptr<ConvPlan>> conv_plans_;
  // Per 16-bit dtype: the probe's verdict (`error` "" when cuDNN ran all three directions, and
  // how many of those took a tensor-op math type) and the first reason any shape was widened;
  // under mixed_mutex_, which may be held while taking the handle's, never the reverse.
  struct MixedProbe {
    std::string error;
    int64_t tensor_op_calls = 0;
  };
  std::mutex mixed_mutex_;
  std::map<DType, MixedProbe> mixed_probes_;
  std::map<DType, std::string> mixed_widened_;
};

}  // namespace mpigrad::core::cuda_detail
