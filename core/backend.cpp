// The CPU backend (forwards to kernels/cpu) and the device -> backend dispatch.
#include "mpigrad/core/backend.h"

#include <cstring>

#include "mpigrad/core/error.h"
#include "mpigrad/core/threads.h"
#include "mpigrad/kernels/cross_entropy.h"
#include "mpigrad/kernels/random.h"

namespace mpigrad::core {

namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend() { initialize_cpu_runtime(); }

  Allocator& allocator() override { return host_allocator(); }
  void copy_from_host(void* dst, const void* src, int64_t nbytes) override {
    if (nbytes > 0) std::memcpy(dst, src, size_t(nbytes));
  }
  void copy_to_host(void* dst, const void* src, int64_t nbytes) override {
    if (nbytes > 0) std::memcpy(dst, src, size_t(nbytes));
  }

  void unary(UnaryOp op, DType dtype, const StridedLoop& loop, void* out,
             const void* in) override {
    kernels::cpu::unary(op, dtype, loop, out, in);
  }
  void unary_backward(UnaryOp op, DType dtype, const StridedLoop& loop, void* grad_in,
                      const void* grad_out, const void* in, const void* out) override {
    kernels::cpu::unary_backward(op, dtype, loop, grad_in, grad_out, in, out);
  }
  void binary(BinaryOp op, DType dtype, const StridedLoop& loop, void* out, const void* a,
              const void* b) override {
    kernels::cpu::binary(op, dtype, loop, out, a, b);
  }
  void where(DType dtype, const StridedLoop& loop, void* out, const void* cond, const void* a,
             const void* b) override {
    kernels::cpu::where(dtype, loop, out, cond, a, b);
  }
  void clamp(DType dtype, const StridedLoop& loop, void* out, const void* in, double lo,
             double hi) override {
    kernels::cpu::clamp(dtype, loop, out, in, lo, hi);
  }
  void copy(DType out_dtype, DType in_dtype, const StridedLoop& loop, void* out,
            const void* in) override {
    kernels::cpu::copy(out_dtype, in_dtype, loop, out, in);
  }
  void fill(DType dtype, int64_t n, void* out, double value) override {
    kernels::cpu::fill(dtype, n, out, value);
  }
  void arange(DType dtype, int64_t n, void* out, double start, double step) override {
    kernels::cpu::arange(dtype, n, out, start, step);
  }
  void reduce(ReduceOp op, DType dtype, int64_t outer, int64_t extent, int64_t inner, void* out,
              int64_t* indices, const void* in) override {
    kernels::cpu::reduce(op, dtype, outer, extent, inner, out, indices, in);
  }
  void gemm(DType dtype, const GemmShape& shape, double alpha, const void* a, const void* b,
            double beta, void* c) override {
    kernels::cpu::gemm(dtype, shape, alpha, a, b, beta, c);
  }
  void softmax_forward(bool log, DType dtype, int64_t rows, int64_t cols, void* out,
                       const void* in) override {
    kernels::cpu::softmax_forward(log, dtype, rows, cols, out, in);
  }
  void softmax_backward(bool log, DType dtype, int64_t rows, int64_t cols, void* grad_in,
                        const void* grad_out, const void* out) override {
    kernels::cpu::softmax_backward(log, dtype, rows, cols, grad_in, grad_out, out);
  }
  int64_t index_select(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                       const int64_t* index, int64_t count, void* out, const void* in) override {
    return kernels::cpu::index_select(dtype, outer, extent, inner, index, count, out, in);
  }
  int64_t index_add(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                    const int64_t* index, int64_t count, void* out, const void* in) override {
    return kernels::cpu::index_add(dtype, outer, extent, inner, index, count, out, in);
  }
  int64_t gather(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
                 int64_t count, void* out, const void* in) override {
    return kernels::cpu::gather(dtype, outer, extent, inner, index, count, out, in);
  }
  int64_t scatter_add(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                      const int64_t* index, int64_t count, void* out, const void* in) override {
    return kernels::cpu::scatter_add(dtype, outer, extent, inner, index, count, out, in);
  }
  void uniform(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset, double lo,
               double hi) override {
    kernels::cpu::uniform(dtype, n, out, seed, offset, lo, hi);
  }
  void normal(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset, double mean,
              double std) override {
    kernels::cpu::normal(dtype, n, out, seed, offset, mean, std);
  }
  void bernoulli(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset,
                 double p) override {
    kernels::cpu::bernoulli(dtype, n, out, seed, offset, p);
  }
  void cross_entropy(DType dtype, int64_t rows, int64_t cols, const void* logits,
                     const int64_t* targets, int64_t ignore_index, double grad_scale,
                     void* losses, void* grad, const TargetCheck& check) override {
    const int64_t bad = kernels::cpu::cross_entropy(dtype, rows, cols, logits, targets,
                                                    ignore_index, grad_scale, losses, grad);
    if (bad >= 0) throw Error(bad_target_message(check, bad, targets[bad], cols));
  }
};

}  // namespace

std::string bad_target_message(const TargetCheck& check, int64_t position, int64_t value,
                               int64_t classes) {
  return detail::concat(check.op, ": label ", value, " at position ", position,
                        check.targets.empty() ? "" : " of ", check.targets,
                        " is out of range for num_classes = ", classes);
}

namespace detail {
// core/cuda/: the CUDA backend of a visible device, or the error saying why there is none (the
// no-CUDA build's version reports that CUDA support was not built).
Backend& cuda_backend_for(Device device);
}  // namespace detail

Backend& backend_for(Device device) {
  if (device.is_cpu()) {
    static CpuBackend cpu;
    return cpu;
  }
  return detail::cuda_backend_for(device);
}

}  // namespace mpigrad::core
