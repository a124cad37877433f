// Convolution weights between plain [out, in, kh, kw] and oneDNN's blocked layouts
// (conv_weight_layout.h): Float32 OIhw16i16o, and BFloat16's pair layouts (see the pairs' tiles
// below).
//
// Tile (ob, ib) of a weight with `taps` = kh*kw: plain rows o = 0..15 at
// plain + (ob*16 + o) * in * taps + ib * 16 * taps, each 16 * taps floats indexed j = i * taps + t;
// blocked block of (ob, ib) at blocked + (ob * in/16 + ib) * taps * 256, float (t*16 + i)*16 + o.
// So column j of the tile's [16 o][16 * taps j] matrix is blocked line t*16 + i: taps 16x16
// transposes, chunk c taking columns 16c .. 16c + 15.
#include "mpigrad/kernels/cpu/conv_weight_layout.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "mpigrad/kernels/cpu/parallel.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MPIGRAD_HAS_AVX512_LAYOUT 1
#define MPIGRAD_AVX512F __attribute__((target("avx512f")))
#endif

namespace mpigrad::kernels::cpu {
namespace {

// Tiles per thread at least: about 256 KB of weight, below which waking a second thread costs
// more than the copy.
constexpr int64_t kTileGrainBytes = int64_t(256) << 10;

// Plain weights from this size on are written with non-temporal stores (weights_from_blocked).
constexpr int64_t kStreamBytes = int64_t(1) << 20;

#if defined(MPIGRAD_HAS_AVX512_LAYOUT)

// GCC 12 warns inside its own AVX-512 unpack intrinsics (maybe- or plainly uninitialized, by how
// they are inlined), whose masked form takes an undefined pass-through register
// (_mm512_undefined_ps) that the full mask never reads.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// Transposes the 16x16 matrix whose rows are r[0..15]: row c of the result is column c.
MPIGRAD_AVX512F inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: [a0 b0 a1 b1], [a2 b2 a3 b3]
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // lane L of r[4i + j]: rows 4i .. 4i+3 of column 4L + j
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int j = 0; j < 4; ++j) {  // gather the four row groups' lanes: 0x88 lanes 0 and 2, 0xDD 1, 3
    t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
    t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);
    t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD);
    r[4 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88);
    r[12 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xDD);
  }
}

// One tile, plain rows `row_stride` floats apart <-> its blocked taps*256 floats. kStream writes
// the plain rows with non-temporal stores (every store a whole, 64-byte aligned line).
template <bool kToBlocked, bool kStream = false>
MPIGRAD_AVX512F void copy_tile(int64_t taps, int64_t row_stride, float* plain, float* blocked) {
  __m512 r[16];
  for (int64_t chunk = 0; chunk < taps; ++chunk) {
    const int64_t first = chunk * 16;
    if constexpr (kToBlocked) {
      for (int o = 0; o < 16; ++o) r[o] = _mm512_loadu_ps(plain + o * row_stride + first);
      transpose16(r);
      for (int c = 0; c < 16; ++c) {
        const int64_t j = first + c;
        _mm512_storeu_ps(blocked + ((j % taps) * 16 + j / taps) * 16, r[c]);
      }
    } else {
      for (int c = 0; c < 16; ++c) {
        const int64_t j = first + c;
        r[c] = _mm512_loadu_ps(blocked + ((j % taps) * 16 + j / taps) * 16);
      }
      transpose16(r);
      for (int o = 0; o < 16; ++o) {
        if constexpr (kStream) {
          _mm512_stream_ps(plain + o * row_stride + first, r[o]);
        } else {
          _mm512_storeu_ps(plain + o * row_stride + first, r[o]);
        }
      }
    }
  }
}

template <bool kToBlocked, bool kStream = false>
void copy_weights(int64_t out, int64_t in, int64_t taps, float* plain, float* blocked) {
  const int64_t in_blocks = in / 16, tiles = (out / 16) * in_blocks;
  const int64_t tile_bytes = taps * 256 * int64_t(sizeof(float));
  const int64_t grain = std::max<int64_t>(1, kTileGrainBytes / std::max<int64_t>(1, tile_bytes));
  // Pieces of a grain, taken in turn, so threads that copy at different speeds (the copy runs at
  // memory speed) finish together; parallel_for_balanced splits a weight of few pieces evenly.
  parallel_for_balanced(0, tiles, grain, grain, [&](int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t ob = tile / in_blocks, ib = tile % in_blocks;
      copy_tile<kToBlocked, kStream>(taps, in * taps, plain + (ob * 16 * in + ib * 16) * taps,
                                     blocked + tile * taps * 256);
    }
    if constexpr (kStream) _mm_sfence();  // the streamed lines are visible before the join
  });
}

