// The blocked paths of a same-dtype strided copy (kernels/cpu/transpose.h): batched transposes
// in cache tiles, and rows by memcpy.
//
// Layout: the loop is coalesced (kernels::coalesced) first, so a permute that keeps groups of
// dims together, NCHW -> NHWC for one, is one [N, C, H*W] -> [N, H*W, C] transpose. Dim p is the
// one along which the input is contiguous and dim q the one along which the output is; when they
// differ, every other dim is a batch and each batch entry is a 2-d transpose
//     out[x * out_ld + y] = in[y * in_ld + x],   x < X = size[p], y < Y = size[q].
// It is cut into strips of kBlock values of x, each walked down y in kBlock x kBlock tiles: a
// tile reads kBlock runs of kBlock contiguous inputs and writes kBlock runs of kBlock contiguous
// outputs, so both sides use whole cache lines (16 floats are 64 bytes) where the element walk
// reads one element of each line it touches and comes back for the next one much later.
// Inside a tile, SSE2 transposes 4x4 words of 4 bytes, 8x8 of 2 bytes and 2x2 of 8 bytes in
// registers (the x86-64 baseline, so no dispatch); 1-byte and 16-byte words move one at a time.
// Rows shorter than kMinRowBytes along the last dim move as words of their own size
// (short_copy.h), the dim next to them walked as a plain loop.
// Threading: strips (times batch entries) are split across OpenMP threads, rows likewise.
// Every path writes with `=`, and moves words, never values, so the copy is exact.
#include "mpigrad/kernels/cpu/transpose.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "mpigrad/kernels/cpu/parallel.h"
#include "mpigrad/kernels/cpu/short_copy.h"

namespace mpigrad::kernels::cpu {
namespace {

// Tile side in elements.
constexpr int64_t kBlock = 16;

// A 16-byte element: a row of two to eight narrower ones that a permute keeps together.
struct Word16 {
  uint64_t low, high;
};

// The dims of a walk other than the transposed (or copied) ones, walked in row-major order, with
// the element offsets of both operands at the current index.
struct Odometer {
  int ndim = 0;
  int64_t size[kMaxDims] = {};
  int64_t stride[2][kMaxDims] = {};
  int64_t index[kMaxDims] = {};
  int64_t offset[2] = {};

  int64_t count() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= size[d];
    return n;
  }
  void seek(int64_t position) {
    offset[0] = offset[1] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      index[d] = position % size[d];
      position /= size[d];
      offset[0] += index[d] * stride[0][d];
      offset[1] += index[d] * stride[1][d];
    }
  }
  void next() {
    for (int d = ndim - 1; d >= 0; --d) {
      ++index[d];
      offset[0] += stride[0][d];
      offset[1] += stride[1][d];
      if (index[d] < size[d]) return;
      offset[0] -= size[d] * stride[0][d];
      offset[1] -= size[d] * stride[1][d];
      index[d] = 0;
    }
  }
};

// The walk without dims `skip_a` and `skip_b` (which may be the same dim).
Odometer outer_dims(const StridedLoop& walk, int skip_a, int skip_b) {
  Odometer outer;
  for (int d = 0; d < walk.ndim; ++d) {
    if (d == skip_a || d == skip_b) continue;
    outer.size[outer.ndim] = walk.size[d];
    outer.stride[0][outer.ndim] = walk.stride[0][d];
    outer.stride[1][outer.ndim] = walk.stride[1][d];
    ++outer.ndim;
  }
  return outer;
}

// ---------------------------------------------------------------------------------------------
// Tiles

// dst[x * dst_ld + y] = src[y * src_ld + x] for y < rows, x < cols, one word at a time. By
// memcpy, a plain load and store: a word widened from a row of narrower elements (8 or 16
// bytes from floats) need not be aligned to its own size.
template <typename Word>
void transpose_words(const Word* src, int64_t src_ld, Word* dst, int64_t dst_ld, int64_t rows,
                     int64_t cols) {
  for (int64_t x = 0; x < cols; ++x) {
    for (int64_t y = 0; y < rows; ++y) {
      std::memcpy(dst + x * dst_ld + y, src + y * src_ld + x, sizeof(Word));
    }
  }
}

