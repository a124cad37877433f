// CUDA reduce: Sum, Max, Min over the middle axis of a dense [outer, extent, inner] buffer.
//
// Layout: out (and indices) are dense [outer, inner], written with `=`.
// Thread mapping, chosen per call:
//   - inner == 1 and extent >= kBlockRowMin: one block per (row, segment). Threads stride over
//     the segment (coalesced), then a warp-shuffle reduction and a shared-memory reduction
//     across the block's warps combine them.
//   - otherwise: one thread per (outer, segment, inner position), walking its segment of the
//     extent; neighbouring threads read neighbouring inner positions, so loads coalesce.
//   When those alone would leave the GPU idle (few outputs, a long extent), the extent is cut
//   into segments: pass 1 writes one partial per segment into the caller's workspace
//   (reduce_workspace_bytes), pass 2 combines the partials of each output in segment order. The
//   segment count depends only on the shape and the GPU, so results are deterministic.
// Sums accumulate in double for floating types and in int64 (wrapping) for integers and Bool, as
// on the CPU. Max and Min keep the first extreme, a NaN beats every number and the first NaN
// wins: partials combine by (NaN first, then value, then lower index), which is associative and
// gives exactly the sequential rule's answer.
#include <algorithm>
#include <type_traits>

#include "mpigrad/kernels/cuda/common.cuh"
#include "mpigrad/kernels/reduce.h"