// BFloat16 pairs as 32-bit units (conv_weight_layout.h); `tile` is the blocked tile's first
// element, taps * 256 of them.
//
// 1x1, InPairs: the tile's row o holds 8 units (pairs of in) that the layout wants column by
// column: a 16x8 transpose of units, made two tiles at a time with transpose16 (the units moved
// as float bit patterns, no arithmetic), whose columns 0-7 and 8-15 land on the two tiles,
// adjacent in the blocked weight. An odd last tile loads half rows.
MPIGRAD_AVX512F void in_pairs_tiles(int64_t in, int64_t ob, int64_t ib, int64_t count,
                                    const uint16_t* plain, uint16_t* blocked) {
  const __mmask16 half = count == 2 ? __mmask16(0xFFFF) : __mmask16(0x00FF);
  __m512 r[16];
  for (int o = 0; o < 16; ++o) {
    const uint16_t* row = plain + (ob * 16 + o) * in + ib * 16;
    r[o] = _mm512_maskz_loadu_ps(half, reinterpret_cast<const float*>(row));
  }
  transpose16(r);
  float* units = reinterpret_cast<float*>(blocked + (ob * (in / 16) + ib) * 256);
  for (int c = 0; c < 8 * count; ++c) _mm512_storeu_ps(units + c * 16, r[c]);
}

// 1x1, pairs of out: unit (k, i) pairs rows 2k and 2k+1 at column i: each row of 16 widened to
// 32-bit lanes, the odd row shifted into the high halves.
MPIGRAD_AVX512F void out_pairs_tile(int64_t in, int64_t ob, int64_t ib, const uint16_t* plain,
                                    uint16_t* tile) {
  for (int k = 0; k < 8; ++k) {
    const uint16_t* even = plain + (ob * 16 + 2 * k) * in + ib * 16;
    const __m512i low =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(even)));
    const __m512i high =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(even + in)));
    _mm512_storeu_si512(tile + k * 32, _mm512_or_si512(low, _mm512_slli_epi32(high, 16)));
  }
}

// Several taps: the tile's 16 plain rows (16 * taps elements each, `row_stride` apart) widened to
// 32-bit units in `wide`, copy_tile's transposes turn them into `lines`, line t*16 + i holding
// S_t[o][i] = plain (o, i, t) in lane o, and each tap's pairs come from its 16 lines: of in, two
// lines joined lane by lane; of out, each line narrowed to its 8 pairs, and a transpose.
MPIGRAD_AVX512F void pairs_tile_taps(Bf16PairLayout layout, int64_t taps, int64_t row_stride,
                                     const uint16_t* plain, uint16_t* tile, float* wide,
                                     float* lines) {
  const int64_t row = 16 * taps;
  for (int o = 0; o < 16; ++o) {
    for (int64_t j = 0; j < row; j += 16) {
      const __m256i narrow =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(plain + o * row_stride + j));
      _mm512_storeu_si512(wide + o * row + j, _mm512_cvtepu16_epi32(narrow));
    }
  }
  copy_tile<true>(taps, row, wide, lines);
  for (int64_t t = 0; t < taps; ++t) {
    const float* line = lines + t * 256;
    uint16_t* out = tile + t * 256;
    if (layout == Bf16PairLayout::InPairs) {
      for (int k = 0; k < 8; ++k) {  // unit (k, o): S_t[o][2k], S_t[o][2k + 1]
        const __m512i even = _mm512_loadu_si512(line + 2 * k * 16);
        const __m512i odd = _mm512_loadu_si512(line + (2 * k + 1) * 16);
        _mm512_storeu_si512(out + k * 32, _mm512_or_si512(even, _mm512_slli_epi32(odd, 16)));
      }
    } else {
      __m512 r[16];  // r[i]: S_t[0..15][i] as 16 bf16, units k = 0..7 of column i
      for (int i = 0; i < 16; ++i) {
        const __m256i narrow = _mm512_cvtepi32_epi16(_mm512_loadu_si512(line + i * 16));
        r[i] = _mm512_zextps256_ps512(_mm256_castsi256_ps(narrow));
      }
      transpose16(r);
      for (int k = 0; k < 8; ++k) _mm512_storeu_ps(reinterpret_cast<float*>(out + k * 32), r[k]);
    }
  }
}

