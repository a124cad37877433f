// Numerically stable along one axis (the row maximum is subtracted before exp).
#pragma once

#include "mpigrad/core/tensor.h"

namespace mpigrad::core {

Tensor softmax(const Tensor& x, int64_t dim = -1);
Tensor log_softmax(const Tensor& x, int64_t dim = -1);

// softmax(scale * x + mask) along the last dim, as attention normalizes its scores: one pass
// forward and one backward instead of a mul, an add and a softmax (and their three nodes), with
// the rounding of those separate ops. `mask` (undefined: none) broadcasts against x. It is fused
// when it is of x's dtype, needs no gradient, spans x's last dim, and its broadcast dims form one
// run: a [T, T] causal mask, [B, 1, T, T], or a [B, 1, 1, T] padding mask over [B, H, T, T]
// scores. Any other mask goes through the separate ops, with the same result.
Tensor softmax_scale_mask(const Tensor& x, double scale, const Tensor& mask);

}  // namespace mpigrad::core
