// Message passing on a graph in one pass: for every edge e < edges and column j < width,
//     out[target[e], j] += a[a_index[e], j] * b[b_index[e], j]
// without the [edges, width] gathered operands or product in memory. a is [a_rows, width], b is
// [b_rows, width], all dense row-major. A null index stands for e itself (that side then has
// `edges` rows), so one kernel is SchNet's continuous-filter convolution (a = features gathered
// by source, b = one filter per edge, scattered onto targets), its gradient in the features (the
// same with source and target swapped) and in the filters (no target: the product of two
// gathered rows, written per edge).
// With a target, out is [out_rows, width] and the products are added with `+=` (the caller
// clears it); without one, out is [edges, width] and written with `=`.
// Every kernel checks all indices before it writes: a bad one's position comes back as
// `which * edges + e` (which: 0 for a_index, 1 for b_index, 2 for target), and -1 when all are
// in range. Float32 and Float64.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mpigrad/kernels/dtype.h"

namespace mpigrad::kernels {

struct GatherMulScatterArgs {
  int64_t edges = 0, width = 0;
  const int64_t* a_index = nullptr;  // [edges] rows of a, or null for e
  int64_t a_rows = 0;
  const void* a = nullptr;
  const int64_t* b_index = nullptr;  // [edges] rows of b, or null for e
  int64_t b_rows = 0;
  const void* b = nullptr;
  const int64_t* target = nullptr;  // [edges] rows of out, or null: out[e] = the product
  int64_t out_rows = 0;
  void* out = nullptr;
};

namespace cpu {

// Threading: without a target, edges are spread over threads; with one, threads own whole
// column tiles (no two write one element, no atomics), and each tile's additions come in edge
// order, so the result is the same on every run and any thread count.
int64_t gather_mul_scatter(DType dtype, const GatherMulScatterArgs& args);

}  // namespace cpu

// The same on a CUDA device (indices, a, b and out in device memory), queued on `stream`. The
// index check runs first on the device and is waited for (it needs `workspace`, at least
// kMessagePassingCheckBytes of device memory). With a target the products are added atomically,
// so the order of float additions, and the last bits of out, may vary between runs.
namespace cuda {

constexpr size_t kMessagePassingCheckBytes = 8;

int64_t gather_mul_scatter(DType dtype, const GatherMulScatterArgs& args, void* workspace,
                           void* stream);

}  // namespace cuda
}  // namespace mpigrad::kernels
