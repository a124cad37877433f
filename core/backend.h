// Backend: the one place where ops, layers and optimizers choose CPU or CUDA kernels.
//
// Ops in core/ops/ and the layers and optimizers of nn/ are written once against this interface
// with raw pointers and loop descriptions; backend_for(device) returns the implementation for
// the tensor's device, and nothing above core branches on the device. The CPU backend
// (core/backend.cpp) forwards to kernels/cpu; a CUDA build adds a backend (core/cuda/) that
// forwards to kernels/cuda on the current stream, and to cuDNN for convolution, batch norm and
// pooling. Adding an op for both devices means one virtual here and its two implementations.
// Asking for a device that this build or machine lacks is a core::Error; so is asking a CUDA
// backend built without cuDNN for one of cuDNN's families.
#pragma once

#include <cstdint>
#include <string>

#include "mpigrad/core/device.h"
#include "mpigrad/core/dtype.h"
#include "mpigrad/core/storage.h"
#include "mpigrad/core/target_check.h"
#include "mpigrad/kernels/conv.h"
#include "mpigrad/kernels/elementwise.h"
#include "mpigrad/kernels/index.h"
#include "mpigrad/kernels/matmul.h"
#include "mpigrad/kernels/message_passing.h"
#include "mpigrad/kernels/optimizer.h"
#include "mpigrad/kernels/pooling.h"
#include "mpigrad/kernels/reduce.h"
#include "mpigrad/kernels/slice.h"
#include "mpigrad/kernels/softmax.h"

namespace mpigrad::kernels {
struct RadiusGraphArgs;  // kernels/neighbor_list.h
struct RadiusGraphOutput;
}  // namespace mpigrad::kernels

namespace mpigrad::core {

using kernels::AdamSlot;
using kernels::BinaryOp;
using kernels::Conv2dShape;
using kernels::GemmShape;
using kernels::Pool2dGeometry;
using kernels::ReduceOp;
using kernels::ScatterReduceOp;
using kernels::SgdSlot;
using kernels::StridedLoop;
using kernels::UnaryOp;

// The 2-d poolings of nn/functional/pooling.h. AdaptiveAvg reads only planes, height, width,
// out_h and out_w of the geometry.
enum class Pool2dMode : uint8_t { Max, AvgIncludePad, AvgExcludePad, AdaptiveAvg };

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Allocator& allocator() = 0;
  // Host <-> this device copies of nbytes; dense buffers.
  virtual void copy_from_host(void* device_dst, const void* host_src, int64_t nbytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* device_src, int64_t nbytes) = 0;

