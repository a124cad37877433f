// The counter-based Philox 4x32-10 generator (Salmon et al., "Parallel random numbers: as easy
// as 1, 2, 3", SC 2011). It is a pure function of (key, counter), so any thread can compute any
// element of the stream directly, and the CPU and CUDA kernels produce bit-identical numbers.
//
// Stream layout, fixed here for every device: word w of the stream (w = offset + i) is lane w % 4
// of the block whose 128-bit counter is w / 4; the key is the 64-bit seed.
#pragma once

#include <cstdint>

#include "mpigrad/kernels/dtype.h"

namespace mpigrad::kernels {

struct PhiloxBlock {
  uint32_t word[4];
};

MPIGRAD_HOST_DEVICE inline void philox_round(uint32_t counter[4], const uint32_t key[2]) {
  constexpr uint64_t kMultiplier0 = 0xD2511F53u;
  constexpr uint64_t kMultiplier1 = 0xCD9E8D57u;
  uint64_t product0 = kMultiplier0 * counter[0];
  uint64_t product1 = kMultiplier1 * counter[2];
  uint32_t hi0 = uint32_t(product0 >> 32), lo0 = uint32_t(product0);
  uint32_t hi1 = uint32_t(product1 >> 32), lo1 = uint32_t(product1);
  uint32_t next[4] = {hi1 ^ counter[1] ^ key[0], lo1, hi0 ^ counter[3] ^ key[1], lo0};
  for (int i = 0; i < 4; ++i) counter[i] = next[i];
}

// Ten rounds of Philox 4x32 on a 128-bit counter under a 64-bit key.
MPIGRAD_HOST_DEVICE inline PhiloxBlock philox4x32_10(const uint32_t counter_in[4],
                                                     const uint32_t key_in[2]) {
  constexpr uint32_t kWeyl0 = 0x9E3779B9u;
  constexpr uint32_t kWeyl1 = 0xBB67AE85u;
  uint32_t counter[4] = {counter_in[0], counter_in[1], counter_in[2], counter_in[3]};
  uint32_t key[2] = {key_in[0], key_in[1]};
  for (int round = 0; round < 10; ++round) {
    philox_round(counter, key);
    if (round < 9) {
      key[0] += kWeyl0;
      key[1] += kWeyl1;
    }
  }
  return PhiloxBlock{{counter[0], counter[1], counter[2], counter[3]}};
}

// Block `block_index` of the stream for `seed`.
MPIGRAD_HOST_DEVICE inline PhiloxBlock philox_block(uint64_t seed, uint64_t block_index) {
  uint32_t counter[4] = {uint32_t(block_index), uint32_t(block_index >> 32), 0u, 0u};
  uint32_t key[2] = {uint32_t(seed), uint32_t(seed >> 32)};
  return philox4x32_10(counter, key);
}

// Word w of the stream for `seed`.
MPIGRAD_HOST_DEVICE inline uint32_t philox_word(uint64_t seed, uint64_t w) {
  return philox_block(seed, w / 4).word[w % 4];
}

// A float in [0, 1) from the top 24 bits of a word: every value is exactly representable.
MPIGRAD_HOST_DEVICE inline float uniform_from_bits(uint32_t bits) {
  return float(bits >> 8) * (1.0f / 16777216.0f);
}

}  // namespace mpigrad::kernels
