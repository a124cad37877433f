// The gradient of a slice (Tensor::slice, narrow, select) in one pass: the input-shaped gradient,
// zero wherever the slice did not reach and the slice's gradient where it did, written once.
// Composing it as zeros() and a strided copy into the window brings every cache line of the
// output in twice. nn::functional::conv2d slices weights to the taps that see more than padding,
// so ResNet-18 on 32x32 inputs takes 5 of these a step on 512x256 and 512x512 3x3 weights (up to
// 9.4 MB): 4.0-4.3 ms a step at one thread composed, 2.9-3.1 ms in one pass (--train.profile).
// Writes with `=` every element of `out`; nothing accumulates.
#pragma once

#include <cstdint>

namespace mpigrad::kernels {

// out, dense [outer, extent, inner], and grad, dense [outer, count, inner]:
//     out[o, start + k * step, i] = grad[o, k, i]   for k < count,
// and zero at every other position of the middle dim. 0 <= start, step >= 1, and
// start + (count - 1) * step < extent when count > 0.
struct SliceWindow {
  int64_t outer = 1;
  int64_t extent = 1;
  int64_t inner = 1;
  int64_t start = 0;
  int64_t step = 1;
  int64_t count = 0;
};

namespace cpu {

// The copy above for elements of element_size bytes (1, 2, 4 or 8): it moves words, never values,
// so it serves every dtype bit for bit, and +0 is all zero bits in each. Threaded over pieces of
// the output (parallel.h); each piece is zeroed and filled while it sits in the L1 cache.
// Throws std::invalid_argument for another element size or a window outside the extent.
void slice_backward(int element_size, const SliceWindow& window, void* out, const void* grad);

}  // namespace cpu

}  // namespace mpigrad::kernels