// Runs tile(first, count) over all tiles of the weight, threads sharing them as copy_weights does.
template <typename Tiles>
void over_tiles(int64_t tiles, int64_t tile_bytes, Tiles tile) {
  const int64_t grain = std::max<int64_t>(1, kTileGrainBytes / std::max<int64_t>(1, tile_bytes));
  parallel_for_balanced(0, tiles, grain, grain, tile);
}

#pragma GCC diagnostic pop
#endif

}  // namespace

bool has_blocked_weight_copies() {
#if defined(MPIGRAD_HAS_AVX512_LAYOUT)
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
#else
  return false;
#endif
}

void weights_to_blocked_16i16o(int64_t out, int64_t in, int64_t taps, const float* plain,
                               float* blocked) {
#if defined(MPIGRAD_HAS_AVX512_LAYOUT)
  copy_weights<true>(out, in, taps, const_cast<float*>(plain), blocked);
#else
  (void)out, (void)in, (void)taps, (void)plain, (void)blocked;
#endif
}

void weights_from_blocked_16i16o(int64_t out, int64_t in, int64_t taps, const float* blocked,
                                 float* plain) {
#if defined(MPIGRAD_HAS_AVX512_LAYOUT)
  // A large filter gradient is next read by the optimizer, after the rest of backward has
  // passed through the caches: streaming it to memory saves reading its old lines first.
  const bool stream = reinterpret_cast<uintptr_t>(plain) % 64 == 0 &&
                      out * in * taps * int64_t(sizeof(float)) >= kStreamBytes;
  if (stream) {
    copy_weights<false, true>(out, in, taps, plain, const_cast<float*>(blocked));
  } else {
    copy_weights<false>(out, in, taps, plain, const_cast<float*>(blocked));
  }
#else
  (void)out, (void)in, (void)taps, (void)plain, (void)blocked;
#endif
}

void bf16_weights_to_pairs(Bf16PairLayout layout, int64_t out, int64_t in, int64_t taps,
                           const uint16_t* plain, uint16_t* blocked) {
#if defined(MPIGRAD_HAS_AVX512_LAYOUT)
  const int64_t out_blocks = out / 16, in_blocks = in / 16;
  if (taps == 1 && layout == Bf16PairLayout::InPairs) {
    // Pieces of two tiles along in (the last may be one).
    const int64_t pairs = (in_blocks + 1) / 2;
    over_tiles(out_blocks * pairs, 2 * 512, [&](int64_t begin, int64_t end) {
      for (int64_t piece = begin; piece < end; ++piece) {
        const int64_t ob = piece / pairs, ib = piece % pairs * 2;
        in_pairs_tiles(in, ob, ib, std::min<int64_t>(2, in_blocks - ib), plain, blocked);
      }
    });
    return;
  }
  const bool in_outer = layout == Bf16PairLayout::OutPairsInOuter;
  over_tiles(out_blocks * in_blocks, taps * 512, [&](int64_t begin, int64_t end) {
    std::vector<float> wide, lines;
    if (taps > 1) {
      wide.resize(size_t(taps * 256));
      lines.resize(size_t(taps * 256));
    }
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t ob = tile / in_blocks, ib = tile % in_blocks;
      uint16_t* target = blocked + (in_outer ? ib * out_blocks + ob : tile) * taps * 256;
      if (taps == 1) {
        out_pairs_tile(in, ob, ib, plain, target);
      } else {
        pairs_tile_taps(layout, taps, in * taps, plain + (ob * 16 * in + ib * 16) * taps, target,
                        wide.data(), lines.data());
      }
    }
  });
#else
  (void)layout, (void)out, (void)in, (void)taps, (void)plain, (void)blocked;
#endif
}

}  // namespace mpigrad::kernels::cpu
