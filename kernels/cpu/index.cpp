// CPU indexing along the middle axis: index_select, index_add, gather, scatter_add.
//
// Layout: dense [outer, extent, inner] (the indexed side) and [outer, count, inner] (the other
// side); indices are int64. index_select and gather write with `=`; index_add and scatter_add
// add with `+=`.
// Every kernel checks all of its indices before it touches `out`, so a call with a bad index
// returns that index's flat position and leaves `out` exactly as it was.
// Threading: index_select and gather write disjoint rows and are spread over them. The adding
// kernels may send several source rows to one destination row, so threads only ever own whole
// (outer, tile of inner) slices: no two threads write the same element, and there are no atomics.
#include "mpigrad/kernels/index.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "mpigrad/kernels/cpu/parallel.h"
#include "mpigrad/kernels/cpu/scalar.h"

namespace mpigrad::kernels::cpu {
namespace {

constexpr int64_t kTile = 1024;  // inner positions one thread owns in the adding kernels

// The first position whose index is outside [0, extent), or -1.
int64_t first_bad_index(const int64_t* index, int64_t n, int64_t extent) {
  for (int64_t i = 0; i < n; ++i) {
    // One unsigned compare catches negatives too.
    if (uint64_t(index[i]) >= uint64_t(extent)) return i;
  }
  return -1;
}

void check_sizes(const char* kernel, int64_t outer, int64_t extent, int64_t inner, int64_t count) {
  if (outer < 0 || extent < 0 || inner < 0 || count < 0) throw_invalid(kernel, "negative size");
}

template <typename T>
inline T add(T a, T b) {
  using C = compute_t<T>;
  if constexpr (std::is_same_v<T, bool>) {
    return a || b;
  } else if constexpr (std::is_integral_v<T>) {
    return wrap_add(a, b);
  } else {
    return T(C(a) + C(b));
  }
}

// Calls body(o, first, width) for every (outer, tile of inner) slice, in parallel.
template <typename Body>
void for_each_slice(int64_t outer, int64_t inner, int64_t work_per_element, Body body) {
  const int64_t tiles = (inner + kTile - 1) / kTile;
  const int64_t per_item = std::max<int64_t>(1, work_per_element * std::min(inner, kTile));
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / per_item);
  parallel_for(0, outer * tiles, grain, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t first = (item % tiles) * kTile;
      body(item / tiles, first, std::min(kTile, inner - first));
    }
  });
}

}  // namespace

int64_t index_select(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                     const int64_t* index, int64_t count, void* out, const void* in) {
  check_sizes("index_select", outer, extent, inner, count);
  if (const int64_t bad = first_bad_index(index, count, extent); bad >= 0) return bad;
  if (outer == 0 || inner == 0 || count == 0) return -1;
  // A pure move of bytes, so one byte loop serves every dtype.
  const int64_t row_bytes = inner * element_size(dtype);
  auto* dst = static_cast<char*>(out);
  const auto* src = static_cast<const char*>(in);
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain * 4 / row_bytes);
  parallel_for(0, outer * count, grain, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t o = row / count;
      const int64_t i = row % count;
      std::memcpy(dst + row * row_bytes, src + (o * extent + index[i]) * row_bytes,
                  size_t(row_bytes));
    }
  });
  return -1;
}

int64_t index_add(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
                  int64_t count, void* out, const void* in) {
  check_sizes("index_add", outer, extent, inner, count);
  if (const int64_t bad = first_bad_index(index, count, extent); bad >= 0) return bad;
  if (outer == 0 || inner == 0 || count == 0) return -1;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* dst = static_cast<T*>(out);
    const T* src = static_cast<const T*>(in);
    for_each_slice(outer, inner, count, [&](int64_t o, int64_t first, int64_t width) {
      for (int64_t i = 0; i < count; ++i) {
        T* to = dst + (o * extent + index[i]) * inner + first;
        const T* from = src + (o * count + i) * inner + first;
        for (int64_t j = 0; j < width; ++j) to[j] = add(to[j], from[j]);
      }
    });
  });
  return -1;
}

