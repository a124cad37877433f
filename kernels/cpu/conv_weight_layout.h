// Internal to kernels/cpu: convolution weights between the plain [out, in, kh, kw] layout and
// oneDNN's blocked ones: Float32 to and from OIhw16i16o (format tag ABcd16b16a), the layout its
// AVX-512 direct convolutions read as forward weights and write as the filter gradient, and
// BFloat16 into the pair layouts of its AVX512-BF16 kernels (below). conv_dnnl.cpp runs these
// instead of oneDNN's reorder primitive for those layouts.
//
// Why: in ResNet-18's training step (batch 8, 32x32 images, 1 thread, ONEDNN_VERBOSE) oneDNN's
// reorders between these two layouts took 13.8 of its 33.8 ms, the filter gradient's way back to
// plain alone 9.2 ms (a 9.4 MB 512x512x3x3 weight: 2.0 ms against 0.34 ms for a memcpy). Both
// layouts split into tiles of 16 outputs x 16 inputs x kh*kw taps: in the plain layout a tile is 16
// rows of 16*kh*kw contiguous floats, in the blocked one kh*kw blocks of [16 in][16 out] (one cache
// line per [in]). A tile is moved as kh*kw 16x16 transposes in registers, so both sides are read
// and written a whole cache line at a time. Bit for bit a copy. (oneDNN's own reorder to the data
// gradient's OIhw16o16i is as fast as these; a two-step version of it here was slower.)
#pragma once

#include <cstdint>

namespace mpigrad::kernels::cpu {

// Whether this CPU runs the functions below (AVX-512F).
bool has_blocked_weight_copies();

// plain [out, in, taps] -> blocked [out/16][in/16][taps][16 in][16 out]; out and in multiples
// of 16. Threads over tiles (parallel.h) when the weight is large.
void weights_to_blocked_16i16o(int64_t out, int64_t in, int64_t taps, const float* plain,
                               float* blocked);

// The inverse: blocked [out/16][in/16][taps][16 in][16 out] -> plain [out, in, taps].
void weights_from_blocked_16i16o(int64_t out, int64_t in, int64_t taps, const float* blocked,
                                 float* plain);

// BFloat16 weights, plain [out, in, taps], into the layouts of oneDNN's AVX512-BF16 kernels,
// which keep two neighbours of one axis side by side in 32 bits (vdpbf16ps reads such pairs).
// Bit for bit a copy; out and in multiples of 16. ResNet-50's bf16 step (batch 8, 32x32, 1
// thread) spent 13 ms in oneDNN's reorders of these weights, 7-8 GB/s.
// The layouts, outer blocks first:
enum class Bf16PairLayout {
  // the forward's ABcd8b16a2b: [out/16][in/16][taps][8 pairs of in][16 out][2]
  InPairs,
  // BAcd8a16b2a (1x1 data gradient): [in/16][out/16][taps][8 pairs of out][16 in][2]
  OutPairsInOuter,
  // ABcd8a16b2a (kxk data gradient): [out/16][in/16][taps][8 pairs of out][16 in][2]
  OutPairsOutOuter,
};
void bf16_weights_to_pairs(Bf16PairLayout layout, int64_t out, int64_t in, int64_t taps,
                           const uint16_t* plain, uint16_t* blocked);

}  // namespace mpigrad::kernels::cpu