// The register transpose of an M x M block of words, M = kMicro<Word> (1: none).
template <typename Word>
constexpr int64_t kMicro = 1;

#if defined(__SSE2__)
template <>
constexpr int64_t kMicro<uint16_t> = 8;
template <>
constexpr int64_t kMicro<uint32_t> = 4;
template <>
constexpr int64_t kMicro<uint64_t> = 2;

inline __m128i load(const void* p) {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}
inline void store(void* p, __m128i v) {
  _mm_storeu_si128(static_cast<__m128i*>(p), v);
}

// Interleaving pairs of rows at 2, 4, then 8 bytes turns rows into columns.
inline void micro(const uint16_t* src, int64_t src_ld, uint16_t* dst, int64_t dst_ld) {
  __m128i r[8], a[8], b[8];
  for (int i = 0; i < 8; ++i) r[i] = load(src + i * src_ld);
  for (int i = 0; i < 8; i += 2) {
    a[i] = _mm_unpacklo_epi16(r[i], r[i + 1]);
    a[i + 1] = _mm_unpackhi_epi16(r[i], r[i + 1]);
  }
  // a[2j] holds columns 0-3 of rows 2j and 2j+1, a[2j+1] columns 4-7.
  for (int half = 0; half < 2; ++half) {
    for (int quad = 0; quad < 2; ++quad) {
      const int i = 4 * quad + half;  // rows 0-3 then rows 4-7, columns 0-3 then 4-7
      b[4 * half + 2 * quad] = _mm_unpacklo_epi32(a[i], a[i + 2]);
      b[4 * half + 2 * quad + 1] = _mm_unpackhi_epi32(a[i], a[i + 2]);
    }
  }
  // b[4h + 2q + k] holds columns 4h + 2k and 4h + 2k + 1 of rows 4q to 4q + 3.
  for (int half = 0; half < 2; ++half) {
    for (int k = 0; k < 2; ++k) {
      const __m128i top = b[4 * half + k], bottom = b[4 * half + 2 + k];
      const int64_t column = 4 * half + 2 * k;
      store(dst + column * dst_ld, _mm_unpacklo_epi64(top, bottom));
      store(dst + (column + 1) * dst_ld, _mm_unpackhi_epi64(top, bottom));
    }
  }
}

inline void micro(const uint32_t* src, int64_t src_ld, uint32_t* dst, int64_t dst_ld) {
  const __m128i r0 = load(src), r1 = load(src + src_ld);
  const __m128i r2 = load(src + 2 * src_ld), r3 = load(src + 3 * src_ld);
  const __m128i a0 = _mm_unpacklo_epi32(r0, r1), a1 = _mm_unpackhi_epi32(r0, r1);
  const __m128i a2 = _mm_unpacklo_epi32(r2, r3), a3 = _mm_unpackhi_epi32(r2, r3);
  store(dst, _mm_unpacklo_epi64(a0, a2));
  store(dst + dst_ld, _mm_unpackhi_epi64(a0, a2));
  store(dst + 2 * dst_ld, _mm_unpacklo_epi64(a1, a3));
  store(dst + 3 * dst_ld, _mm_unpackhi_epi64(a1, a3));
}

inline void micro(const uint64_t* src, int64_t src_ld, uint64_t* dst, int64_t dst_ld) {
  const __m128i r0 = load(src), r1 = load(src + src_ld);
  store(dst, _mm_unpacklo_epi64(r0, r1));
  store(dst + dst_ld, _mm_unpackhi_epi64(r0, r1));
}
#endif

// One tile of rows x cols (each at most kBlock): register blocks where they fit, words at the
// right and bottom edges.
template <typename Word>
void transpose_tile(const Word* src, int64_t src_ld, Word* dst, int64_t dst_ld, int64_t rows,
                    int64_t cols) {
  constexpr int64_t m = kMicro<Word>;
  if constexpr (m == 1) {
    transpose_words(src, src_ld, dst, dst_ld, rows, cols);
  } else {
    const int64_t full_rows = rows - rows % m, full_cols = cols - cols % m;
    for (int64_t y = 0; y < full_rows; y += m) {
      for (int64_t x = 0; x < full_cols; x += m) {
        micro(src + y * src_ld + x, src_ld, dst + x * dst_ld + y, dst_ld);
      }
    }
    transpose_words(src + full_cols, src_ld, dst + full_cols * dst_ld, dst_ld, rows,
                    cols - full_cols);
    transpose_words(src + full_rows * src_ld, src_ld, dst + full_rows, dst_ld, rows - full_rows,
                    full_cols);
  }
}

