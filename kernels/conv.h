// A 2-d convolution becomes one matrix product per image: im2col unrolls every receptive field
// of an image [channels, height, width] into a column of a dense [channels*kh*kw, out_h*out_w]
// buffer, so out = weight[out_channels, channels*kh*kw] x columns. col2im is its adjoint and
// scatters column gradients back onto the image. Both work on one image; the CPU backend
// (core/backend.cpp) loops over the batch and over groups (a group's channels are a contiguous
// block of rows).
#pragma once

#include <cstdint>

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

}  // namespace cpu
}  // namespace mpigrad::kernels
