// The CUDA backend: core::Backend on one device, forwarding to kernels/cuda on the current
// stream (see cuda_backend.cuh).
#include "mpigrad/core/cuda/cuda_backend.cuh"

#include <cublas_v2.h>

#include <initializer_list>
#include <stdexcept>
#include <string>

#include "mpigrad/core/cuda/cuda_check.cuh"
#include "mpigrad/core/stream.h"
#include "mpigrad/kernels/cross_entropy.h"
#include "mpigrad/kernels/neighbor_list.h"
#include "mpigrad/kernels/normalization.h"
#include "mpigrad/kernels/random.h"

namespace mpigrad::core::cuda_detail {

namespace {

void check_cublas(cublasStatus_t status, const char* call, int device) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    fail("cuBLAS call ", call, " failed on cuda:", device, ": ", cublasGetStatusName(status), " (",
         cublasGetStatusString(status), ")");
  }
}

[[noreturn]] void no_cudnn(const char* op) {
  fail(op, ": this libmpigrad was built without cuDNN, which CUDA tensors need here");
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

void CudaBackend::clamp(DType dtype, const StridedLoop& loop, void* out, const void* in, double lo,
                        double hi) {
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

void CudaBackend::gemm_mixed(DType operand, const GemmShape& shape, double alpha, const void* a,
                             const void* b, double beta, float* c) {
  launch(device_, [&] {
    std::lock_guard<std::mutex> lock(blas_mutex_);
    kernels::cuda::gemm_mixed(operand, shape, alpha, a, b, beta, c, blas_handle(), stream());
  });
}

std::string CudaBackend::mixed_precision_kernels(DType operand) {
  return std::string("cuBLAS with ") + dtype_name(operand) +
         " operands and fp32 compute on the tensor cores";
}

void CudaBackend::softmax_forward(bool log, DType dtype, int64_t rows, int64_t cols, void* out,
                                  const void* in, const kernels::SoftmaxScaleMask& input) {
  launch(device_,
         [&] { kernels::cuda::softmax_forward(log, dtype, rows, cols, out, in, input, stream()); });
}

void CudaBackend::softmax_backward(bool log, DType dtype, int64_t rows, int64_t cols, void* grad_in,
                                   const void* grad_out, const void* out, double scale) {
  launch(device_, [&] {
    kernels::cuda::softmax_backward(log, dtype, rows, cols, grad_in, grad_out, out, scale,
                                    stream());
  });
}

int64_t CudaBackend::index_select(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                                  const int64_t* index, int64_t count, void* out, const void* in) {
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
    return kernels::cuda::index_add(dtype, outer, extent, inner, index, count, out, in, flag.get(),
                                    stream());
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
                                 const int64_t* index, int64_t count, void* out, const void* in) {
  return launch(device_, [&] {
    Scratch flag(allocator_, kernels::cuda::kIndexCheckBytes);
    return kernels::cuda::scatter_add(dtype, outer, extent, inner, index, count, out, in,
                                      flag.get(), stream());
  });
}

int64_t CudaBackend::gather_mul_scatter(DType dtype, const kernels::GatherMulScatterArgs& args) {
  return launch(device_, [&] {
    Scratch flag(allocator_, kernels::cuda::kMessagePassingCheckBytes);
    return kernels::cuda::gather_mul_scatter(dtype, args, flag.get(), stream());
  });
}

int64_t CudaBackend::scatter_reduce(ScatterReduceOp op, DType dtype, int64_t outer, int64_t extent,
                                    int64_t inner, const int64_t* index, int64_t count, void* out,
                                    const void* in) {
  return launch(device_, [&] {
    Scratch flag(allocator_, kernels::cuda::kIndexCheckBytes);
    return kernels::cuda::scatter_reduce(op, dtype, outer, extent, inner, index, count, out, in,
                                         flag.get(), stream());
  });
}

void CudaBackend::scatter_winner(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                                 const int64_t* index, int64_t count, const void* out,
                                 const void* base, const void* in, int64_t* winner) {
  launch(device_, [&] {
    kernels::cuda::scatter_winner(dtype, outer, extent, inner, index, count, out, base, in, winner,
                                  stream());
  });
}

int64_t CudaBackend::radius_graph_count(const kernels::RadiusGraphArgs& args, int64_t* counts) {
  return launch(device_, [&] {
    Scratch flag(allocator_, kernels::cuda::kNeighborCheckBytes);
    return kernels::cuda::radius_graph_count(args, counts, flag.get(), stream());
  });
}

void CudaBackend::radius_graph_write(const kernels::RadiusGraphArgs& args,
                                     const kernels::RadiusGraphOutput& out) {
  launch(device_, [&] { kernels::cuda::radius_graph_write(args, out, stream()); });
}

void CudaBackend::uniform(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset,
                          double lo, double hi) {
  launch(device_, [&] { kernels::cuda::uniform(dtype, n, out, seed, offset, lo, hi, stream()); });
}

void CudaBackend::normal(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset,
                         double mean, double std) {
  launch(device_, [&] { kernels::cuda::normal(dtype, n, out, seed, offset, mean, std, stream()); });
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
    checks_.push(s, code.get(), kernels::cuda::kNoBadTarget, [check, cols, device](uint64_t bad) {
      return bad_target_message(check, kernels::cuda::bad_target_row(bad),
                                kernels::cuda::bad_target_value(bad), cols) +
             " (checked on cuda:" + std::to_string(device) +
             " without waiting, and reported at a later synchronization: the "
             "steps queued in between got NaN for that row)";
    });
  });
}