namespace mpigrad::kernels::cuda {
namespace {

using detail::as_stream;

constexpr int kReduceThreads = 256;
constexpr int64_t kBlockRowMin = 256;       // rows at least this long get a block each
constexpr int64_t kMinBlockSegment = 8192;  // elements per block when a row is split
constexpr int64_t kMinThreadSegment = 64;   // elements per thread when a column is split
constexpr int64_t kMaxSegments = 1024;
constexpr size_t kMaxPartialBytes = 16;  // the largest accumulator below

// Shuffles any accumulator field; sub-word integers travel as int.
template <typename X>
__device__ __forceinline__ X shuffle_xor(X value, int delta) {
  if constexpr (std::is_integral_v<X> && sizeof(X) < sizeof(int)) {
    return X(__shfl_xor_sync(0xffffffffu, int(value), delta));
  } else {
    return __shfl_xor_sync(0xffffffffu, value, delta);
  }
}

template <typename T>
struct SumReducer {
  using Acc = std::conditional_t<is_floating_v<T>, double, int64_t>;
  using Out = std::conditional_t<is_floating_v<T>, T, int64_t>;
  __device__ static Acc identity() { return Acc(0); }
  __device__ static Acc make(T value, int64_t) { return Acc(compute_t<T>(value)); }
  __device__ static Acc combine(Acc a, Acc b) {
    if constexpr (std::is_integral_v<Acc>) {
      return wrap_add(a, b);
    } else {
      return a + b;
    }
  }
  __device__ static Acc shuffle(Acc a, int delta) { return shuffle_xor(a, delta); }
  __device__ static void store(Acc a, void* out, int64_t*, int64_t position) {
    static_cast<Out*>(out)[position] = cast_to<Out>(a);
  }
};

template <typename T, bool IsMax>
struct ExtremeReducer {
  using C = compute_t<T>;
  struct Acc {
    C value;
    int64_t index;  // -1: no element yet
  };
  __device__ static Acc identity() { return Acc{C(0), -1}; }
  __device__ static Acc make(T value, int64_t index) { return Acc{C(value), index}; }
  // Whether a is the answer over b, whichever order they came in.
  __device__ static bool better(const Acc& a, const Acc& b) {
    if (a.index < 0) return false;
    if (b.index < 0) return true;
    const bool a_nan = is_nan(a.value), b_nan = is_nan(b.value);
    if (a_nan || b_nan) return a_nan && b_nan ? a.index < b.index : a_nan;
    if (a.value == b.value) return a.index < b.index;
    return IsMax ? a.value > b.value : a.value < b.value;
  }
  __device__ static Acc combine(Acc a, Acc b) { return better(a, b) ? a : b; }
  __device__ static Acc shuffle(Acc a, int delta) {
    return Acc{shuffle_xor(a.value, delta), shuffle_xor(a.index, delta)};
  }
  __device__ static void store(Acc a, void* out, int64_t* indices, int64_t position) {
    static_cast<T*>(out)[position] = T(a.value);
    if (indices != nullptr) indices[position] = a.index;
  }
};

// Combines `acc` across the block; the result is valid in thread 0.
template <typename R>
__device__ typename R::Acc block_reduce(typename R::Acc acc) {
  using Acc = typename R::Acc;
  __shared__ Acc warp_results[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int delta = 16; delta > 0; delta /= 2) acc = R::combine(acc, R::shuffle(acc, delta));
  __syncthreads();  // warp_results may still be read by a previous call
  if (lane == 0) warp_results[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    const int warps = int(blockDim.x + 31) / 32;
    acc = lane < warps ? warp_results[lane] : R::identity();
#pragma unroll
    for (int delta = 16; delta > 0; delta /= 2) acc = R::combine(acc, R::shuffle(acc, delta));
  }
  return acc;
}

struct Plan {
  bool block_rows = false;
  int64_t segments = 1;
  int64_t segment_length = 0;
};

Plan make_plan(int64_t outer, int64_t extent, int64_t inner, int sms) {
  Plan plan;
  plan.block_rows = inner == 1 && extent >= kBlockRowMin;
  if (plan.block_rows) {
    const int64_t wanted_blocks = int64_t(sms) * 4;
    if (outer < wanted_blocks) {
      plan.segments = std::min((wanted_blocks + outer - 1) / outer,
                               (extent + kMinBlockSegment - 1) / kMinBlockSegment);
    }
  } else {
    const int64_t wanted_threads = int64_t(sms) * 2048;
    const int64_t outputs = outer * inner;
    if (outputs < wanted_threads) {
      plan.segments = std::min((wanted_threads + outputs - 1) / outputs,
                               (extent + kMinThreadSegment - 1) / kMinThreadSegment);
    }
  }
  plan.segments = std::clamp<int64_t>(plan.segments, 1, kMaxSegments);
  plan.segment_length = (extent + plan.segments - 1) / plan.segments;
  return plan;
}

// Pass 1, rows: one block per (row, segment).
template <typename T, typename R>
__global__ void reduce_rows_kernel(int64_t outer, int64_t extent, int64_t segments,
                                   int64_t segment_length, const T* in, void* out, int64_t* indices,
                                   typename R::Acc* partial) {
  using Acc = typename R::Acc;
  for (int64_t item = blockIdx.x; item < outer * segments; item += gridDim.x) {
    const int64_t o = item / segments, s = item % segments;
    const int64_t begin = s * segment_length;
    const int64_t end = std::min(extent, begin + segment_length);
    const T* row = in + o * extent;
    Acc acc = R::identity();
    for (int64_t e = begin + threadIdx.x; e < end; e += blockDim.x) {
      acc = R::combine(acc, R::make(detail::load(row + e), e));
    }
    acc = block_reduce<R>(acc);
    if (threadIdx.x == 0) {
      if (partial != nullptr) {
        partial[item] = acc;  // [outer, segments] with inner == 1
      } else {
        R::store(acc, out, indices, o);
      }
    }
  }
}

// Pass 1, columns: one thread per (outer, segment, inner).
template <typename T, typename R>
__global__ void reduce_columns_kernel(int64_t outer, int64_t extent, int64_t inner,
                                      int64_t segments, int64_t segment_length, const T* in,
                                      void* out, int64_t* indices, typename R::Acc* partial) {
  using Acc = typename R::Acc;
  const int64_t items = outer * segments * inner;
  for (int64_t item = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; item < items;
       item += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = item % inner;
    const int64_t rest = item / inner;
    const int64_t s = rest % segments, o = rest / segments;
    const int64_t begin = s * segment_length;
    const int64_t end = std::min(extent, begin + segment_length);
    const T* column = in + o * extent * inner + i;
    Acc acc = R::identity();
    for (int64_t e = begin; e < end; ++e) {
      acc = R::combine(acc, R::make(detail::load(column + e * inner), e));
    }
    if (partial != nullptr) {
      partial[item] = acc;  // [outer, segments, inner]
    } else {
      R::store(acc, out, indices, o * inner + i);
    }
  }
}

// Pass 2: the partials of each output, combined in segment order.
template <typename R>
__global__ void reduce_finish_kernel(int64_t outer, int64_t inner, int64_t segments,
                                     const typename R::Acc* partial, void* out, int64_t* indices) {
  using Acc = typename R::Acc;
  for (int64_t item = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; item < outer * inner;
       item += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = item / inner, i = item % inner;
    Acc acc = R::identity();
    for (int64_t s = 0; s < segments; ++s) {
      acc = R::combine(acc, partial[(o * segments + s) * inner + i]);
    }
    R::store(acc, out, indices, item);
  }
}

template <typename T, typename R>
void run_reduce(int64_t outer, int64_t extent, int64_t inner, void* out, int64_t* indices,
                const T* in, void* workspace, const Plan& plan, cudaStream_t stream) {
  using Acc = typename R::Acc;
  static_assert(sizeof(Acc) <= kMaxPartialBytes, "workspace sizing assumes 16-byte partials");
  Acc* partial = plan.segments > 1 ? static_cast<Acc*>(workspace) : nullptr;
  if (plan.block_rows) {
    const int64_t items = outer * plan.segments;
    const unsigned grid = unsigned(std::min<int64_t>(items, detail::kMaxBlocks));
    reduce_rows_kernel<T, R><<<grid, kReduceThreads, 0, stream>>>(
        outer, extent, plan.segments, plan.segment_length, in, out, indices, partial);
  } else {
    const int64_t items = outer * plan.segments * inner;
    reduce_columns_kernel<T, R>
        <<<detail::grid_for(items, kReduceThreads), kReduceThreads, 0, stream>>>(
            outer, extent, inner, plan.segments, plan.segment_length, in, out, indices, partial);
  }
  if (partial != nullptr) {
    reduce_finish_kernel<R>
        <<<detail::grid_for(outer * inner, kReduceThreads), kReduceThreads, 0, stream>>>(
            outer, inner, plan.segments, partial, out, indices);
  }
}

template <typename T>
__global__ void zero_kernel(int64_t n, T* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = T(0.0f);
  }
}

void check_sizes(ReduceOp op, int64_t outer, int64_t extent, int64_t inner) {
  if (outer < 0 || extent < 0 || inner < 0) detail::throw_invalid("reduce", "negative size");
  if (op != ReduceOp::Sum && extent == 0 && outer * inner > 0) {
    detail::throw_invalid("reduce", "Max and Min need an extent of at least 1");
  }
}

}  // namespace

