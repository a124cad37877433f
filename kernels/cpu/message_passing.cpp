// CPU gather_mul_scatter (kernels/message_passing.h): out[target[e]] (+)= a[a_index[e]] *
// b[b_index[e]], row by row.
//
// Layout: dense row-major [rows, width] operands, int64 indices; a null index is e itself.
// With a target the products are added (`+=`) into out, which the caller cleared; without one
// they are written (`=`) to out's row e.
// Threading: without a target, edges are split among threads (each writes its own rows). With
// one, several edges may land on one row, so threads own column tiles of at least 16 elements
// instead: each visits every edge, in order, for its columns only.
#include "mpigrad/kernels/message_passing.h"

#include <algorithm>
#include <type_traits>

#include "mpigrad/kernels/cpu/parallel.h"
#include "mpigrad/kernels/cpu/scalar.h"

namespace mpigrad::kernels::cpu {
namespace {

constexpr int64_t kMinTile = 16;  // columns a thread owns at least (one 64-byte line of floats)

// The first e whose index is outside [0, rows), or -1; a null index is always in range.
int64_t first_bad(const int64_t* index, int64_t edges, int64_t rows) {
  if (index == nullptr) return -1;
  for (int64_t e = 0; e < edges; ++e) {
    if (uint64_t(index[e]) >= uint64_t(rows)) return e;
  }
  return -1;
}

template <typename T, bool kAccumulate>
void product_rows(const GatherMulScatterArgs& args, int64_t first_edge, int64_t last_edge,
                  int64_t first_column, int64_t columns) {
  const int64_t width = args.width;
  const T* a = static_cast<const T*>(args.a);
  const T* b = static_cast<const T*>(args.b);
  T* out = static_cast<T*>(args.out);
  for (int64_t e = first_edge; e < last_edge; ++e) {
    const int64_t ra = args.a_index ? args.a_index[e] : e;
    const int64_t rb = args.b_index ? args.b_index[e] : e;
    const int64_t ro = args.target ? args.target[e] : e;
    const T* __restrict x = a + ra * width + first_column;
    const T* __restrict y = b + rb * width + first_column;
    T* __restrict to = out + ro * width + first_column;
    if constexpr (kAccumulate) {
      for (int64_t j = 0; j < columns; ++j) to[j] += x[j] * y[j];
    } else {
      for (int64_t j = 0; j < columns; ++j) to[j] = x[j] * y[j];
    }
  }
}

template <typename T>
void run(const GatherMulScatterArgs& args) {
  const int64_t edges = args.edges, width = args.width;
  if (args.target == nullptr) {
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / width);
    parallel_for(0, edges, grain, [&](int64_t begin, int64_t end) {
      product_rows<T, false>(args, begin, end, 0, width);
    });
    return;
  }
  const int64_t threads = std::max<int64_t>(1, max_threads());
  int64_t tile = std::max<int64_t>(kMinTile, (width + threads - 1) / threads);
  tile = (tile + kMinTile - 1) / kMinTile * kMinTile;
  const int64_t tiles = (width + tile - 1) / tile;
  const int64_t grain =
      std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(1, edges * tile));
  parallel_for(0, tiles, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t first = t * tile;
      product_rows<T, true>(args, 0, edges, first, std::min(tile, width - first));
    }
  });
}

}  // namespace

int64_t gather_mul_scatter(DType dtype, const GatherMulScatterArgs& args) {
  if (args.edges < 0 || args.width < 0 || args.a_rows < 0 || args.b_rows < 0 || args.out_rows < 0) {
    throw_invalid("gather_mul_scatter", "negative size");
  }
  if (args.a_index == nullptr && args.a_rows != args.edges) {
    throw_invalid("gather_mul_scatter", "a has no index but not one row per edge");
  }
  if (args.b_index == nullptr && args.b_rows != args.edges) {
    throw_invalid("gather_mul_scatter", "b has no index but not one row per edge");
  }
  const int64_t out_rows = args.target ? args.out_rows : args.edges;
  if (const int64_t bad = first_bad(args.a_index, args.edges, args.a_rows); bad >= 0) return bad;
  if (const int64_t bad = first_bad(args.b_index, args.edges, args.b_rows); bad >= 0) {
    return args.edges + bad;
  }
  if (const int64_t bad = first_bad(args.target, args.edges, out_rows); bad >= 0) {
    return 2 * args.edges + bad;
  }
  if (args.edges == 0 || args.width == 0) return -1;
  bool taken = false;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      run<T>(args);
      taken = true;
    }
  });
  if (!taken) throw_unsupported("gather_mul_scatter", "", dtype);
  return -1;
}

}  // namespace mpigrad::kernels::cpu
