// 2-d pooling over dense [planes, height, width] buffers, where a plane is one (sample, channel)
// pair of an NCHW tensor. Max pooling records, per output, where its winner lies inside its
// window: the tap i*kernel_w + j of kernel row i and column j, in the narrowest integer that holds
// every tap (max_pool2d_tap_dtype). A byte per output instead of PyTorch's int64 flat index moves
// an eighth of the bytes through memory, and backward routes the gradient from it;
// max_pool2d_flat_indices turns taps into PyTorch's flat h*width+w where a caller needs those.
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

// Padding counts as -infinity. taps: one per output element, of max_pool2d_tap_dtype(geometry).
DType max_pool2d_tap_dtype(const Pool2dGeometry& geometry);
void max_pool2d_forward(DType dtype, const Pool2dGeometry& geometry, const void* in, void* out,
                        void* taps);
void max_pool2d_backward(DType dtype, const Pool2dGeometry& geometry, const void* grad_out,
                         const void* taps, void* grad_in);
// flat[k] = the plane index h*width+w that taps[k] names (0 for a tap that lies in the padding,
// which only a window with no input element at all records).
void max_pool2d_flat_indices(const Pool2dGeometry& geometry, const void* taps, int64_t* flat);

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
