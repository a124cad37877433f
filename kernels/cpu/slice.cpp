// The gradient of a slice in one pass (kernels/slice.h).
//
// Layout: out is dense [outer, extent, inner], a run of outer rows of extent * inner elements;
// grad is dense [outer, count, inner]. The output is cut into tiles of kTileBytes, walked in
// order. A tile is zeroed by one memset while it is in L1, then the window's entries that fall in
// it are copied over the zeros, a row at a time, so every cache line of out is brought in and
// written back once (zeros() and a strided copy bring each back twice). Where the window is one
// long run of a row (step 1 and at least kDenseWindowBytes), the tile is not zeroed first: each
// row is written as memset, memcpy, memset around the window instead.
// Threading: pieces of the flat output range go to OpenMP threads (parallel_for_balanced), each
// walking its own tiles; rows may straddle pieces and tiles.
// Writes with `=`; words move as bits, never as values.
#include "mpigrad/kernels/slice.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "mpigrad/kernels/cpu/parallel.h"
#include "mpigrad/kernels/cpu/short_copy.h"

namespace mpigrad::kernels::cpu {
namespace {

// Output bytes zeroed and filled together: half of the 32 KB L1 data cache, leaving the rest to
// the rows of grad being read.
constexpr int64_t kTileBytes = 16384;

// A row's window (step 1) at least this long is written around, not over zeros: below it the
// three calls of memset, memcpy, memset cost more than writing the window's bytes twice in L1.
constexpr int64_t kDenseWindowBytes = 256;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

template <typename Word>
void copy_words(Word* out, const Word* in, int64_t n) {
  copy_short(out, in, size_t(n) * sizeof(Word));
}

// Element range [first, last) of one row, already zeroed: the window's entries that meet it.
template <typename Word>
void scatter_part(const SliceWindow& w, int64_t first, int64_t last, Word* out_row,
                  const Word* grad_row) {
  const int64_t position_first = first / w.inner, position_last = (last - 1) / w.inner + 1;
  const int64_t k_first =
      position_first <= w.start ? 0 : ceil_div(position_first - w.start, w.step);
  const int64_t k_last =
      position_last <= w.start ? 0 : std::min(w.count, ceil_div(position_last - w.start, w.step));
  for (int64_t k = k_first; k < k_last; ++k) {
    const int64_t at = (w.start + k * w.step) * w.inner;
    const int64_t from = std::max(at, first), to = std::min(at + w.inner, last);
    copy_words(out_row + from, grad_row + k * w.inner + (from - at), to - from);
  }
}

// `rows` whole rows, already zeroed: the window's entries of each. The loops for inner == 1 are
// apart so that the common shape (a conv weight's used taps: one element a row) is a plain
// strided store loop; runs of a few elements move without a call (short_copy.h).
template <typename Word>
void scatter_rows(const SliceWindow& w, int64_t rows, Word* out, const Word* grad) {
  const int64_t row = w.extent * w.inner, grad_row = w.count * w.inner;
  Word* target = out + w.start * w.inner;
  if (w.inner == 1 && w.count == 1) {
    for (int64_t r = 0; r < rows; ++r) target[r * row] = grad[r];
  } else if (w.inner == 1) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < w.count; ++k) target[r * row + k * w.step] = grad[r * grad_row + k];
    }
  } else if (w.step == 1) {
    // The window is one run of each row.
    for (int64_t r = 0; r < rows; ++r) copy_words(target + r * row, grad + r * grad_row, grad_row);
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < w.count; ++k) {
        copy_words(target + r * row + k * w.step * w.inner, grad + r * grad_row + k * w.inner,
                   w.inner);
      }
    }
  }
}

// Output elements [begin, end), at most one tile.
template <typename Word>
void write_tile(const SliceWindow& w, int64_t begin, int64_t end, Word* out, const Word* grad) {
  const int64_t row = w.extent * w.inner, grad_row = w.count * w.inner;
  const int64_t window_first = w.start * w.inner, window_last = (w.start + w.count) * w.inner;
  const bool dense_window =
      w.step == 1 && (window_last - window_first) * int64_t(sizeof(Word)) >= kDenseWindowBytes;
  if (!dense_window) std::memset(out + begin, 0, size_t(end - begin) * sizeof(Word));
  int64_t o = begin / row;
  int64_t row_begin = o * row;
  while (row_begin < end) {
    const int64_t first = std::max<int64_t>(begin - row_begin, 0);
    const int64_t last = std::min(end - row_begin, row);
    Word* out_row = out + row_begin;
    const Word* grad_at = grad + o * grad_row;
    if (dense_window) {
      const int64_t copy_first = std::clamp(window_first, first, last);
      const int64_t copy_last = std::clamp(window_last, first, last);
      std::memset(out_row + first, 0, size_t(copy_first - first) * sizeof(Word));
      std::memcpy(out_row + copy_first, grad_at + (copy_first - window_first),
                  size_t(copy_last - copy_first) * sizeof(Word));
      std::memset(out_row + copy_last, 0, size_t(last - copy_last) * sizeof(Word));
    } else if (first == 0 && last == row) {
      // Every whole row from here on in one loop.
      const int64_t rows = (end - row_begin) / row;
      scatter_rows(w, rows, out_row, grad_at);
      o += rows;
      row_begin += rows * row;
      continue;
    } else {
      scatter_part(w, first, last, out_row, grad_at);
    }
    ++o;
    row_begin += row;
  }
}

template <typename Word>
void run(const SliceWindow& w, void* out_bytes, const void* grad_bytes) {
  auto* out = static_cast<Word*>(out_bytes);
  const auto* grad = static_cast<const Word*>(grad_bytes);
  const int64_t total = w.outer * w.extent * w.inner;
  constexpr int64_t tile = kTileBytes / int64_t(sizeof(Word));
  parallel_for_balanced(0, total, kElementwiseGrain, kBalancedPiece,
                        [&](int64_t begin, int64_t end) {
                          for (int64_t at = begin; at < end; at += tile) {
                            write_tile(w, at, std::min(end, at + tile), out, grad);
                          }
                        });
}

}  // namespace

void slice_backward(int element_size, const SliceWindow& w, void* out, const void* grad) {
  const bool valid = w.outer >= 0 && w.extent >= 0 && w.inner >= 0 && w.start >= 0 && w.step >= 1 &&
                     w.count >= 0 && (w.count == 0 || w.start + (w.count - 1) * w.step < w.extent);
  if (!valid) {
    throw std::invalid_argument(
        "slice_backward: window start " + std::to_string(w.start) + ", step " +
        std::to_string(w.step) + ", count " + std::to_string(w.count) +
        " does not fit [outer, extent, inner] = [" + std::to_string(w.outer) + ", " +
        std::to_string(w.extent) + ", " + std::to_string(w.inner) + "]");
  }
  if (w.outer * w.extent * w.inner == 0) return;
  switch (element_size) {
    case 1:
      return run<uint8_t>(w, out, grad);
    case 2:
      return run<uint16_t>(w, out, grad);
    case 4:
      return run<uint32_t>(w, out, grad);
    case 8:
      return run<uint64_t>(w, out, grad);
    default:
      throw std::invalid_argument("slice_backward: element size " + std::to_string(element_size) +
                                  " is not 1, 2, 4 or 8 bytes");
  }
}

}  // namespace mpigrad::kernels::cpu
