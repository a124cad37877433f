// Numerically stable along one axis (the row maximum is subtracted before exp).
#pragma once

#include "mpigrad/core/tensor.h"

namespace mpigrad::core {

Tensor softmax(const Tensor& x, int64_t dim = -1);
Tensor log_softmax(const Tensor& x, int64_t dim = -1);

}  // namespace mpigrad::core
