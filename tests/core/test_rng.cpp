// The counter-based RNG: Philox 4x32-10 against the published known-answer vectors (Random123's
// kat_vectors), the fixed stream layout, reproducibility from (seed, offset), how many stream
// words each call consumes, and loose statistical sanity of the distributions.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/kernels/philox.h"

namespace {

using namespace mpigrad::core;  // NOLINT
namespace kernels = mpigrad::kernels;

std::vector<uint32_t> philox(std::vector<uint32_t> counter, std::vector<uint32_t> key) {
  const kernels::PhiloxBlock block = kernels::philox4x32_10(counter.data(), key.data());
  return {block.word[0], block.word[1], block.word[2], block.word[3]};
}

struct Moments {
  double mean = 0.0;
  double std = 0.0;
  double lo = 0.0;
  double hi = 0.0;
};

Moments moments(const Tensor& t) {
  const std::vector<double> v = t.to_vector<double>();
  Moments m{0.0, 0.0, v.at(0), v.at(0)};
  for (double x : v) {
    m.mean += x;
    m.lo = std::min(m.lo, x);
    m.hi = std::max(m.hi, x);
  }
  m.mean /= double(v.size());
  for (double x : v) m.std += (x - m.mean) * (x - m.mean);
  m.std = std::sqrt(m.std / double(v.size() - 1));
  return m;
}

}  // namespace

TEST_CASE("Philox 4x32-10 matches the Random123 known-answer vectors") {
  CHECK(philox({0, 0, 0, 0}, {0, 0}) ==
        std::vector<uint32_t>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(philox({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}) ==
        std::vector<uint32_t>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(philox({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
        std::vector<uint32_t>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("stream layout: word w is lane w % 4 of block w / 4, keyed by the seed") {
  const uint64_t seed = 0x0123456789abcdefull;
  const uint64_t block = (uint64_t(1) << 32) + 5;  // exercises the high counter word
  const kernels::PhiloxBlock expected =
      kernels::philox4x32_10(std::vector<uint32_t>{5, 1, 0, 0}.data(),
                             std::vector<uint32_t>{0x89abcdef, 0x01234567}.data());
  for (int lane = 0; lane < 4; ++lane) {
    CHECK(kernels::philox_word(seed, block * 4 + uint64_t(lane)) == expected.word[lane]);
  }
  CHECK(kernels::uniform_from_bits(0xffffffffu) < 1.0f);
  CHECK(kernels::uniform_from_bits(0xffffffffu) == 1.0f - std::ldexp(1.0f, -24));
  CHECK(kernels::uniform_from_bits(0x000000ffu) == 0.0f);  // the low 8 bits are dropped
  CHECK(kernels::uniform_from_bits(0x80000000u) == 0.5f);
}

TEST_CASE("rand uses one stream word per element, starting at the generator's offset") {
  Generator generator(42, 0);
  const std::vector<float> values = rand({8}, generator).to_vector<float>();
  for (uint64_t i = 0; i < values.size(); ++i) {
    CHECK(values[i] == kernels::uniform_from_bits(kernels::philox_word(42, i)));
  }
}

TEST_CASE("the same seed and offset reproduce the same tensors") {
  Generator a(7, 100), b(7, 100), other_seed(8, 100);
  Tensor first = randn({3, 5}, a);
  Tensor again = randn({3, 5}, b);
  CHECK(first.to_vector<float>() == again.to_vector<float>());
  CHECK(first.to_vector<float>() != randn({3, 5}, other_seed).to_vector<float>());
  CHECK(a.offset() == b.offset());
  CHECK(a.seed() == 7);
}

TEST_CASE("reserve advances the offset so consecutive calls continue the stream") {
  Generator split(123), whole(123);
  Tensor first = rand({10}, split);
  CHECK(split.offset() == 10);
  Tensor second = rand({10}, split);
  CHECK(split.offset() == 20);
  std::vector<float> joined = first.to_vector<float>();
  for (float v : second.to_vector<float>()) joined.push_back(v);
  CHECK(joined == rand({20}, whole).to_vector<float>());
  CHECK(rand({4, 5}, split).to_vector<float>() != first.to_vector<float>());

  // An offset that is not a multiple of 4 starts mid-block.
  Generator unaligned(123, 3);
  const std::vector<float> tail = rand({5}, unaligned).to_vector<float>();
  Generator from_start(123);
  const std::vector<float> full20 = rand({20}, from_start).to_vector<float>();
  CHECK(tail == std::vector<float>(full20.begin() + 3, full20.begin() + 8));

  // Resuming from a saved (seed, offset) reproduces the rest of the run.
  Generator resumed;
  resumed.set_state(123, 10);
  CHECK(rand({10}, resumed).to_vector<float>() == second.to_vector<float>());

  Generator normal_generator(5);
  randn({7}, normal_generator);
  CHECK(normal_generator.offset() == 14);
  Generator coin(5);
  bernoulli({9}, 0.5, coin);
  CHECK(coin.offset() == 9);
  Tensor buffer = zeros({6});
  uniform_(buffer, -1.0, 1.0, coin);
  CHECK(coin.offset() == 15);
  normal_(buffer, 0.0, 1.0, coin);
  CHECK(coin.offset() == 27);
}

TEST_CASE("uniform: range and mean on 100k samples") {
  Generator generator(2024);
  Moments m = moments(rand({100000}, generator));
  CHECK(m.lo >= 0.0);
  CHECK(m.hi < 1.0);
  CHECK(std::abs(m.mean - 0.5) < 0.01);  // the standard error is 0.0009
  CHECK(std::abs(m.std - std::sqrt(1.0 / 12.0)) < 0.01);

  Tensor shifted = zeros({100000}, kFloat64);
  uniform_(shifted, -2.0, 3.0, generator);
  m = moments(shifted);
  CHECK(m.lo >= -2.0);
  CHECK(m.hi < 3.0);
  CHECK(std::abs(m.mean - 0.5) < 0.05);
  CHECK(rand({4}, generator, kFloat64).dtype() == kFloat64);
}

TEST_CASE("normal: mean and standard deviation on 100k samples") {
  Generator generator(99);
  Moments m = moments(randn({100000}, generator));
  CHECK(std::abs(m.mean) < 0.02);
  CHECK(std::abs(m.std - 1.0) < 0.02);
  CHECK(m.lo < -3.0);  // the tails are there: P(all > -3) is about e^-135
  CHECK(m.hi > 3.0);
  CHECK(std::isfinite(m.lo));
  CHECK(std::isfinite(m.hi));

  Tensor scaled = zeros({100000}, kFloat64);
  normal_(scaled, 5.0, 2.0, generator);
  m = moments(scaled);
  CHECK(std::abs(m.mean - 5.0) < 0.04);
  CHECK(std::abs(m.std - 2.0) < 0.04);
}

TEST_CASE("bernoulli: only 0 and 1, at rate p") {
  Generator generator(11);
  for (double p : {0.0, 0.3, 0.9, 1.0}) {
    INFO("p = ", p);
    Tensor draws = bernoulli({100000}, p, generator);
    Moments m = moments(draws);
    CHECK(std::abs(m.mean - p) < 0.01);
    int not_binary = 0;
    for (double v : draws.to_vector<double>()) not_binary += (v != 0.0 && v != 1.0);
    CHECK(not_binary == 0);
  }
  Tensor flags = bernoulli({1000}, 0.5, generator, kBool);
  CHECK(flags.dtype() == kBool);
  const int64_t ones = sum(flags).item<int64_t>();
  CHECK(ones > 400);
  CHECK(ones < 600);
}
