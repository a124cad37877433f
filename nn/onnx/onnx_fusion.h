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
// Internal to nn/onnx.
#pragma once

#include <onnx/onnx_pb.h>

namespace mpigrad::nn::onnx_ops {

// How many GELU chains were rewritten into Gelu nodes.
int fuse_gelu(onnx::GraphProto& graph);

// The op type of the fused attention softmax: softmax(scale * x + mask) along the last axis,
// inputs x and an optional mask, a float attribute "scale". An mpigrad op, not an ONNX one.
inline constexpr const char* kSoftmaxScaleMaskOp = "MpigradSoftmaxScaleMask";

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
