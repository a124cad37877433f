// The elementwise updates of the optimizers in nn/optim/, on dense buffers of n elements.
// Parameters and optimizer state are updated in place; the gradient is only read. The formulas
// are PyTorch's (torch.optim.SGD, Adam, AdamW with amsgrad=False, maximize=False).
#pragma once

#include <cstddef>
#include <cstdint>

#include "mpigrad/kernels/dtype.h"

namespace mpigrad::kernels {

struct SgdHyper {
  double lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  bool first_step = false;  // the momentum buffer is initialized to the gradient, not blended
};

struct AdamHyper {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled_weight_decay = false;  // AdamW: p *= 1 - lr*wd instead of g += wd*p
  int64_t step = 1;                     // 1-based, for the bias corrections
};

// One tensor's update in a multi-tensor step (core::Backend::sgd_step / adam_step): its dense
// buffers of `numel` elements (host memory for the CPU kernels, device memory for the CUDA ones)
// and its hyperparameters.
struct SgdSlot {
  void* param = nullptr;
  const void* grad = nullptr;
  void* momentum_buffer = nullptr;  // null when hyper.momentum == 0
  int64_t numel = 0;
  SgdHyper hyper;
  // The parameter's 16-bit copy (low_dtype: BFloat16 or Float16; dense like param), written
  // from the updated values in the same pass: autocast's cached operand (core/autocast.h), so
  // the next forward need not cast the parameter again. Null for none; float32 parameters only,
  // CPU only (core::Backend::optimizer_writes_low_copies).
  void* low_copy = nullptr;
  DType low_dtype = DType::BFloat16;
};

struct AdamSlot {
  void* param = nullptr;
  const void* grad = nullptr;
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  int64_t numel = 0;
  AdamHyper hyper;
  void* low_copy = nullptr;  // as SgdSlot's
  DType low_dtype = DType::BFloat16;
};

namespace cpu {

// Multi-tensor updates: one call steps every tensor of the list, each with its own
// hyperparameters, in one pass over its buffers and one parallel region over all elements of all
// tensors together (kernels/cpu/optimizer.cpp). All tensors share one dtype, Float32 or Float64.
// SGD: d = g + wd*p; buf = first ? d : momentum*buf + (1-dampening)*d;
// d = nesterov ? d + momentum*buf : buf (when momentum != 0); p -= lr*d. momentum_buffer may be
// null when momentum == 0.
void sgd_step_multi(DType dtype, int64_t count, const SgdSlot* slots);
// Adam: g += wd*p (L2) or p *= 1 - lr*wd (AdamW); m = beta1*m + (1-beta1)*g;
// v = beta2*v + (1-beta2)*g*g; p -= lr/(1-beta1^t) * m / (sqrt(v)/sqrt(1-beta2^t) + eps).
void adam_step_multi(DType dtype, int64_t count, const AdamSlot* slots);

}  // namespace cpu

// Fused multi-tensor updates on a CUDA device (kernels/cuda/optimizer.cu): one kernel launch
// updates every tensor of the list, each with its own hyperparameters, with the CPU formulas.
// The host list is copied to `device_slots` (device memory of at least
// sgd_slots_bytes(count) / adam_slots_bytes(count) bytes, which must stay allocated until the
// launch has run: stream-ordered scratch is fine) on `stream` (a cudaStream_t of the current
// device), so the kernel reads pointers and sizes from a device array. All tensors share one dtype,
// Float32 or Float64; their buffers are dense device memory of `numel` elements.
namespace cuda {

using kernels::AdamSlot;
using kernels::SgdSlot;

size_t sgd_slots_bytes(int64_t count);
size_t adam_slots_bytes(int64_t count);

void sgd_step_multi(DType dtype, int64_t count, const SgdSlot* slots, void* device_slots,
                    void* stream);

void adam_step_multi(DType dtype, int64_t count, const AdamSlot* slots, void* device_slots,
                     void* stream);

}  // namespace cuda
}  // namespace mpigrad::kernels
