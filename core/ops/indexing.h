// Integer indexing with Int64 (or Int32) indices. An index out of range is a core::Error that
// names the op, the offending value and the valid range; nothing is written in that case.
#pragma once

#include "mpigrad/core/tensor.h"
#include "mpigrad/kernels/index.h"

namespace mpigrad::core {

using kernels::ScatterReduceOp;  // Mul, Max, Min

// Picks entries index[i] along dim: out has index.numel() entries there.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// out[..., i, ...] = x[..., index[..., i, ...], ...] along dim; index has x's rank.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// base + src added at the positions `index` names along dim: out[..., index[..., i, ...], ...] +=
// src[..., i, ...] (torch's scatter_add, ONNX ScatterElements with reduction add). index has
// src's shape, which matches base's outside dim; repeated indices add up. Differentiable in base
// and src, to any order (its gradient is a gather, whose gradient is this).
Tensor scatter_add(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src);
// base with src reduced into the positions `index` names along dim, laid out as scatter_add's:
// out[..., index[..., i, ...], ...] = op(out[...], src[..., i, ...]) (ONNX ScatterElements with
// reduction mul, max or min; torch's scatter_reduce with prod, amax or amin and include_self).
// Float32 and Float64, and Int32 and Int64 without gradients. A NaN update never wins a max or
// min, and a NaN in base stays. On CUDA the updates go in with atomics: max and min are exact,
// mul's float products may differ from the CPU's in the last bits.
// Gradients: max and min send each position's gradient to its winner only (to any order), base's
// own value unless an update beats it strictly, else the first of the best updates (lowest flat
// position of src), as a sequential loop picks it. Mul: base's gradient is the product of the
// position's updates (to any order), an update's is base times the others, exact with zero
// updates too and differentiable once more (exact second derivatives).
Tensor scatter_reduce(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src,
                      ScatterReduceOp op);
// base + src's slices added at the entries index[i] along dim (torch's index_add): src has
// base's shape with index.numel() entries along dim. Differentiable in base and src.
Tensor index_add(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src);
// Message passing in one pass, for graph networks: x [V, ...] and weight [E, ...] (the same
// trailing shape), int64 source and target [E]; out [num_targets, ...] with
//     out[target[e]] = sum of x[source[e]] * weight[e]
// which is index_add(zeros, 0, target, index_select(x, 0, source) * weight) without the
// [E, ...] gathered rows or products. Repeated targets add up; with no edges out is zeros.
// Float32 or Float64, x and weight of one dtype. Differentiable in x and weight to any order:
// x's gradient is this op with source and target swapped, weight's is gather_product, and
// gather_product's gradients are this op again. With `weight_index` [E], edge e reads weight
// row weight_index[e] instead of row e (edges that share a filter, such as the two directions
// of one pair of atoms).
Tensor gather_mul_scatter(const Tensor& x, const Tensor& source, const Tensor& weight,
                          const Tensor& target, int64_t num_targets,
                          const Tensor& weight_index = Tensor());
// out[e] = a[index_a[e]] * b[index_b[e]]: two gathered rows multiplied, without either gathered
// operand in memory. a [Ra, ...] and b [Rb, ...] share a trailing shape; the indices are [E].
Tensor gather_product(const Tensor& a, const Tensor& index_a, const Tensor& b,
                      const Tensor& index_b);
// Int64 tensor of shape labels.shape + [num_classes]; not differentiable.
Tensor one_hot(const Tensor& labels, int64_t num_classes);
// Rows of weight [num_embeddings, dim] for each index: shape indices.shape + [dim].
Tensor embedding(const Tensor& weight, const Tensor& indices);

}  // namespace mpigrad::core
