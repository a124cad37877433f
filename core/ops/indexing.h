// Integer indexing with Int64 (or Int32) indices. An index out of range is a core::Error that
// names the op, the offending value and the valid range; nothing is written in that case.
#pragma once

#include "mpigrad/core/tensor.h"

namespace mpigrad::core {

// Picks entries index[i] along dim: out has index.numel() entries there.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// out[..., i, ...] = x[..., index[..., i, ...], ...] along dim; index has x's rank.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// base + src added at the positions `index` names along dim: out[..., index[..., i, ...], ...] +=
// src[..., i, ...] (torch's scatter_add, ONNX ScatterElements with reduction add). index has
// src's shape, which matches base's outside dim; repeated indices add up. Differentiable in base
// and src, to any order (its gradient is a gather, whose gradient is this).
Tensor scatter_add(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src);
// base + src's slices added at the entries index[i] along dim (torch's index_add): src has
// base's shape with index.numel() entries along dim. Differentiable in base and src.
Tensor index_add(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src);
// Int64 tensor of shape labels.shape + [num_classes]; not differentiable.
Tensor one_hot(const Tensor& labels, int64_t num_classes);
// Rows of weight [num_embeddings, dim] for each index: shape indices.shape + [dim].
Tensor embedding(const Tensor& weight, const Tensor& indices);

}  // namespace mpigrad::core