// ---- Without cuDNN ----------------------------------------------------------------------------

void CudaBackend::conv2d_forward(DType, const Conv2dShape&, const void*, const void*, void*) {
  no_cudnn("conv2d");
}
void CudaBackend::conv2d_backward_data(DType, const Conv2dShape&, const void*, const void*, void*) {
  no_cudnn("conv2d backward");
}
void CudaBackend::conv2d_backward_filter(DType, const Conv2dShape&, const void*, const void*,
                                         void*) {
  no_cudnn("conv2d backward");
}
Backend::MaxPoolIndices CudaBackend::max_pool2d_indices(const Pool2dGeometry&) {
  return {};
}
void CudaBackend::pool2d_forward(Pool2dMode, DType, const Pool2dGeometry&, const void*, void*,
                                 void*) {
  no_cudnn("pool2d");
}
void CudaBackend::pool2d_backward(Pool2dMode, DType, const Pool2dGeometry&, const void*,
                                  const void*, const void*, const void*, void*) {
  no_cudnn("pool2d backward");
}
void CudaBackend::batch_norm_forward_training(DType, int64_t, int64_t, int64_t, double, double,
                                              const void*, const void*, const void*, void*, void*,
                                              void*, void*, void*) {
  no_cudnn("batch_norm");
}
void CudaBackend::batch_norm_forward_inference(DType, int64_t, int64_t, int64_t, double,
                                               const void*, const void*, const void*, const void*,
                                               const void*, const void*, void*) {
  no_cudnn("batch_norm");
}
void CudaBackend::batch_norm_backward(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                                      bool training, double, const void* x, const void* grad_y,
                                      const void* mean, const void* invstd, const void* weight,
                                      void* grad_x, void* grad_weight, void* grad_bias) {
  if (training) no_cudnn("batch_norm backward");
  batch_norm_backward_eval(dtype, batch, channels, inner, x, grad_y, mean, invstd, weight, grad_x,
                           grad_weight, grad_bias);
}

// ---- Batch norm backward in eval mode ----------------------------------------------------------
// mean and invstd are constants: grad_x = g * weight[c] * invstd[c], grad_weight[c] =
// sum(g * (x - mean[c]) * invstd[c]) and grad_bias[c] = sum(g) over batch and inner, each sum
// reduced over inner and then over the batch.

namespace {

// A loop over [batch, channels, inner] whose operands are dense [batch, channels, inner] data
// (dense == true) or a per-channel vector (false), operand 0 (the output) first.
StridedLoop channel_loop(int64_t batch, int64_t channels, int64_t inner,
                         std::initializer_list<bool> dense) {
  StridedLoop loop;
  loop.ndim = 3;
  loop.size[0] = batch;
  loop.size[1] = channels;
  loop.size[2] = inner;
  int op = 0;
  for (bool is_dense : dense) {
    loop.stride[op][0] = is_dense ? channels * inner : 0;
    loop.stride[op][1] = is_dense ? inner : 1;
    loop.stride[op][2] = is_dense ? 1 : 0;
    ++op;
  }
  return loop;
}

StridedLoop flat_loop(int64_t n, int operands) {
  StridedLoop loop;
  loop.ndim = 1;
  loop.size[0] = n;
  for (int op = 0; op < operands; ++op) loop.stride[op][0] = 1;
  return loop;
}

}  // namespace