  // The contracts are those of the kernels/ headers of the same names.
  virtual void unary(UnaryOp op, DType dtype, const StridedLoop& loop, void* out,
                     const void* in) = 0;
  virtual void unary_backward(UnaryOp op, DType dtype, const StridedLoop& loop, void* grad_in,
                              const void* grad_out, const void* in, const void* out) = 0;
  virtual void binary(BinaryOp op, DType dtype, const StridedLoop& loop, void* out, const void* a,
                      const void* b) = 0;
  virtual void where(DType dtype, const StridedLoop& loop, void* out, const void* cond,
                     const void* a, const void* b) = 0;
  virtual void clamp(DType dtype, const StridedLoop& loop, void* out, const void* in, double lo,
                     double hi) = 0;
  virtual void copy(DType out_dtype, DType in_dtype, const StridedLoop& loop, void* out,
                    const void* in) = 0;
  virtual void fill(DType dtype, int64_t n, void* out, double value) = 0;
  // The gradient of a slice in one pass (kernels/slice.h): out, dense [outer, extent, inner],
  // gets grad, dense [outer, count, inner], in the window and zeros elsewhere, on a backend that
  // says so in supports_slice_backward. Where it does not, callers compose zeros and a copy into
  // the window, which gives the same bits (and need not make the gradient dense first), and this
  // is a core::Error.
  virtual bool supports_slice_backward() const { return false; }
  virtual void slice_backward(DType dtype, const kernels::SliceWindow& window, void* out,
                              const void* grad);
  virtual void arange(DType dtype, int64_t n, void* out, double start, double step) = 0;
  virtual void reduce(ReduceOp op, DType dtype, int64_t outer, int64_t extent, int64_t inner,
                      void* out, int64_t* indices, const void* in) = 0;
  virtual void gemm(DType dtype, const GemmShape& shape, double alpha, const void* a, const void* b,
                    double beta, void* c) = 0;
  // Mixed precision (core/autocast.h): A and B of `operand` (BFloat16 or Float16), C Float32,
  // fp32 accumulation. The default widens A and B to fp32 and calls gemm: correct everywhere,
  // fast nowhere; the CPU (oneDNN, AVX512-BF16) and CUDA (cuBLAS tensor cores) backends override.
  virtual void gemm_mixed(DType operand, const GemmShape& shape, double alpha, const void* a,
                          const void* b, double beta, float* c);
  // Which kernels the *_mixed calls run on for `operand`, in words, for the run's log
  // (core/autocast.h autocast_kernels); a backend that would widen says so.
  virtual std::string mixed_precision_kernels(DType operand);
  virtual void softmax_forward(bool log, DType dtype, int64_t rows, int64_t cols, void* out,
                               const void* in, const kernels::SoftmaxScaleMask& input) = 0;
  virtual void softmax_backward(bool log, DType dtype, int64_t rows, int64_t cols, void* grad_in,
                                const void* grad_out, const void* out, double scale) = 0;
  // Index kernels return the position of the first index out of range, or -1.
  virtual int64_t index_select(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                               const int64_t* index, int64_t count, void* out, const void* in) = 0;
  virtual int64_t index_add(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                            const int64_t* index, int64_t count, void* out, const void* in) = 0;
  virtual int64_t gather(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                         const int64_t* index, int64_t count, void* out, const void* in) = 0;
  virtual int64_t scatter_add(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                              const int64_t* index, int64_t count, void* out, const void* in) = 0;
  virtual int64_t scatter_reduce(ScatterReduceOp op, DType dtype, int64_t outer, int64_t extent,
                                 int64_t inner, const int64_t* index, int64_t count, void* out,
                                 const void* in) = 0;
  virtual void scatter_winner(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                              const int64_t* index, int64_t count, const void* out,
                              const void* base, const void* in, int64_t* winner) = 0;
  // out[target[e]] (+)= a[a_index[e]] * b[b_index[e]] (kernels/message_passing.h); returns
  // which * edges + e of the first index out of range, or -1.
  virtual int64_t gather_mul_scatter(DType dtype, const kernels::GatherMulScatterArgs& args) = 0;
  // The all-pairs radius graph of a batch (kernels/neighbor_list.h), every pointer on this
  // device: count returns the first atom with a coordinate that is not finite, or -1.
  virtual int64_t radius_graph_count(const kernels::RadiusGraphArgs& args, int64_t* counts) = 0;
  virtual void radius_graph_write(const kernels::RadiusGraphArgs& args,
                                  const kernels::RadiusGraphOutput& out) = 0;
  virtual void uniform(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset, double lo,
                       double hi) = 0;
  virtual void normal(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset,
                      double mean, double std) = 0;
  virtual void bernoulli(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset,
                         double p) = 0;
  // Fused log-softmax + NLL + gradient (kernels/cross_entropy.h). A target outside [0, cols)
  // that is not ignore_index is the core::Error of bad_target_message(): thrown here on the CPU;
  // on a GPU the kernel checks the targets without making the host wait, and the error is
  // raised later (core/device_checks.h).
  virtual void cross_entropy(DType dtype, int64_t rows, int64_t cols, const void* logits,
                             const int64_t* targets, int64_t ignore_index, double grad_scale,
                             void* losses, void* grad, const TargetCheck& check) = 0;

  // ---- The layers' kernel families (nn/functional, nn/optim) ----------------------------------
  // Tensors are dense, float32 or float64 (the optimizers: the dtypes their kernels take), and
  // outputs are written with `=`.

  // 2-d convolution without bias (kernels/conv.h; with one: conv2d_forward_bias below):
  // y = conv(x, w), and its two backward passes; on the CPU each pass takes the path
  // kernels::cpu::conv2d_path picks (im2col + GEMM, oneDNN, or the direct loops).
  // A batch of 0 is valid: forward and backward data write nothing, backward filter zeros.
  virtual void conv2d_forward(DType dtype, const Conv2dShape& shape, const void* x, const void* w,
                              void* y) = 0;
  virtual void conv2d_backward_data(DType dtype, const Conv2dShape& shape, const void* grad_y,
                                    const void* w, void* grad_x) = 0;
  virtual void conv2d_backward_filter(DType dtype, const Conv2dShape& shape, const void* x,
                                      const void* grad_y, void* grad_w) = 0;

