// Internal to kernels/cpu: the blocked paths of a same-dtype strided copy, which is how core/
// materializes a permuted view (Transpose, NCHW <-> NHWC, contiguous() of a transposed matrix).
// elementwise.cpp's copy() tries copy_blocked first and walks element by element only when it
// declines.
#pragma once

#include "mpigrad/kernels/elementwise.h"

namespace mpigrad::kernels::cpu {

// Copies `loop` (operand 0 out, operand 1 in, elements of element_size bytes: 1, 2, 4 or 8)
// and returns true when its layout is one the blocked paths take:
//  - a transpose: the dim along which `in` is contiguous is not the one along which `out` is.
//    Both are walked in square tiles, so that reads and writes each stream whole cache lines.
//    Any other dims are a batch of such transposes.
//  - rows: both are contiguous along the same dim, in rows of at least kMinRowBytes, copied by
//    memcpy; rows of exactly 8 or 16 bytes become the elements of a transpose instead.
//  - short rows: both contiguous along the last dim in rows shorter than kMinRowBytes, each
//    moved by fixed-size loads and stores (short_copy.h).
// Returns false, having written nothing, for any other layout (no unit stride on one side, short
// rows along another dim, a single element), which the generic walk handles. Bit for bit a copy:
// elements move as words, never as values. Threads over tiles (parallel.h) when the copy is large.
bool copy_blocked(int element_size, const StridedLoop& loop, void* out, const void* in);

// Rows shorter than this are not copied by a memcpy call each: it costs more than the row.
constexpr int kMinRowBytes = 32;

}  // namespace mpigrad::kernels::cpu
