// CPU random fills from the Philox stream: uniform, normal, bernoulli.
//
// Layout: dense [n] outputs written with `=`. Element i reads stream word offset + i (uniform,
// bernoulli) or words offset + 2i and offset + 2i + 1 (normal), exactly as kernels/philox.h and
// kernels/random.h fix it, so the CUDA kernels can reproduce every bit.
// Threading: elements are split over OpenMP threads; every element is a pure function of
// (seed, its words), so the result never depends on the thread count or the split.
// Speed: words are produced a whole 4-word Philox block at a time into a small buffer, instead
// of one block per word.
// Precision: the transforms run in double for Float64 and in float for every other dtype.
#include "mpigrad/kernels/random.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "mpigrad/kernels/cpu/parallel.h"
#include "mpigrad/kernels/cpu/scalar.h"
#include "mpigrad/kernels/philox.h"

namespace mpigrad::kernels::cpu {
namespace {

constexpr int64_t kWordBuffer = 512;  // stream words generated per batch, on the stack
constexpr int64_t kRandomGrain = 16384;
constexpr double kTwoPi = 6.28318530717958647692;

// Words [first, first + count) of the stream for `seed`, one Philox block per 4 words.
void stream_words(uint64_t seed, uint64_t first, int64_t count, uint32_t* dst) {
  uint64_t word = first;
  int64_t written = 0;
  while (written < count) {
    const PhiloxBlock block = philox_block(seed, word / 4);
    for (uint64_t lane = word % 4; lane < 4 && written < count; ++lane, ++word, ++written) {
      dst[written] = block.word[lane];
    }
  }
}

// Calls emit(i, words) for elements [0, n), where words points at the words_per_element
// stream words of element i.
template <typename Emit>
void for_each_element_words(int64_t n, uint64_t seed, uint64_t offset, int64_t words_per_element,
                            Emit emit) {
  parallel_for(0, n, kRandomGrain, [&](int64_t begin, int64_t end) {
    uint32_t words[kWordBuffer];
    const int64_t per_batch = kWordBuffer / words_per_element;
    for (int64_t first = begin; first < end; first += per_batch) {
      const int64_t count = std::min(per_batch, end - first);
      stream_words(seed, offset + uint64_t(first) * uint64_t(words_per_element),
                   count * words_per_element, words);
      for (int64_t k = 0; k < count; ++k) emit(first + k, words + k * words_per_element);
    }
  });
}

void check_count(const char* kernel, int64_t n) {
  if (n < 0) throw_invalid(kernel, "negative element count");
}

}  // namespace

void uniform(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset, double lo,
             double hi) {
  check_count("uniform", n);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!is_floating_v<T>) {
      throw_unsupported("uniform", "", dtype);
    } else {
      using R = acc_t<T>;
      T* dst = static_cast<T*>(out);
      const R low = R(lo);
      const R range = R(hi - lo);
      for_each_element_words(n, seed, offset, kWordsPerUniform, [&](int64_t i, const uint32_t* w) {
        dst[i] = T(low + range * R(uniform_from_bits(w[0])));
      });
    }
  });
}

void normal(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset, double mean,
            double std) {
  check_count("normal", n);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!is_floating_v<T>) {
      throw_unsupported("normal", "", dtype);
    } else {
      using R = acc_t<T>;
      T* dst = static_cast<T*>(out);
      const R mu = R(mean);
      const R sigma = R(std);
      for_each_element_words(n, seed, offset, kWordsPerNormal, [&](int64_t i, const uint32_t* w) {
        // Box-Muller on 1 - u1, which lies in (0, 1], so the log never sees 0.
        const R u1 = R(1) - R(uniform_from_bits(w[0]));
        const R u2 = R(uniform_from_bits(w[1]));
        const R z = std::sqrt(R(-2) * std::log(u1)) * std::cos(R(kTwoPi) * u2);
        dst[i] = T(mu + sigma * z);
      });
    }
  });
}

void bernoulli(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset, double p) {
  check_count("bernoulli", n);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* dst = static_cast<T*>(out);
    const T one = cast_to<T>(1.0);
    const T zero = cast_to<T>(0.0);
    // The compare is in double: rounding p to float could move it across a representable u.
    for_each_element_words(n, seed, offset, kWordsPerUniform, [&](int64_t i, const uint32_t* w) {
      dst[i] = double(uniform_from_bits(w[0])) < p ? one : zero;
    });
  });
}

}  // namespace mpigrad::kernels::cpu
