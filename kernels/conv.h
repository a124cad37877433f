// The CPU's 2-d convolution has four paths, chosen per shape and pass (conv2d_path):
//  * GEMM: one matrix product per image. im2col unrolls every receptive field of an image
//    [channels, height, width] into a column of a dense [channels*kh*kw, out_h*out_w] buffer, so
//    out = weight[out_channels, channels*kh*kw] x columns. col2im is its adjoint and scatters
//    column gradients back onto the image. Both work on one image; the CPU backend
//    (core/backend.cpp) loops over the batch and over groups (a group's channels are a
//    contiguous block of rows).
//  * oneDNN (kernels/cpu/conv_dnnl.cpp): its direct convolutions, which reorder the plain NCHW
//    tensors to its blocked layouts inside each call.
//  * Direct depthwise (groups == channels; kernels/cpu/conv.cpp): plain loops over the taps and
//    pixels inside the image, on NCHW as it is.
//  * Direct stems (groups 1, 1 to 4 input channels; kernels/cpu/conv_small.cpp): vector loops over
//    output columns and channels on NCHW as it is, forward and filter gradient.
// A bias [out_channels], of the output's dtype, rides along where a path can take it. Every
// forward writes y = conv(x, w) + bias without a second pass over y: the direct loops add it to
// each value after its taps (bitwise the separate add), the GEMM path starts each product from it
// (beta = 1) and oneDNN adds it inside its kernel (both may round differently from the separate
// add, within float32 rounding). oneDNN's filter gradient, and the direct stems', also write the
// bias's gradient (grad_y summed over batch and pixels) from the same pass over grad_y; the GEMM
// path and the depthwise loops leave that sum to the caller.
#pragma once

#include <cstdint>
#include <string>

#include "mpigrad/kernels/dtype.h"

