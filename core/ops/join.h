// Joining tensors along an axis. Every input must have the same dtype and device, and the same
// extents on every other axis; the gradient is sliced back to each input.
#pragma once

#include <vector>

#include "mpigrad/core/tensor.h"

namespace mpigrad::core {

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);

}  // namespace mpigrad::core
