// Reductions over one or more axes (negative axes count from the end), with keepdim. An empty
// axis list means every axis. Sums of integer or Bool tensors are Int64.
#pragma once

#include <vector>

#include "mpigrad/core/tensor.h"

namespace mpigrad::core {

Tensor sum(const Tensor& x);
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
// Variance with Bessel's `correction` (1: unbiased, like torch.var's default; 0: population).
Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction = 1,
           bool keepdim = false);

struct ValuesIndices {
  Tensor values;
  Tensor indices;  // Int64 positions along the reduced dim
};
// The maximum along `dim`; the gradient flows to the first maximal element.
ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim = false);
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& x);  // over every element
Tensor min(const Tensor& x);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);

}  // namespace mpigrad::core
