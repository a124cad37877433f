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
// do not, the node runs the chain it replaced, kept in its `chain` attribute. A chain whose
// gathered rows or products anything else reads (Shape included) is left as it was.
// Internal to nn/onnx.
#pragma once

#include <onnx/onnx_pb.h>

namespace mpigrad::nn::onnx_ops {

// How many GELU chains were rewritten into Gelu nodes.
int fuse_gelu(onnx::GraphProto& graph);

// The op type of the fused message-passing node: not an ONNX op, written only by
// fuse_message_passing (a dotted name no ONNX op has).
inline constexpr char kGatherMulScatterOp[] = "mpigrad.GatherMulScatter";

// How many message-passing chains were rewritten into mpigrad.GatherMulScatter nodes.
int fuse_message_passing(onnx::GraphProto& graph);

}  // namespace mpigrad::nn::onnx_ops