void CudaBackend::batch_norm_backward_eval(DType dtype, int64_t batch, int64_t channels,
                                           int64_t inner, const void* x, const void* grad_y,
                                           const void* mean, const void* invstd, const void* weight,
                                           void* grad_x, void* grad_weight, void* grad_bias) {
  const int64_t numel = batch * channels * inner;
  const size_t element = size_t(element_size(dtype));
  // Sums a dense [batch, channels, inner] buffer to [channels] through `partial`.
  auto channel_sum = [&](const void* data, void* partial, void* out) {
    reduce(ReduceOp::Sum, dtype, batch * channels, inner, 1, partial, nullptr, data);
    reduce(ReduceOp::Sum, dtype, 1, batch, channels, out, nullptr, partial);
  };
  if (grad_x != nullptr && numel > 0) {
    const void* factor = invstd;
    Scratch scaled(allocator_, weight != nullptr ? size_t(channels) * element : 0);
    if (weight != nullptr) {
      binary(BinaryOp::Mul, dtype, flat_loop(channels, 3), scaled.get(), invstd, weight);
      factor = scaled.get();
    }
    binary(BinaryOp::Mul, dtype, channel_loop(batch, channels, inner, {true, true, false}), grad_x,
           grad_y, factor);
  }
  if (grad_weight == nullptr && grad_bias == nullptr) return;
  Scratch partial(allocator_, size_t(batch * channels) * element);
  if (grad_bias != nullptr) channel_sum(grad_y, partial.get(), grad_bias);
  if (grad_weight == nullptr) return;
  Scratch product(allocator_, size_t(numel) * element);
  if (numel > 0) {
    const StridedLoop with_channel = channel_loop(batch, channels, inner, {true, true, false});
    binary(BinaryOp::Sub, dtype, with_channel, product.get(), x, mean);
    binary(BinaryOp::Mul, dtype, with_channel, product.get(), product.get(), invstd);
    binary(BinaryOp::Mul, dtype, flat_loop(numel, 3), product.get(), product.get(), grad_y);
  }
  channel_sum(product.get(), partial.get(), grad_weight);
}

// ---- Layer norm and the optimizers --------------------------------------------------------------

void CudaBackend::layer_norm_forward(DType dtype, int64_t rows, int64_t cols, double eps,
                                     const void* x, const void* weight, const void* bias, void* y,
                                     void* mean, void* rstd) {
  launch(device_, [&] {
    kernels::cuda::layer_norm_forward(dtype, rows, cols, eps, x, weight, bias, y, mean, rstd,
                                      stream());
  });
}

void CudaBackend::layer_norm_backward(DType dtype, int64_t rows, int64_t cols, const void* x,
                                      const void* grad_y, const void* mean, const void* rstd,
                                      const void* weight, void* grad_x, void* grad_weight,
                                      void* grad_bias) {
  launch(device_, [&] {
    kernels::cuda::layer_norm_backward(dtype, rows, cols, x, grad_y, mean, rstd, weight, grad_x,
                                       grad_weight, grad_bias, stream());
  });
}

// The slot array goes to stream-ordered scratch: freed after the call, reused only by work
// queued after the kernel on the same stream.
void CudaBackend::sgd_step(DType dtype, int64_t count, const SgdSlot* slots) {
  if (count == 0) return;
  launch(device_, [&] {
    Scratch device_slots(allocator_, kernels::cuda::sgd_slots_bytes(count));
    kernels::cuda::sgd_step_multi(dtype, count, slots, device_slots.get(), stream());
  });
}

void CudaBackend::adam_step(DType dtype, int64_t count, const AdamSlot* slots) {
  if (count == 0) return;
  launch(device_, [&] {
    Scratch device_slots(allocator_, kernels::cuda::adam_slots_bytes(count));
    kernels::cuda::adam_step_multi(dtype, count, slots, device_slots.get(), stream());
  });
}

}  // namespace mpigrad::core::cuda_detail