int64_t gather(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
               int64_t count, void* out, const void* in) {
  check_sizes("gather", outer, extent, inner, count);
  const int64_t n = outer * count * inner;
  if (const int64_t bad = first_bad_index(index, n, extent); bad >= 0) return bad;
  if (n == 0) return -1;
  // Elements move unchanged, so dispatch on width only.
  auto run = [&](auto word_tag) {
    using Word = decltype(word_tag);
    Word* dst = static_cast<Word*>(out);
    const Word* src = static_cast<const Word*>(in);
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / inner);
    parallel_for(0, outer * count, grain, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const int64_t o = row / count;
        const Word* from = src + o * extent * inner;
        const int64_t* row_index = index + row * inner;
        Word* to = dst + row * inner;
        for (int64_t j = 0; j < inner; ++j) to[j] = from[row_index[j] * inner + j];
      }
    });
  };
  switch (element_size(dtype)) {
    case 1:
      run(uint8_t{});
      break;
    case 2:
      run(uint16_t{});
      break;
    case 4:
      run(uint32_t{});
      break;
    default:
      run(uint64_t{});
      break;
  }
  return -1;
}

namespace {

// out[o, index[o, i, j], j] = combine(that, in[o, i, j]) for every (o, i, j). Element (o, i, j)
// only ever lands in column j of slab o, so (o, tile) slices are disjoint, and within one the
// updates of a position come in order of i, which is the order of their flat positions.
template <typename T, typename Combine>
void scatter_slices(int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
                    int64_t count, T* out, const T* in, Combine combine) {
  for_each_slice(outer, inner, count, [&](int64_t o, int64_t first, int64_t width) {
    T* to = out + o * extent * inner;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t base = (o * count + i) * inner;
      for (int64_t j = first; j < first + width; ++j) {
        T& target = to[index[base + j] * inner + j];
        target = combine(target, in[base + j]);
      }
    }
  });
}

}  // namespace

int64_t scatter_add(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
                    int64_t count, void* out, const void* in) {
  check_sizes("scatter_add", outer, extent, inner, count);
  const int64_t n = outer * count * inner;
  if (const int64_t bad = first_bad_index(index, n, extent); bad >= 0) return bad;
  if (n == 0) return -1;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    scatter_slices(outer, extent, inner, index, count, static_cast<T*>(out),
                   static_cast<const T*>(in),
                   [](T current, T value) { return add(current, value); });
  });
  return -1;
}

namespace {

// The reductions scatter_reduce takes, for the dtypes it takes; false for any other dtype.
template <typename Fn>
bool visit_reducible(DType dtype, Fn fn) {
  bool taken = false;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> ||
                  std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>) {
      fn(tag);
      taken = true;
    }
  });
  return taken;
}

}  // namespace

int64_t scatter_reduce(ScatterReduceOp op, DType dtype, int64_t outer, int64_t extent,
                       int64_t inner, const int64_t* index, int64_t count, void* out,
                       const void* in) {
  check_sizes("scatter_reduce", outer, extent, inner, count);
  const int64_t n = outer * count * inner;
  if (const int64_t bad = first_bad_index(index, n, extent); bad >= 0) return bad;
  if (n == 0) return -1;
  const bool taken = visit_reducible(dtype, [&](auto tag) {
    using T = decltype(tag);
    const auto run = [&](auto combine) {
      scatter_slices(outer, extent, inner, index, count, static_cast<T*>(out),
                     static_cast<const T*>(in), combine);
    };
    // The op is chosen once, outside the element loop.
    switch (op) {
      case ScatterReduceOp::Mul:
        if constexpr (std::is_integral_v<T>) {
          run([](T current, T value) { return wrap_mul(current, value); });
        } else {
          run([](T current, T value) { return current * value; });
        }
        break;
      case ScatterReduceOp::Max:
        run([](T current, T value) { return value > current ? value : current; });
        break;
      case ScatterReduceOp::Min:
        run([](T current, T value) { return value < current ? value : current; });
        break;
    }
  });
  if (!taken) throw_unsupported("scatter_reduce", "", dtype);
  return -1;
}

void scatter_winner(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
                    int64_t count, const void* out, const void* base, const void* in,
                    int64_t* winner) {
  check_sizes("scatter_winner", outer, extent, inner, count);
  const bool taken = visit_reducible(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* result = static_cast<const T*>(out);
    const T* before = static_cast<const T*>(base);
    const T* src = static_cast<const T*>(in);
    for_each_slice(outer, inner, count, [&](int64_t o, int64_t first, int64_t width) {
      for (int64_t i = 0; i < count; ++i) {
        const int64_t p0 = (o * count + i) * inner;
        for (int64_t j = first; j < first + width; ++j) {
          const int64_t at = (o * extent + index[p0 + j]) * inner + j;
          if (p0 + j < winner[at] && src[p0 + j] == result[at] && !(before[at] == result[at]))
            winner[at] = p0 + j;
        }
      }
    });
  });
  if (!taken) throw_unsupported("scatter_winner", "", dtype);
}

}  // namespace mpigrad::kernels::cpu