// A batch of transposes: p is the input's unit-stride dim, q the output's.
template <typename Word>
void copy_transposed(const StridedLoop& walk, int p, int q, Word* out, const Word* in) {
  const int64_t xs = walk.size[p], ys = walk.size[q];
  const int64_t in_ld = walk.stride[1][q], out_ld = walk.stride[0][p];
  const Odometer batch = outer_dims(walk, p, q);
  const int64_t strips = (xs + kBlock - 1) / kBlock;
  const int64_t units = batch.count() * strips;
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / (kBlock * ys));
  parallel_for(0, units, grain, [&](int64_t begin, int64_t end) {
    Odometer entry = batch;
    entry.seek(begin / strips);
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t strip = unit % strips;
      if (strip == 0 && unit != begin) entry.next();
      const int64_t x0 = strip * kBlock, cols = std::min(kBlock, xs - x0);
      const Word* src = in + entry.offset[1] + x0;
      Word* dst = out + entry.offset[0] + x0 * out_ld;
      for (int64_t y0 = 0; y0 < ys; y0 += kBlock) {
        transpose_tile(src + y0 * in_ld, in_ld, dst + y0, out_ld, std::min(kBlock, ys - y0), cols);
      }
    }
  });
}

// Rows along dim p, contiguous on both sides.
void copy_rows(const StridedLoop& walk, int p, int element_size, char* out, const char* in) {
  const Odometer rows = outer_dims(walk, p, p);
  const int64_t row_bytes = walk.size[p] * element_size;
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain * 4 / row_bytes);
  parallel_for(0, rows.count(), grain, [&](int64_t begin, int64_t end) {
    Odometer row = rows;
    row.seek(begin);
    for (int64_t r = begin; r < end; ++r, row.next()) {
      std::memcpy(out + row.offset[0] * element_size, in + row.offset[1] * element_size,
                  size_t(row_bytes));
    }
  });
}

// Rows along the last dim, contiguous on both sides but shorter than kMinRowBytes (a conv weight
// narrowed to its used taps, rows of 2 floats 12 bytes apart): each row moves by fixed-size loads
// and stores, kBytes of them (0: any size below kMinRowBytes, by copy_short's branches), the two
// dims outside it walked as plain loops. The element walk spent about 4 ns a row on its carries and
// a loop call for [512, 512, 2, 2] of a [512, 512, 3, 3] weight.
template <size_t kBytes>
void copy_short_rows(const StridedLoop& walk, int element_size, char* out, const char* in) {
  // Blocks along dim r of `rows` rows along dim q; a 2-d walk is blocks of one row, so that its
  // rows still split across threads.
  const int p = walk.ndim - 1, q = walk.ndim > 2 ? p - 1 : -1, r = walk.ndim > 2 ? p - 2 : p - 1;
  const size_t row_bytes = size_t(walk.size[p] * element_size);
  const int64_t rows = q >= 0 ? walk.size[q] : 1, blocks = walk.size[r];
  const int64_t out_row = q >= 0 ? walk.stride[0][q] * element_size : 0;
  const int64_t in_row = q >= 0 ? walk.stride[1][q] * element_size : 0;
  const int64_t out_block = walk.stride[0][r] * element_size;
  const int64_t in_block = walk.stride[1][r] * element_size;
  Odometer groups;  // the dims outside r
  for (int d = 0; d < r; ++d) {
    groups.size[groups.ndim] = walk.size[d];
    groups.stride[0][groups.ndim] = walk.stride[0][d];
    groups.stride[1][groups.ndim] = walk.stride[1][d];
    ++groups.ndim;
  }
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain * 4 / int64_t(row_bytes) / rows);
  parallel_for(0, groups.count() * blocks, grain, [&](int64_t begin, int64_t end) {
    Odometer group = groups;
    group.seek(begin / blocks);
    int64_t b = begin % blocks;
    for (int64_t at = begin; at < end; group.next()) {
      const int64_t n = std::min(blocks - b, end - at);
      char* dst = out + group.offset[0] * element_size + b * out_block;
      const char* src = in + group.offset[1] * element_size + b * in_block;
      for (int64_t k = 0; k < n; ++k, dst += out_block, src += in_block) {
        for (int64_t j = 0; j < rows; ++j) {
          if constexpr (kBytes > 0) {
            std::memcpy(dst + j * out_row, src + j * in_row, kBytes);
          } else {
            copy_short(dst + j * out_row, src + j * in_row, row_bytes);
          }
        }
      }
      at += n;
      b = 0;
    }
  });
}

