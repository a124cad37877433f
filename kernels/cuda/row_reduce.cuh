// Internal to kernels/cuda: the per-row reductions that softmax and cross-entropy share.
//
// A row is handled by one warp (short rows, kWarpRowMax columns or fewer; a block holds
// kRowsPerBlock such rows) or by one block of kRowThreads threads (long rows). Either way every
// thread of the row group strides over the row's columns, and these helpers combine the
// threads' partial results across the group and hand the total to every thread of it.
//
// The online softmax statistic (Milakov and Gimelshein, 2018) is a running maximum m and a sum
// s of exp(x - m): one read of the row gives both, and two partial (m, s) merge exactly.
#pragma once

#include "mpigrad/kernels/cuda/common.cuh"

namespace mpigrad::kernels::cuda::detail {

constexpr int kWarpRowMax = 1024;  // rows up to this long get one warp each
constexpr int kRowsPerBlock = 4;   // warps (rows) per block in the one-warp-per-row mapping
constexpr int kRowThreads = 512;   // threads per block in the one-block-per-row mapping

template <typename Acc>
struct MaxSum {
  Acc max;
  Acc sum;
};

template <typename Acc>
__device__ __forceinline__ MaxSum<Acc> online_init() {
  return MaxSum<Acc>{-infinity<Acc>(), Acc(0)};
}

// Adds one element x to the statistic. A -inf (a masked logit) before any finite value adds
// nothing, where exp(-inf - -inf) would make the sum NaN; a NaN still makes it NaN, as on the
// CPU.
template <typename Acc>
__device__ __forceinline__ void online_add(MaxSum<Acc>& ms, Acc x) {
  if (x > ms.max) {
    ms.sum = ms.sum * m_exp(ms.max - x) + Acc(1);
    ms.max = x;
  } else if (ms.max != -infinity<Acc>() || x != x) {
    ms.sum += m_exp(x - ms.max);
  }
}

// Merges two statistics; an empty one (sum 0) contributes nothing, even when its max is -inf.
template <typename Acc>
__device__ __forceinline__ MaxSum<Acc> online_merge(MaxSum<Acc> a, MaxSum<Acc> b) {
  if (a.sum == Acc(0)) return b;
  if (b.sum == Acc(0)) return a;
  const Acc m = a.max > b.max ? a.max : b.max;
  return MaxSum<Acc>{m, a.sum * m_exp(a.max - m) + b.sum * m_exp(b.max - m)};
}

template <typename Acc>
__device__ __forceinline__ MaxSum<Acc> warp_merge(MaxSum<Acc> ms) {
#pragma unroll
  for (int delta = 16; delta > 0; delta /= 2) {
    MaxSum<Acc> other{__shfl_xor_sync(0xffffffffu, ms.max, delta),
                      __shfl_xor_sync(0xffffffffu, ms.sum, delta)};
    ms = online_merge(ms, other);
  }
  return ms;
}

template <typename Acc>
__device__ __forceinline__ Acc warp_sum(Acc value) {
#pragma unroll
  for (int delta = 16; delta > 0; delta /= 2) value += __shfl_xor_sync(0xffffffffu, value, delta);
  return value;
}

// Block-wide versions for the one-block-per-row mapping: every thread of the block gets the
// total. They synchronize the block, so every thread must call them.
template <typename Acc>
__device__ MaxSum<Acc> block_merge(MaxSum<Acc> ms) {
  __shared__ MaxSum<Acc> partial[32];
  __shared__ MaxSum<Acc> total;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  ms = warp_merge(ms);
  __syncthreads();  // the previous row's readers are done with partial and total
  if (lane == 0) partial[warp] = ms;
  __syncthreads();
  if (warp == 0) {
    const int warps = int(blockDim.x + 31) / 32;
    ms = lane < warps ? partial[lane] : online_init<Acc>();
    ms = warp_merge(ms);
    if (lane == 0) total = ms;
  }
  __syncthreads();
  return total;
}

template <typename Acc>
__device__ Acc block_sum(Acc value) {
  __shared__ Acc partial[32];
  __shared__ Acc total;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  value = warp_sum(value);
  __syncthreads();
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  if (warp == 0) {
    const int warps = int(blockDim.x + 31) / 32;
    value = lane < warps ? partial[lane] : Acc(0);
    value = warp_sum(value);
    if (lane == 0) total = value;
  }
  __syncthreads();
  return total;
}

// Where a row group starts and how its threads stride. For the warp mapping, `row` may be past
// the last row for the block's spare warps; they still run the loops (with no columns) so that
// no shuffle is left half-populated, and skip their writes.
struct RowGroup {
  int64_t row;
  int lane;     // this thread's first column
  int threads;  // the stride over columns
};

template <bool kWarpPerRow>
__device__ __forceinline__ RowGroup row_group(int64_t block_row) {
  if constexpr (kWarpPerRow) {
    return RowGroup{block_row * kRowsPerBlock + threadIdx.x / 32, int(threadIdx.x % 32), 32};
  } else {
    return RowGroup{block_row, int(threadIdx.x), int(blockDim.x)};
  }
}

template <bool kWarpPerRow, typename Acc>
__device__ __forceinline__ MaxSum<Acc> group_merge(MaxSum<Acc> ms) {
  if constexpr (kWarpPerRow) {
    return warp_merge(ms);
  } else {
    return block_merge(ms);
  }
}

template <bool kWarpPerRow, typename Acc>
__device__ __forceinline__ Acc group_sum(Acc value) {
  if constexpr (kWarpPerRow) {
    return warp_sum(value);
  } else {
    return block_sum(value);
  }
}

// Blocks and threads for `rows` rows of `cols` columns under either mapping.
inline int64_t row_blocks(bool warp_per_row, int64_t rows) {
  return warp_per_row ? (rows + kRowsPerBlock - 1) / kRowsPerBlock : rows;
}

}  // namespace mpigrad::kernels::cuda::detail
