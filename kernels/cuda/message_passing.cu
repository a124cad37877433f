// CUDA gather_mul_scatter (kernels/message_passing.h): out[target[e]] (+)= a[a_index[e]] *
// b[b_index[e]], row by row.
//
// Layout: dense row-major [rows, width] operands, int64 indices in device memory; a null index
// is e itself. With a target the products are added (`+=`, atomically) into out, which the
// caller cleared; without one they are written (`=`) to out's row e.
// Thread mapping: one thread per (edge, column) element of the [edges, width] product, with
// consecutive threads on consecutive columns of one edge, so the reads of a, b and the atomics
// into out's row are coalesced.
// Checking: the three index arrays are checked on the device first (index.cu's first-bad
// kernel, one array after another), and a bad position comes back before anything is written.
#include <type_traits>

#include "mpigrad/kernels/cuda/common.cuh"
#include "mpigrad/kernels/message_passing.h"

namespace mpigrad::kernels::cuda {
namespace {

using detail::as_stream;
using detail::kThreads;

template <typename T, bool kAccumulate>
__global__ void gather_mul_scatter_kernel(int64_t edges, int64_t width, const int64_t* a_index,
                                          const T* a, const int64_t* b_index, const T* b,
                                          const int64_t* target, T* out) {
  const int64_t n = edges * width;
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < n;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = p / width, j = p % width;
    const int64_t ra = a_index ? a_index[e] : e;
    const int64_t rb = b_index ? b_index[e] : e;
    const T value = a[ra * width + j] * b[rb * width + j];
    if constexpr (kAccumulate) {
      atomicAdd(out + target[e] * width + j, value);
    } else {
      out[p] = value;
    }
  }
}

}  // namespace

int64_t gather_mul_scatter(DType dtype, const GatherMulScatterArgs& args, void* workspace,
                           void* stream) {
  const char* kernel = "gather_mul_scatter";
  if (args.edges < 0 || args.width < 0 || args.a_rows < 0 || args.b_rows < 0 || args.out_rows < 0) {
    detail::throw_invalid(kernel, "negative size");
  }
  if ((args.a_index == nullptr && args.a_rows != args.edges) ||
      (args.b_index == nullptr && args.b_rows != args.edges)) {
    detail::throw_invalid(kernel, "an operand has no index but not one row per edge");
  }
  const int64_t out_rows = args.target ? args.out_rows : args.edges;
  const int64_t* indices[3] = {args.a_index, args.b_index, args.target};
  const int64_t rows[3] = {args.a_rows, args.b_rows, out_rows};
  for (int which = 0; which < 3; ++which) {
    if (indices[which] == nullptr) continue;
    const int64_t bad =
        detail::first_bad_index(indices[which], args.edges, rows[which], workspace, stream, kernel);
    if (bad >= 0) return which * args.edges + bad;
  }
  const int64_t n = args.edges * args.width;
  if (n == 0) return -1;
  bool taken = false;
  detail::visit(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      const T* a = static_cast<const T*>(args.a);
      const T* b = static_cast<const T*>(args.b);
      T* out = static_cast<T*>(args.out);
      if (args.target != nullptr) {
        gather_mul_scatter_kernel<T, true><<<detail::grid_for(n), kThreads, 0, as_stream(stream)>>>(
            args.edges, args.width, args.a_index, a, args.b_index, b, args.target, out);
      } else {
        gather_mul_scatter_kernel<T, false>
            <<<detail::grid_for(n), kThreads, 0, as_stream(stream)>>>(
                args.edges, args.width, args.a_index, a, args.b_index, b, nullptr, out);
      }
      taken = true;
    }
  });
  if (!taken) detail::throw_unsupported(kernel, "", dtype);
  detail::check_launch(kernel, stream);
  return -1;
}

}  // namespace mpigrad::kernels::cuda
