// Matrix products through BLAS (cuBLAS on the GPU). matmul follows torch.matmul: 1-d operands
// are promoted to a row or column and the extra dim removed afterwards, and leading (batch) dims
// broadcast. Transposed operands go to BLAS as transposes, not copies.
#pragma once

#include "mpigrad/core/tensor.h"

namespace mpigrad::core {

Tensor matmul(const Tensor& a, const Tensor& b);

}  // namespace mpigrad::core
