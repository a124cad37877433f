// Backend: the one place where ops choose CPU or CUDA kernels.
//
// Ops in core/ops/ are written once against this interface with raw pointers and loop
// descriptions; backend_for(device) returns the implementation for the tensor's device. The CPU
// backend forwards to kernels/cpu; a CUDA build adds a backend that forwards to kernels/cuda on
// the current stream. Asking for a device that this build or machine lacks is a core::Error.
#pragma once

#include <cstdint>
#include <string>

#include "mpigrad/core/device.h"
#include "mpigrad/core/dtype.h"
#include "mpigrad/core/storage.h"
#include "mpigrad/kernels/elementwise.h"
#include "mpigrad/kernels/index.h"
#include "mpigrad/kernels/matmul.h"
#include "mpigrad/kernels/reduce.h"
#include "mpigrad/kernels/softmax.h"

namespace mpigrad::core {

using kernels::BinaryOp;
using kernels::GemmShape;
using kernels::ReduceOp;
using kernels::StridedLoop;
using kernels::UnaryOp;

// Names the targets of a loss in its error for a bad target.
struct TargetCheck {
  std::string op = "cross_entropy";
  std::string targets;  // what they are, e.g. "label field 'y'"; "" when unknown
};

// "<op>: label <value> at position <position>[ of <targets>] is out of range for num_classes =
// <classes>".
std::string bad_target_message(const TargetCheck& check, int64_t position, int64_t value,
                               int64_t classes);

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
  virtual void binary(BinaryOp op, DType dtype, const StridedLoop& loop, void* out,
                      const void* a, const void* b) = 0;
  virtual void where(DType dtype, const StridedLoop& loop, void* out, const void* cond,
                     const void* a, const void* b) = 0;
  virtual void clamp(DType dtype, const StridedLoop& loop, void* out, const void* in, double lo,
                     double hi) = 0;
  virtual void copy(DType out_dtype, DType in_dtype, const StridedLoop& loop, void* out,
                    const void* in) = 0;
  virtual void fill(DType dtype, int64_t n, void* out, double value) = 0;
  virtual void arange(DType dtype, int64_t n, void* out, double start, double step) = 0;
  virtual void reduce(ReduceOp op, DType dtype, int64_t outer, int64_t extent, int64_t inner,
                      void* out, int64_t* indices, const void* in) = 0;
  virtual void gemm(DType dtype, const GemmShape& shape, double alpha, const void* a,
                    const void* b, double beta, void* c) = 0;
  virtual void softmax_forward(bool log, DType dtype, int64_t rows, int64_t cols, void* out,
                               const void* in) = 0;
  virtual void softmax_backward(bool log, DType dtype, int64_t rows, int64_t cols, void* grad_in,
                                const void* grad_out, const void* out) = 0;
  // Index kernels return the position of the first index out of range, or -1.
  virtual int64_t index_select(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                               const int64_t* index, int64_t count, void* out,
                               const void* in) = 0;
  virtual int64_t index_add(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                            const int64_t* index, int64_t count, void* out, const void* in) = 0;
  virtual int64_t gather(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                         const int64_t* index, int64_t count, void* out, const void* in) = 0;
  virtual int64_t scatter_add(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                              const int64_t* index, int64_t count, void* out,
                              const void* in) = 0;
  virtual void uniform(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset,
                       double lo, double hi) = 0;
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
};

// The backend for `device`, or core::Error when this build or machine cannot serve it.
Backend& backend_for(Device device);

}  // namespace mpigrad::core
