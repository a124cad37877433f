// defines: sgd_step, adam_step (one parameter tensor's update, in place)
//
// The elementwise updates of the optimizers in nn/optim/, on dense buffers of n elements.
// Parameters and optimizer state are updated in place; the gradient is only read. The formulas
// are PyTorch's (torch.optim.SGD, Adam, AdamW with amsgrad=False, maximize=False).
#pragma once

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

namespace cpu {

// d = g + wd*p; buf = first ? d : momentum*buf + (1-dampening)*d;
// d = nesterov ? d + momentum*buf : buf (when momentum != 0); p -= lr*d.
// momentum_buffer may be null when momentum == 0.
void sgd_step(DType dtype, int64_t n, const SgdHyper& hyper, void* param, const void* grad,
              void* momentum_buffer);

void adam_step(DType dtype, int64_t n, const AdamHyper& hyper, void* param, const void* grad,
               void* exp_avg, void* exp_avg_sq);

}  // namespace cpu
}  // namespace mpigrad::kernels
