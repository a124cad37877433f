// Internal to kernels/cpu: max pooling's Float32 AVX2 routines for 2x2 windows of stride 2 without
// padding, one plane per call and without the dispatch and threading of max_pool2d_forward and
// max_pool2d_backward, for kernels that fuse the pooling with the op before it (normalization.cpp's
// batch norm + ReLU + max pooling) and call them plane by plane. Each writes exactly what those two
// write for the plane. The caller checks has_avx2_fma() and the geometry: 2x2 windows, stride 2,
// no padding or dilation, planes = 1, out_h = height / 2 >= 1 and out_w = width / 2 >= 1.
#pragma once

#include <cstdint>

#include "mpigrad/kernels/cpu/vector_math.h"
#include "mpigrad/kernels/pooling.h"

namespace mpigrad::kernels::cpu {

#if defined(MPIGRAD_HAS_AVX2_MATH)
void max_pool_2x2_forward_plane(const Pool2dGeometry& plane, const float* in, float* out,
                                uint8_t* taps);
void max_pool_2x2_backward_plane(const Pool2dGeometry& plane, const float* grad_out,
                                 const uint8_t* taps, float* grad_in);
#endif

}  // namespace mpigrad::kernels::cpu
