// Reductions over the middle axis of a dense [outer, extent, inner] buffer; core/ brings any set
// of axes to that layout first. Outputs are dense [outer, inner] and written with `=`.
// Sums accumulate in double for floating types and in int64 for integer types, so float32
// sums over millions of elements keep their precision.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mpigrad/kernels/dtype.h"

namespace mpigrad::kernels {

enum class ReduceOp : uint8_t { Sum, Max, Min };

// The dtype a reduction writes: Sum of an integer or Bool input is Int64, everything else keeps
// the input dtype.
constexpr DType reduce_out_dtype(ReduceOp op, DType in) {
  if (op == ReduceOp::Sum &&
      (in == DType::Int32 || in == DType::UInt8 || in == DType::Bool || in == DType::Int64)) {
    return DType::Int64;
  }
  return in;
}

namespace cpu {

// out[o, i] = reduce_e in[o, e, i]. For Max and Min, `indices` (may be null) receives the
// position e of the first extreme element; NaN counts as the extreme, as in PyTorch.
// extent must be at least 1 for Max and Min; a Sum over extent 0 writes zeros.
void reduce(ReduceOp op, DType dtype, int64_t outer, int64_t extent, int64_t inner, void* out,
            int64_t* indices, const void* in);

}  // namespace cpu

// The same reduction on a CUDA device, queued on `stream`. Shapes with few outputs and a long
// extent are reduced in two passes through device scratch memory: pass a `workspace` of at least
// reduce_workspace_bytes() bytes (null when that is 0). The workspace may be reused as soon as
// later work on the same stream is queued after this call.
namespace cuda {

size_t reduce_workspace_bytes(ReduceOp op, DType dtype, int64_t outer, int64_t extent,
                              int64_t inner);
void reduce(ReduceOp op, DType dtype, int64_t outer, int64_t extent, int64_t inner, void* out,
            int64_t* indices, const void* in, void* workspace, void* stream);

}  // namespace cuda

}  // namespace mpigrad::kernels