  // The same three in mixed precision (core/autocast.h): x, w and grad_y of `operand` (BFloat16
  // or Float16), y, grad_x and grad_w Float32, accumulated in fp32. The default widens the 16-bit
  // operands to fp32 and calls the fp32 kernels; the CPU backend overrides it with oneDNN's bf16
  // convolutions or im2col in 16 bits and gemm_mixed (kernels/conv.h), the cuDNN one with cuDNN's
  // 16-bit convolutions (whose result is rounded to `operand` before it is widened: cuDNN writes y
  // in the dtype of x and w).
  virtual void conv2d_forward_mixed(DType operand, const Conv2dShape& shape, const void* x,
                                    const void* w, float* y);
  virtual void conv2d_backward_data_mixed(DType operand, const Conv2dShape& shape,
                                          const void* grad_y, const void* w, float* grad_x);
  virtual void conv2d_backward_filter_mixed(DType operand, const Conv2dShape& shape, const void* x,
                                            const void* grad_y, float* grad_w);

  // The convolution with its bias [out_channels] (of y's dtype, Float32 in mixed precision; null:
  // none), for a backend that can fuse the two (the CPU: kernels/conv.h): y = conv(x, w) + bias
  // written in one pass, and the filter gradient with the bias's, grad_bias[o] = grad_y's channel
  // o summed over batch and pixels. The forward defaults run conv2d_forward(_mixed) and then add
  // the bias with `binary`, the second pass over y that a fusion saves. The filter gradient's
  // returns whether it wrote grad_bias (null: not wanted): the default runs
  // conv2d_backward_filter alone and returns false, and so does the CPU where its path has no
  // fused bias gradient; the caller then sums grad_y itself.
  virtual void conv2d_forward_bias(DType dtype, const Conv2dShape& shape, const void* x,
                                   const void* w, const void* bias, void* y);
  virtual void conv2d_forward_mixed_bias(DType operand, const Conv2dShape& shape, const void* x,
                                         const void* w, const float* bias, float* y);
  virtual bool conv2d_backward_filter_bias(DType dtype, const Conv2dShape& shape, const void* x,
                                           const void* grad_y, void* grad_w, void* grad_bias);

  // 2-d pooling over [planes, H, W] (kernels/pooling.h). Max pooling records its winners in
  // `indices`, as max_pool2d_indices(geometry) says: on the CPU one window tap per output, in the
  // narrowest integer type that holds the window's taps; on CUDA none, as cuDNN finds them again
  // from x and y. Its backward reads x, y and those indices; the average poolings read neither
  // (x, y and indices may then be null).
  struct MaxPoolIndices {
    int64_t count = 0;
    DType dtype = DType::UInt8;
  };
  virtual MaxPoolIndices max_pool2d_indices(const Pool2dGeometry& geometry) = 0;
  virtual void pool2d_forward(Pool2dMode mode, DType dtype, const Pool2dGeometry& geometry,
                              const void* x, void* y, void* indices) = 0;
  virtual void pool2d_backward(Pool2dMode mode, DType dtype, const Pool2dGeometry& geometry,
                               const void* x, const void* y, const void* indices,
                               const void* grad_y, void* grad_x) = 0;

