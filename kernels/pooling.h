// 2-d pooling over dense [planes, height, width] buffers, where a plane is one (sample, channel)
// pair of an NCHW tensor. Max pooling records, per output, the flat index h*width+w of the
// winning input inside its plane (PyTorch's convention), and backward routes the gradient there.
// Forward writes `=`; backward writes every element of grad_in with `=`.
#pragma once

#include <cstdint>

#include "mpigrad/kernels/dtype.h"

namespace mpigrad::kernels {

struct Pool2dGeometry {
  int64_t planes = 0, height = 0, width = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;  // max pooling only
  int64_t out_h = 0, out_w = 0;
};

namespace cpu {

// Padding counts as -infinity. indices: Int64, one per output element.
void max_pool2d_forward(DType dtype, const Pool2dGeometry& geometry, const void* in, void* out,
                        int64_t* indices);
void max_pool2d_backward(DType dtype, const Pool2dGeometry& geometry, const void* grad_out,
                         const int64_t* indices, void* grad_in);

// count_include_pad: the divisor is the window clipped to the padded input (PyTorch's default)
// rather than to the input itself.
void avg_pool2d_forward(DType dtype, const Pool2dGeometry& geometry, bool count_include_pad,
                        const void* in, void* out);
void avg_pool2d_backward(DType dtype, const Pool2dGeometry& geometry, bool count_include_pad,
                         const void* grad_out, void* grad_in);

// Output cell (i, j) averages rows [floor(i*H/oh), ceil((i+1)*H/oh)) and the same for columns.
// Only planes, height, width, out_h and out_w of the geometry are used.
void adaptive_avg_pool2d_forward(DType dtype, const Pool2dGeometry& geometry, const void* in,
                                 void* out);
void adaptive_avg_pool2d_backward(DType dtype, const Pool2dGeometry& geometry, const void* grad_out,
                                  void* grad_in);

}  // namespace cpu
}  // namespace mpigrad::kernels
