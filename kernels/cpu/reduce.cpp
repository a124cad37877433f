// CPU reduce: Sum, Max, Min over the middle axis of a dense [outer, extent, inner] buffer.
//
// Layout: out (and indices) are dense [outer, inner], written with `=`.
// inner == 1: each output is one contiguous row. A row is summed in fixed blocks of kBlock
//   elements, each with several independent accumulators, and the block sums are added in
//   order; rows are spread over threads, and a few very long rows are split by block instead.
//   Because the blocking never depends on the thread count, neither do the results.
// inner > 1: the inner axis is cut into tiles of kTile accumulators; for each (outer, tile) the
//   kernel walks e outer and i inner, so every load is a unit-stride stream. Tiles are spread
//   over threads.
// Sums accumulate in double (floating types) or int64 (integer types and Bool); Max and Min
// keep the first extreme, where a NaN beats every number and the first NaN wins.
#include "mpigrad/kernels/reduce.h"

#include <algorithm>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "mpigrad/kernels/cpu/parallel.h"
#include "mpigrad/kernels/cpu/scalar.h"

namespace mpigrad::kernels::cpu {
namespace {

constexpr int64_t kBlock = 16384;  // elements of a row summed before folding into the total
constexpr int64_t kTile = 256;     // inner positions reduced together when inner > 1
constexpr int kLanes = 8;          // independent accumulators, so the adds can overlap

template <typename T>
using sum_t = std::conditional_t<is_floating_v<T>, double, int64_t>;

template <typename T>
using sum_out_t = std::conditional_t<is_floating_v<T>, T, int64_t>;

template <typename T>
sum_t<T> sum_block(const T* data, int64_t n) {
  using Acc = sum_t<T>;
  using C = compute_t<T>;
  Acc lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int lane = 0; lane < kLanes; ++lane) lanes[lane] += Acc(C(data[i + lane]));
  }
  for (; i < n; ++i) lanes[0] += Acc(C(data[i]));
  Acc total = 0;
  for (int lane = 0; lane < kLanes; ++lane) total += lanes[lane];
  return total;
}

// An extreme found so far: its value and where it was.
template <typename C>
struct Extreme {
  C value;
  int64_t index;
};

// Whether `candidate` replaces `best` for Max (IsMax) or Min; earlier positions win ties.
template <bool IsMax, typename C>
inline bool replaces(C candidate, C best) {
  if (is_nan(best)) return false;
  if (is_nan(candidate)) return true;
  return IsMax ? candidate > best : candidate < best;
}

template <bool IsMax, typename T>
Extreme<compute_t<T>> extreme_block(const T* data, int64_t n, int64_t first_index) {
  using C = compute_t<T>;
  Extreme<C> best{C(data[0]), first_index};
  for (int64_t i = 1; i < n; ++i) {
    const C value = C(data[i]);
    if (replaces<IsMax>(value, best.value)) {
      best = {value, first_index + i};
      if (is_nan(value)) break;  // nothing can replace the first NaN
    }
  }
  return best;
}

// inner == 1. Each output is reduced over ceil(extent / kBlock) blocks; when there are fewer
// rows than enough to keep the threads busy, the blocks of one row go to different threads.
template <typename T>
void reduce_rows(ReduceOp op, int64_t outer, int64_t extent, void* out, int64_t* indices,
                 const T* in) {
  using C = compute_t<T>;
  const int64_t blocks = (extent + kBlock - 1) / kBlock;
  const bool split_rows = blocks >= 4 && outer < 64;

  if (op == ReduceOp::Sum) {
    if (split_rows) {
      std::vector<sum_t<T>> partial(static_cast<size_t>(blocks));
      for (int64_t row = 0; row < outer; ++row) {
        const T* data = in + row * extent;
        parallel_for(0, blocks, 1, [&](int64_t b, int64_t e) {
          for (int64_t blk = b; blk < e; ++blk) {
            const int64_t start = blk * kBlock;
            partial[size_t(blk)] = sum_block(data + start, std::min(kBlock, extent - start));
          }
        });
        // Folding the block sums in order gives the same bits as the serial path below.
        sum_t<T> total = 0;
        for (const sum_t<T>& block_sum : partial) total += block_sum;
        static_cast<sum_out_t<T>*>(out)[row] = cast_to<sum_out_t<T>>(total);
      }
      return;
    }
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(extent, 1));
    parallel_for(0, outer, grain, [&](int64_t b, int64_t e) {
      for (int64_t row = b; row < e; ++row) {
        const T* data = in + row * extent;
        sum_t<T> total = 0;
        for (int64_t start = 0; start < extent; start += kBlock) {
          total += sum_block(data + start, std::min(kBlock, extent - start));
        }
        static_cast<sum_out_t<T>*>(out)[row] = cast_to<sum_out_t<T>>(total);
      }
    });
    return;
  }

  auto run_extreme = [&](auto is_max_tag) {
    constexpr bool kIsMax = decltype(is_max_tag)::value;
    T* values = static_cast<T*>(out);
    auto store = [&](int64_t row, Extreme<C> best) {
      values[row] = T(best.value);
      if (indices) indices[row] = best.index;
    };
    if (split_rows) {
      std::vector<Extreme<C>> partial(static_cast<size_t>(blocks));
      for (int64_t row = 0; row < outer; ++row) {
        const T* data = in + row * extent;
        parallel_for(0, blocks, 1, [&](int64_t b, int64_t e) {
          for (int64_t blk = b; blk < e; ++blk) {
            const int64_t start = blk * kBlock;
            partial[size_t(blk)] =
                extreme_block<kIsMax>(data + start, std::min(kBlock, extent - start), start);
          }
        });
        Extreme<C> best = partial[0];
        for (int64_t blk = 1; blk < blocks; ++blk) {
          const Extreme<C>& candidate = partial[size_t(blk)];
          if (replaces<kIsMax>(candidate.value, best.value)) best = candidate;
        }
        store(row, best);
      }
      return;
    }
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / extent);
    parallel_for(0, outer, grain, [&](int64_t b, int64_t e) {
      for (int64_t row = b; row < e; ++row) {
        store(row, extreme_block<kIsMax>(in + row * extent, extent, 0));
      }
    });
  };
  if (op == ReduceOp::Max) {
    run_extreme(std::true_type{});
  } else {
    run_extreme(std::false_type{});
  }
}