  // Batch norm over [batch, channels, inner] (kernels/normalization.h); weight and bias [channels]
  // or null (no affine transform). Training: normalizes with the batch's statistics, writes mean
  // and invstd = 1/sqrt(biased variance + eps) ([channels]), and when running_mean and
  // running_var are not null (dense, of `dtype`) blends them in place with the unbiased
  // variance: running = (1 - factor) * running + factor * batch.
  virtual void batch_norm_forward_training(DType dtype, int64_t batch, int64_t channels,
                                           int64_t inner, double factor, double eps, const void* x,
                                           const void* weight, const void* bias, void* running_mean,
                                           void* running_var, void* y, void* mean,
                                           void* invstd) = 0;
  // Eval mode, with the running statistics: `invstd` is 1/sqrt(variance + eps), given beside
  // variance and eps so each backend takes the form its library wants.
  virtual void batch_norm_forward_inference(DType dtype, int64_t batch, int64_t channels,
                                            int64_t inner, double eps, const void* x,
                                            const void* weight, const void* bias, const void* mean,
                                            const void* variance, const void* invstd, void* y) = 0;
  // `training`: mean and invstd are the forward's batch statistics (grad_x includes their
  // dependence on x); otherwise they are constants. Unwanted gradients may be null.
  virtual void batch_norm_backward(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                                   bool training, double eps, const void* x, const void* grad_y,
                                   const void* mean, const void* invstd, const void* weight,
                                   void* grad_x, void* grad_weight, void* grad_bias) = 0;
  // Training batch norm followed by ReLU in one pass, and its backward from that output y and
  // the forward's inputs (bias included): a fusion a backend offers for the dtypes it names in
  // supports_batch_norm_relu. Where it does not, callers compose batch norm and relu, and these
  // two are a core::Error. The results are bitwise the composition's (kernels/normalization.h).
  virtual bool supports_batch_norm_relu(DType /*dtype*/) const { return false; }
  virtual void batch_norm_relu_forward_training(DType dtype, int64_t batch, int64_t channels,
                                                int64_t inner, double factor, double eps,
                                                const void* x, const void* weight, const void* bias,
                                                void* running_mean, void* running_var, void* y,
                                                void* mean, void* invstd);
  virtual void batch_norm_relu_backward(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                                        const void* x, const void* y, const void* grad_y,
                                        const void* mean, const void* invstd, const void* weight,
                                        const void* bias, void* grad_x, void* grad_weight,
                                        void* grad_bias);
  // Training batch norm, ReLU and a 2x2 max pooling of stride 2 without padding in one op, and its
  // backward from the pooled gradient and the pooling's taps (max_pool2d_indices): a fusion a
  // backend offers for the dtypes and geometries it names in supports_batch_norm_relu_max_pool.
  // Where it does not, callers compose batch_norm_relu and max_pool2d, and these two are a
  // core::Error. The results are bitwise the composition's (kernels/normalization.h).
  virtual bool supports_batch_norm_relu_max_pool(DType /*dtype*/,
                                                 const Pool2dGeometry& /*pool*/) const {
    return false;
  }
  virtual void batch_norm_relu_max_pool_forward_training(
      DType dtype, const Pool2dGeometry& pool, int64_t batch, int64_t channels, double factor,
      double eps, const void* x, const void* weight, const void* bias, void* running_mean,
      void* running_var, void* out, void* taps, void* mean, void* invstd);
  virtual void batch_norm_relu_max_pool_backward(DType dtype, const Pool2dGeometry& pool,
                                                 int64_t batch, int64_t channels, const void* x,
                                                 const void* grad_out, const void* taps,
                                                 const void* mean, const void* invstd,
                                                 const void* weight, const void* bias, void* grad_x,
                                                 void* grad_weight, void* grad_bias);

  // Layer norm over the rows of [rows, cols] (kernels/normalization.h); weight and bias [cols] or
  // null; unwanted gradients null.
  virtual void layer_norm_forward(DType dtype, int64_t rows, int64_t cols, double eps,
                                  const void* x, const void* weight, const void* bias, void* y,
                                  void* mean, void* rstd) = 0;
  virtual void layer_norm_backward(DType dtype, int64_t rows, int64_t cols, const void* x,
                                   const void* grad_y, const void* mean, const void* rstd,
                                   const void* weight, void* grad_x, void* grad_weight,
                                   void* grad_bias) = 0;

  // The optimizers' in-place updates (kernels/optimizer.h) of `count` tensors of one dtype, each
  // with its own hyperparameters: a loop on the CPU, one fused launch on CUDA.
  virtual void sgd_step(DType dtype, int64_t count, const SgdSlot* slots) = 0;
  virtual void adam_step(DType dtype, int64_t count, const AdamSlot* slots) = 0;
  // Whether those steps write a slot's low_copy (the parameter's 16-bit autocast copy, rewritten
  // from the updated values). Where not, the optimizers leave it null and autocast casts anew.
  virtual bool optimizer_writes_low_copies() const { return false; }
};

// The backend for `device`, or core::Error when this build or machine cannot serve it.
Backend& backend_for(Device device);

}  // namespace mpigrad::core
