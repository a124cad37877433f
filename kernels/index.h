// Indexing along the middle axis of dense [outer, extent, inner] buffers with int64 indices.
// index_select and gather write with `=`; index_add and scatter_add add with `+=` (they are the
// backward of the first two, where one source element may receive several gradients).
// Every kernel checks its indices and returns the position of the first one out of range,
// or -1 when all are valid, so core/ can name the bad index without a second pass.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mpigrad/kernels/dtype.h"

namespace mpigrad::kernels {

// The reductions of scatter_reduce besides add (ONNX ScatterElements' mul, max and min).
enum class ScatterReduceOp : uint8_t { Mul, Max, Min };

namespace cpu {

// out[o, i, j] = in[o, index[i], j]; in is [outer, extent, inner], out is [outer, count, inner].
int64_t index_select(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                     const int64_t* index, int64_t count, void* out, const void* in);

// out[o, index[i], j] += in[o, i, j]; out is [outer, extent, inner], in is [outer, count, inner].
int64_t index_add(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
                  int64_t count, void* out, const void* in);

// out[o, i, j] = in[o, index[o, i, j], j]; in is [outer, extent, inner], index and out are
// [outer, count, inner].
int64_t gather(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
               int64_t count, void* out, const void* in);

// out[o, index[o, i, j], j] += in[o, i, j]; the inverse layout of gather.
int64_t scatter_add(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
                    int64_t count, void* out, const void* in);

// out[o, index[o, i, j], j] = op(out[...], in[o, i, j]) for every (o, i, j), the layout of
// scatter_add; Float32, Float64, Int32 and Int64. Max and min keep out's value against a NaN
// update, and a NaN in out stays (a comparison with NaN is false). Mul multiplies in order of
// position on the CPU, in any order on CUDA.
int64_t scatter_reduce(ScatterReduceOp op, DType dtype, int64_t outer, int64_t extent,
                       int64_t inner, const int64_t* index, int64_t count, void* out,
                       const void* in);
// Which element won each position of a max or min: winner (int64, out's layout, filled by the
// caller with a value above every position of `in`, such as its size) gets the lowest flat
// position p of `in` with in[p] == out there, at the positions where base (out before the
// reduction) is not out. The indices were checked by scatter_reduce.
void scatter_winner(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
                    int64_t count, const void* out, const void* base, const void* in,
                    int64_t* winner);

}  // namespace cpu

// The same kernels on a CUDA device (index, in and out are device memory), queued on `stream`.
// They check the indices on the device first and wait for the stream to read the answer, so they
// can return the bad position before anything is written; that check needs `workspace`, at
// least kIndexCheckBytes of device memory. index_add and scatter_add add atomically, so the
// order of float additions (and the last bits of the result) may vary between runs.
namespace cuda {

constexpr size_t kIndexCheckBytes = 8;

int64_t index_select(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                     const int64_t* index, int64_t count, void* out, const void* in,
                     void* workspace, void* stream);
int64_t index_add(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
                  int64_t count, void* out, const void* in, void* workspace, void* stream);
int64_t gather(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
               int64_t count, void* out, const void* in, void* workspace, void* stream);
int64_t scatter_add(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
                    int64_t count, void* out, const void* in, void* workspace, void* stream);
int64_t scatter_reduce(ScatterReduceOp op, DType dtype, int64_t outer, int64_t extent,
                       int64_t inner, const int64_t* index, int64_t count, void* out,
                       const void* in, void* workspace, void* stream);
void scatter_winner(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
                    int64_t count, const void* out, const void* base, const void* in,
                    int64_t* winner, void* stream);

}  // namespace cuda
}  // namespace mpigrad::kernels