// inner > 1: one work item is (o, tile of inner positions).
template <typename T>
void reduce_columns(ReduceOp op, int64_t outer, int64_t extent, int64_t inner, void* out,
                    int64_t* indices, const T* in) {
  using C = compute_t<T>;
  const int64_t tiles = (inner + kTile - 1) / kTile;
  const int64_t items = outer * tiles;
  const int64_t work_per_item = std::max<int64_t>(1, extent * std::min(inner, kTile));
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / work_per_item);

  auto for_each_tile = [&](auto&& body) {
    parallel_for(0, items, grain, [&](int64_t b, int64_t e) {
      for (int64_t item = b; item < e; ++item) {
        const int64_t o = item / tiles;
        const int64_t first = (item % tiles) * kTile;
        body(o, first, std::min(kTile, inner - first));
      }
    });
  };

  if (op == ReduceOp::Sum) {
    using Acc = sum_t<T>;
    auto* sums = static_cast<sum_out_t<T>*>(out);
    for_each_tile([&](int64_t o, int64_t first, int64_t width) {
      Acc acc[kTile] = {};
      for (int64_t e = 0; e < extent; ++e) {
        const T* row = in + (o * extent + e) * inner + first;
        for (int64_t i = 0; i < width; ++i) acc[i] += Acc(C(row[i]));
      }
      for (int64_t i = 0; i < width; ++i) {
        sums[o * inner + first + i] = cast_to<sum_out_t<T>>(acc[i]);
      }
    });
    return;
  }

  auto run_extreme = [&](auto is_max_tag) {
    constexpr bool kIsMax = decltype(is_max_tag)::value;
    T* values = static_cast<T*>(out);
    for_each_tile([&](int64_t o, int64_t first, int64_t width) {
      C best[kTile];
      int64_t where[kTile];
      const T* row0 = in + o * extent * inner + first;
      for (int64_t i = 0; i < width; ++i) {
        best[i] = C(row0[i]);
        where[i] = 0;
      }
      for (int64_t e = 1; e < extent; ++e) {
        const T* row = row0 + e * inner;
        for (int64_t i = 0; i < width; ++i) {
          const C value = C(row[i]);
          const bool take = replaces<kIsMax>(value, best[i]);
          best[i] = take ? value : best[i];
          where[i] = take ? e : where[i];
        }
      }
      for (int64_t i = 0; i < width; ++i) {
        values[o * inner + first + i] = T(best[i]);
        if (indices) indices[o * inner + first + i] = where[i];
      }
    });
  };
  if (op == ReduceOp::Max) {
    run_extreme(std::true_type{});
  } else {
    run_extreme(std::false_type{});
  }
}

}  // namespace

void reduce(ReduceOp op, DType dtype, int64_t outer, int64_t extent, int64_t inner, void* out,
            int64_t* indices, const void* in) {
  if (outer < 0 || extent < 0 || inner < 0) throw_invalid("reduce", "negative size");
  if (op != ReduceOp::Sum && extent == 0 && outer * inner > 0)
    throw_invalid("reduce", "Max and Min need an extent of at least 1");
  if (outer == 0 || inner == 0) return;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (extent == 0) {  // Sum of nothing
      auto* sums = static_cast<sum_out_t<T>*>(out);
      std::fill(sums, sums + outer * inner, sum_out_t<T>(0.0f));
      return;
    }
    const T* data = static_cast<const T*>(in);
    if (inner == 1) {
      reduce_rows<T>(op, outer, extent, out, indices, data);
    } else {
      reduce_columns<T>(op, outer, extent, inner, out, indices, data);
    }
  });
}

}  // namespace mpigrad::kernels::cpu