namespace mpigrad::kernels {

struct Conv2dGeometry {
  int64_t channels = 0, height = 0, width = 0;  // of the image im2col reads / col2im writes
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t stride_h = 1, stride_w = 1;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t out_h = 0, out_w = 0;  // (height + 2*pad - dilation*(kernel-1) - 1) / stride + 1
};

// One whole convolution as the backends run it (core/backend.h): x [batch, channels, H, W],
// w [out_channels, channels/groups, kh, kw], y [batch, out_channels, out_h, out_w].
struct Conv2dShape {
  Conv2dGeometry geometry;  // of one whole image (all input channels)
  int64_t batch = 0, out_channels = 0, groups = 1;
};

namespace cpu {

// columns[c*kh*kw + i*kw + j, oy*out_w + ox] = image[c, oy*stride-pad+i*dil, ox*stride-pad+j*dil]
// or 0 outside the image. Writes every element of columns with `=`. Float32 and Float64, and
// BFloat16 and Float16 for mixed precision (a copy, no arithmetic).
void im2col(DType dtype, const Conv2dGeometry& geometry, const void* image, void* columns);

// The adjoint of im2col: image += scatter(columns). Adds with `+=` (zero the image first).
void col2im(DType dtype, const Conv2dGeometry& geometry, const void* columns, void* image);

// y[n, o, i] = bias[o] for y [batch, channels, area], Float32 or Float64: the GEMM path starts
// each image's product from its bias (beta = 1), which costs BLAS no more than the zeros it
// writes before a product with beta = 0.
void fill_channel_bias(DType dtype, int64_t batch, int64_t channels, int64_t area, const void* bias,
                       void* y);

// ---- The other paths and the choice between them ------------------------------------------------

enum class ConvPass : uint8_t { Forward, BackwardData, BackwardFilter };

// Rule: the measured per-family choice (conv2d_path). The others force a path: Gemm (im2col +
// GEMM), OneDnn, Direct (where has_direct_conv2d; others then take Gemm).
enum class ConvPath : uint8_t { Rule, Gemm, OneDnn, Direct };

// The path `pass` of `shape` takes with operands of `operand` (Float32 or Float64, or
// BFloat16/Float16 in mixed precision): Gemm, OneDnn or Direct, never Rule. The rule is a fixed
// function of the shape and of which kernel oneDNN has for it on this CPU (the figures behind it:
// docs/benchmarks.md, "Convolution paths"), never a timing, so runs are reproducible; the override
// (set_conv2d_path_override), else MPIGRAD_CPU_CONV=gemm|dnnl|direct read once, forces a path where
// the dtype and shape allow it. oneDNN takes Float32, and BFloat16 on a CPU with AVX512-BF16;
// Direct takes what has_direct_conv2d says; Gemm takes everything.
ConvPath conv2d_path(ConvPass pass, DType operand, const Conv2dShape& shape);

// Sets the path every convolution takes from now on (Rule: back to the rule) and returns the
// previous setting, for tests and benchmarks that run one case through both paths.
ConvPath set_conv2d_path_override(ConvPath path);

// Runs `pass` on oneDNN: Forward (x, w) -> y, BackwardData (grad_y, w) -> grad_x,
// BackwardFilter (x, grad_y) -> grad_w, dense NCHW / [out, in/groups, kh, kw] tensors, outputs
// written with `=`. Inputs of `operand` (Float32, or BFloat16 with a Float32 output: mixed
// precision), output of `out_dtype`. Forward adds `bias` where it is not null; BackwardFilter
// also writes `grad_bias` where it is not null (both [out_channels] of `out_dtype`; the other
// passes ignore them). Returns false, having written nothing, when oneDNN has only its reference
// kernel for the case, so the caller runs the GEMM path instead. Primitives are built once per
// shape, pass, bias or none and thread count and kept per thread.
bool conv2d_onednn(ConvPass pass, DType operand, DType out_dtype, const Conv2dShape& shape,
                   const void* first, const void* second, void* out, const void* bias = nullptr,
                   void* grad_bias = nullptr);

// groups == channels (any multiplier out_channels / groups), the shapes depthwise_conv2d takes.
bool is_depthwise(const Conv2dShape& shape);

// Runs `pass` of a depthwise shape directly, with the operands and outputs of conv2d_onednn, all
// of `dtype` (Float32 or Float64). Outputs written with `=`. Forward adds `bias` where it is not
// null ([out_channels]; the backward passes ignore it).
void depthwise_conv2d(ConvPass pass, DType dtype, const Conv2dShape& shape, const void* first,
                      const void* second, void* out, const void* bias = nullptr);

// The stems the direct small-channel kernels are for: groups 1 and 1 to kSmallChannels input
// channels.
constexpr int64_t kSmallChannels = 4;
bool is_small_channel(const Conv2dShape& shape);

// Whether small_channel_conv2d runs `pass` of `shape` in `dtype`: Float32 forward and filter
// gradient of is_small_channel shapes, on a CPU with AVX2 and FMA.
bool has_small_channel_conv2d(ConvPass pass, DType dtype, const Conv2dShape& shape);

// Runs `pass` of a small-channel shape directly, with the operands and outputs of
// conv2d_onednn, all Float32. Outputs written with `=`; Forward adds `bias` where it is not null
// (depthwise_conv2d); BackwardFilter also writes the bias's gradient, grad_y summed over the
// batch and the pixels ([out_channels]), where `grad_bias` is not null. Throws where
// has_small_channel_conv2d is false.
void small_channel_conv2d(ConvPass pass, DType dtype, const Conv2dShape& shape, const void* first,
                          const void* second, void* out, const void* bias = nullptr,
                          void* grad_bias = nullptr);

// Whether the Direct path can run `pass` of `shape` in `dtype`: depthwise shapes in Float32 and
// Float64, and the small-channel ones above.
bool has_direct_conv2d(ConvPass pass, DType dtype, const Conv2dShape& shape);

// Runs `pass` on the Direct path (depthwise_conv2d or small_channel_conv2d, forward bias
// included), where has_direct_conv2d; throws elsewhere. Returns whether it wrote `grad_bias`
// (the small-channel filter gradient does; the depthwise loops leave it to the caller).
bool direct_conv2d(ConvPass pass, DType dtype, const Conv2dShape& shape, const void* first,
                   const void* second, void* out, const void* bias = nullptr,
                   void* grad_bias = nullptr);

// Which implementation oneDNN chose for the case (its impl_info_str, e.g. "jit:avx512_core"),
// for benchmarks and the tests' log.
std::string conv2d_onednn_implementation(ConvPass pass, DType operand, DType out_dtype,
                                         const Conv2dShape& shape);

}  // namespace cpu
}  // namespace mpigrad::kernels
