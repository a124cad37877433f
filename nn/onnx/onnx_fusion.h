// Rewrites, before OnnxModel compiles a graph, the chains of elementwise nodes that exporters
// write for a function mpigrad has one fused op for, into that one node. Today GELU, which the
// legacy exporter writes out in its two forms:
//   tanh (transformers' NewGELUActivation, GPT-2): Mul(x, 0.5) * Add(Tanh(Mul(Add(x,
//        Mul(Pow(x, 3), 0.044715)), sqrt(2/pi))), 1)                          eight nodes
//   erf  (F.gelu, BERT): Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5)         five nodes
// each becomes an ONNX Gelu node (approximate "tanh" or "none"), which runs core::gelu: one
// vectorized kernel each way instead of eight elementwise ops and their backward nodes, each
// writing a tensor of the MLP's width (in GPT-2 124M at batch 4 x 64 tokens, Pow and Tanh alone
// took a third of the step outside GEMMs, optimizer and checkpoint). Factors may come in either
// order; the constants must be Constant nodes (as the exporter writes them: a floating initializer
// is a trainable parameter to this loader) equal to float rounding. A chain is rewritten only when
// nothing outside it reads its intermediate values and none of them is a graph output, so the
// graph computes the same function; any other graph is left as it was.
//
// Message passing (onnx_fusion_message.cpp): the sum over edges of gathered rows times a
// per-edge weight, as exporters write SchNet's and PaiNN's aggregation,
//   ScatterElements(data, Expand(column), [Slice](Gather(x, source) * w1 * ...),
//                   axis 0, reduction add)       column = Unsqueeze(target): [E, 1]
// with the rows taken by Gather on axis 0 or GatherND (the dynamo exporter, under an identity
// Transpose), becomes one mpigrad.GatherMulScatter node (onnx_ops_scatter.cpp) that runs
// core::gather_mul_scatter: no [E, F] gathered rows, products or scatter index in memory, and
// a backward of two fused passes instead of five ops. The weight factors are multiplied first,
// by Mul nodes written before it. Whether the shapes fit (1-D indices, the weight and the index
// shaped like the gathered rows, the Slice the identity) is known only at run time; when they
// do not, the node runs the chain it replaced, kept in its `chain` attribute. A Shape of the
// product (torch's index.expand_as(messages)) becomes an mpigrad.ProductShape node; a chain
// whose gathered rows or products anything else reads is left as it was, and so is
// a graph with subgraphs (If, Loop, Scan), which may read any value by name.
//
// Then the filters of a pair of atoms are computed once, as nn::SchNet does: where the weight
// of a fused node is a row-by-row function (elementwise ops with constants of at most one dim,
// Gemm or MatMul by a constant matrix) of a squared edge length
//   ReduceSum(v * v) over the dims after the first, v = positions[edge_index[r]] -
//   positions[edge_index[1 - r]] +- edge_shifts,
// those functions run on one row per pair (an mpigrad.EdgePairs node, nn::pair_reverse_edges,
// picks them: edge e and its reverse have v and -v bit for bit, so the same length), and the
// fused node reads row pair[e] for edge e. Any other reader of such a value gets the edges'
// rows back (a Gather by pair). The energy and its derivatives of every order are those of
// the graph as written (the two directions' lengths are one function of the positions).
// Internal to nn/onnx.
#pragma once

#include <onnx/onnx_pb.h>

namespace mpigrad::nn::onnx_ops {

// How many GELU chains were rewritten into Gelu nodes.
int fuse_gelu(onnx::GraphProto& graph);

// The op type of the fused message-passing node: not an ONNX op, written only by
// fuse_message_passing (a dotted name no ONNX op has).
inline constexpr char kGatherMulScatterOp[] = "mpigrad.GatherMulScatter";

// The op type of the node that pairs reverse edges (onnx_ops_scatter.cpp): inputs
// (edge_index, edge_shifts, rows), outputs first [P] and pair [E] of nn::EdgePairs; every edge
// its own pair unless edge_index is [2, E], edge_shifts [E, 3] and rows [E, 1, ...] (2 dims or
// more).
inline constexpr char kEdgePairsOp[] = "mpigrad.EdgePairs";

// The op type of the node that replaces a Shape of the fused product (torch's expand_as of the
// scatter index): inputs (x, src, weight), attributes src_tuple and Shape's start and end; the
// shape of rows(x, src) * weight, without computing them.
inline constexpr char kProductShapeOp[] = "mpigrad.ProductShape";

// How many message-passing chains were rewritten into mpigrad.GatherMulScatter nodes.
int fuse_message_passing(onnx::GraphProto& graph);

// The op type of the fused attention softmax: softmax(scale * x + mask) along the last axis,
// inputs x and an optional mask, a float attribute "scale". An mpigrad op (a dotted name no ONNX
// op has).
inline constexpr char kSoftmaxScaleMaskOp[] = "mpigrad.SoftmaxScaleMask";

// Attention's scores normalized as exporters write them, Softmax(axis -1) of
//   Add(Mul(x, c), mask)  (GPT-2: the scale, then the additive causal mask)
//   Mul(x, c)             (BERT without a mask)
// with c a one-element Constant on either side of the Mul, or Div(x, c) with c a power of two
// (1/c is then exact), the mask on either side of the Add: rewritten into one
// kSoftmaxScaleMaskOp node running core::softmax_scale_mask (one pass each way instead of three,
// and the same rounding). Only when nothing else reads the scaled or masked scores. How many
// were rewritten.
int fuse_attention_softmax(onnx::GraphProto& graph);

}  // namespace mpigrad::nn::onnx_ops