size_t reduce_workspace_bytes(ReduceOp op, DType, int64_t outer, int64_t extent, int64_t inner) {
  check_sizes(op, outer, extent, inner);
  if (outer == 0 || inner == 0 || extent == 0) return 0;
  const Plan plan = make_plan(outer, extent, inner, detail::multiprocessor_count("reduce"));
  if (plan.segments == 1) return 0;
  return size_t(outer * plan.segments * inner) * kMaxPartialBytes;
}

void reduce(ReduceOp op, DType dtype, int64_t outer, int64_t extent, int64_t inner, void* out,
            int64_t* indices, const void* in, void* workspace, void* stream) {
  check_sizes(op, outer, extent, inner);
  if (outer == 0 || inner == 0) return;
  cudaStream_t s = as_stream(stream);
  detail::visit(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (extent == 0) {  // Sum of nothing
      using Out = typename SumReducer<T>::Out;
      zero_kernel<Out><<<detail::grid_for(outer * inner), detail::kThreads, 0, s>>>(
          outer * inner, static_cast<Out*>(out));
      return;
    }
    const Plan plan = make_plan(outer, extent, inner, detail::multiprocessor_count("reduce"));
    if (plan.segments > 1 && workspace == nullptr) {
      detail::throw_invalid("reduce", "this shape needs a workspace of reduce_workspace_bytes()");
    }
    const T* data = static_cast<const T*>(in);
    switch (op) {
      case ReduceOp::Sum:
        run_reduce<T, SumReducer<T>>(outer, extent, inner, out, indices, data, workspace, plan, s);
        break;
      case ReduceOp::Max:
        run_reduce<T, ExtremeReducer<T, true>>(outer, extent, inner, out, indices, data, workspace,
                                               plan, s);
        break;
      case ReduceOp::Min:
        run_reduce<T, ExtremeReducer<T, false>>(outer, extent, inner, out, indices, data, workspace,
                                                plan, s);
        break;
    }
  });
  detail::check_launch("reduce", stream);
}

}  // namespace mpigrad::kernels::cuda