void copy_short_rows(const StridedLoop& walk, int element_size, char* out, const char* in) {
  switch (walk.size[walk.ndim - 1] * element_size) {
    case 4:
      return copy_short_rows<4>(walk, element_size, out, in);
    case 8:
      return copy_short_rows<8>(walk, element_size, out, in);
    case 12:
      return copy_short_rows<12>(walk, element_size, out, in);
    case 16:
      return copy_short_rows<16>(walk, element_size, out, in);
    default:
      return copy_short_rows<0>(walk, element_size, out, in);
  }
}

// `walk` with its dim p, contiguous on both sides, folded into the element: every other stride
// must be a whole number of rows.
bool widen(const StridedLoop& walk, int p, StridedLoop& wide) {
  const int64_t row = walk.size[p];
  wide = StridedLoop{};
  for (int d = 0; d < walk.ndim; ++d) {
    if (d == p) continue;
    if (walk.stride[0][d] % row != 0 || walk.stride[1][d] % row != 0) return false;
    wide.size[wide.ndim] = walk.size[d];
    wide.stride[0][wide.ndim] = walk.stride[0][d] / row;
    wide.stride[1][wide.ndim] = walk.stride[1][d] / row;
    ++wide.ndim;
  }
  return wide.ndim > 0;
}

// The innermost dim with unit stride for `operand`, or -1.
int unit_dim(const StridedLoop& walk, int operand) {
  for (int d = walk.ndim - 1; d >= 0; --d) {
    if (walk.stride[operand][d] == 1) return d;
  }
  return -1;
}

template <typename Word>
void run_transposed(const StridedLoop& walk, int p, int q, void* out, const void* in) {
  copy_transposed(walk, p, q, static_cast<Word*>(out), static_cast<const Word*>(in));
}

bool copy_walk(int element_size, const StridedLoop& walk, void* out, const void* in) {
  const int q = unit_dim(walk, 0), p = unit_dim(walk, 1);
  if (p < 0 || q < 0) return false;
  if (p != q) {
    switch (element_size) {
      case 1:
        run_transposed<uint8_t>(walk, p, q, out, in);
        return true;
      case 2:
        run_transposed<uint16_t>(walk, p, q, out, in);
        return true;
      case 4:
        run_transposed<uint32_t>(walk, p, q, out, in);
        return true;
      case 8:
        run_transposed<uint64_t>(walk, p, q, out, in);
        return true;
      case 16:
        run_transposed<Word16>(walk, p, q, out, in);
        return true;
      default:
        return false;
    }
  }
  const int64_t row_bytes = walk.size[p] * element_size;
  StridedLoop wide;
  if ((row_bytes == 8 || row_bytes == 16) && element_size < row_bytes && widen(walk, p, wide)) {
    return copy_walk(int(row_bytes), wide, out, in);
  }
  if (walk.ndim == 1) return false;  // one row: the dense memcpy's
  if (row_bytes < kMinRowBytes) {
    if (p != walk.ndim - 1) return false;
    copy_short_rows(walk, element_size, static_cast<char*>(out), static_cast<const char*>(in));
    return true;
  }
  copy_rows(walk, p, element_size, static_cast<char*>(out), static_cast<const char*>(in));
  return true;
}

}  // namespace

bool copy_blocked(int element_size, const StridedLoop& loop, void* out, const void* in) {
  if (loop.numel() <= 1) return false;
  return copy_walk(element_size, coalesced(loop, 2), out, in);
}

}  // namespace mpigrad::kernels::cpu
