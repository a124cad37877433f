// Integer indexing with Int64 (or Int32) indices. An index out of range is a core::Error that
// names the op, the offending value and the valid range; nothing is written in that case.
#pragma once

#include "mpigrad/core/tensor.h"

namespace mpigrad::core {

// Picks entries index[i] along dim: out has index.numel() entries there.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// out[..., i, ...] = x[..., index[..., i, ...], ...] along dim; index has x's rank.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// Int64 tensor of shape labels.shape + [num_classes]; not differentiable.
Tensor one_hot(const Tensor& labels, int64_t num_classes);
// Rows of weight [num_embeddings, dim] for each index: shape indices.shape + [dim].
Tensor embedding(const Tensor& weight, const Tensor& indices);

}  // namespace mpigrad::core
