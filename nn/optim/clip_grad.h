// torch.nn.utils.clip_grad_norm_: scales every gradient by max_norm / (total_norm + 1e-6) when
// that is below 1, where total_norm is the norm of all gradients taken together (one global
// vector). Returns total_norm. Under DDP call it after the all-reduce, so every rank clips
// identically.
#pragma once

#include <limits>
#include <vector>

#include "mpigrad/core/tensor.h"

namespace mpigrad::nn {

// norm_type: 2.0, 1.0, any p > 0, or infinity (the largest absolute value). Parameters without
// a gradient are skipped. error_if_nonfinite: a NaN/inf total norm is a core::Error instead of
// being returned (and the gradients are left alone).
double clip_grad_norm_(const std::vector<core::Tensor>& parameters, double max_norm,
                       double norm_type = 2.0, bool error_if_nonfinite = false);

}  // namespace mpigrad::nn
