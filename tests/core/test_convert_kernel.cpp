// The dense 16-bit float conversions and sum (kernels/elementwise.h: convert_dense,
// add_16bit_dense), vectorized per instruction set, against BFloat16's and Half's scalar
// conversions bit for bit: every 16-bit pattern widened, and rounding ties, NaN, inf, subnormals,
// overflow and a million random float32 patterns narrowed, at lengths that leave every kind of
// vector tail. Tensor::to takes the same path for dense tensors.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpigrad/core/tensor.h"
#include "mpigrad/kernels/dtype.h"
#include "mpigrad/kernels/elementwise.h"

namespace {

using mpigrad::kernels::BFloat16;
using mpigrad::kernels::DType;
using mpigrad::kernels::Half;
namespace cpu = mpigrad::kernels::cpu;

uint32_t bits_of(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float float_of(uint32_t bits) {
  float value = 0;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Floats a conversion must get right: signed zeros, ties to even at both widths, the largest
// values that round down and the smallest that round to inf, subnormals of both formats, inf and
// NaNs (quiet, signalling, with payloads), then random bit patterns.
std::vector<float> hard_floats(size_t random_count) {
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x3f800000u, 0xbf800000u,
                                0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u,  // bf16 ties
                                0x3f801000u, 0x3f803000u, 0x3f800fffu,               // half ties
                                0x7f7fffffu, 0xff7fffffu, 0x7f7f7fffu, 0x7f7f8000u,
                                0x477fe000u, 0x477fefffu, 0x477ff000u, 0xc77ff000u,  // half max
                                0x38800000u, 0x387fffffu, 0x33800000u, 0x33000000u,
                                0x33000001u, 0x00000001u, 0x007fffffu, 0x80000001u,
                                0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
                                0x7f800001u, 0x7fbfffffu, 0xff812345u, 0x7fffffffu};
  std::mt19937 generator(12345);
  for (size_t i = 0; i < random_count; ++i) bits.push_back(uint32_t(generator()));
  std::vector<float> values;
  for (uint32_t b : bits) values.push_back(float_of(b));
  return values;
}

template <typename T>
DType dtype_of() {
  return std::is_same_v<T, BFloat16> ? DType::BFloat16 : DType::Float16;
}

template <typename T>
void check_narrowing(const std::vector<float>& values) {
  INFO(std::string(mpigrad::kernels::dtype_name(dtype_of<T>())));
  std::vector<T> dense(values.size());
  cpu::convert_dense(dtype_of<T>(), DType::Float32, int64_t(values.size()), dense.data(),
                     values.data());
  size_t wrong = 0, first_wrong = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (dense[i].bits != T(values[i]).bits && wrong++ == 0) first_wrong = i;
  }
  INFO("first wrong input: 0x" << std::hex << bits_of(values[first_wrong]));
  CHECK(wrong == 0);
}

template <typename T>
void check_widening() {
  INFO(std::string(mpigrad::kernels::dtype_name(dtype_of<T>())));
  std::vector<T> all(65536);
  for (uint32_t b = 0; b < 65536; ++b) all[b].bits = uint16_t(b);
  std::vector<float> dense(all.size());
  cpu::convert_dense(DType::Float32, dtype_of<T>(), int64_t(all.size()), dense.data(), all.data());
  size_t wrong = 0;
  for (size_t b = 0; b < all.size(); ++b) wrong += bits_of(dense[b]) != bits_of(float(all[b]));
  CHECK(wrong == 0);
}

template <typename T>
void check_sum(const std::vector<float>& values) {
  INFO(std::string(mpigrad::kernels::dtype_name(dtype_of<T>())));
  const size_t n = values.size() / 2;
  std::vector<T> in(n), inout(n), expected(n);
  for (size_t i = 0; i < n; ++i) {
    in[i] = T(values[i]);
    inout[i] = T(values[n + i]);
    expected[i] = T(float(in[i]) + float(inout[i]));
  }
  cpu::add_16bit_dense(dtype_of<T>(), int64_t(n), in.data(), inout.data());
  // The one freedom: which NaN a sum of two NaNs gives (IEEE leaves its sign open, and the
  // vector and scalar additions pick different operands); a NaN it must be.
  auto is_nan = [](T x) { return float(x) != float(x); };
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool both_nan = is_nan(inout[i]) && is_nan(expected[i]);
    if (inout[i].bits != expected[i].bits && !both_nan && wrong++ < 3) {
      MESSAGE(std::hex << in[i].bits << " + " << T(values[n + i]).bits << " = " << inout[i].bits
                       << ", expected " << expected[i].bits);
    }
  }
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("convert_dense narrows float32 to bfloat16 and float16 as the scalar types do") {
  const std::vector<float> values = hard_floats(1 << 20);
  check_narrowing<BFloat16>(values);
  check_narrowing<Half>(values);
  // Every length up to 67 from every offset of 0 to 3: each kind of vector tail and alignment.
  for (int64_t offset = 0; offset < 4; ++offset) {
    for (size_t n = 0; n <= 67; ++n) {
      const std::vector<float> piece(values.begin() + offset, values.begin() + offset + long(n));
      check_narrowing<BFloat16>(piece);
      check_narrowing<Half>(piece);
    }
  }
}

TEST_CASE("convert_dense widens every bfloat16 and float16 pattern as the scalar types do") {
  check_widening<BFloat16>();
  check_widening<Half>();
}

TEST_CASE("add_16bit_dense sums as float and rounds once, as MPI's 16-bit sum must") {
  const std::vector<float> values = hard_floats(1 << 18);
  check_sum<BFloat16>(values);
  check_sum<Half>(values);
  for (size_t n = 2; n <= 70; n += 2) {
    const std::vector<float> piece(values.begin(), values.begin() + long(n));
    check_sum<BFloat16>(piece);
    check_sum<Half>(piece);
  }
}

TEST_CASE("convert_dense refuses other dtype pairs, naming them") {
  std::vector<double> doubles(4);
  std::vector<uint16_t> halves(4);
  CHECK_THROWS_WITH_AS(
      cpu::convert_dense(DType::BFloat16, DType::Float64, 4, halves.data(), doubles.data()),
      doctest::Contains("from float64 to bfloat16"), std::invalid_argument);
  CHECK_THROWS_AS(cpu::add_16bit_dense(DType::Float32, 4, doubles.data(), doubles.data()),
                  std::invalid_argument);
}

TEST_CASE("Tensor::to between float32 and 16 bits gives the scalar types' bits, dense or not") {
  using namespace mpigrad::core;  // NOLINT
  const std::vector<float> values = hard_floats(4093);
  const int64_t n = int64_t(values.size());
  Tensor x = Tensor::from_vector<float>(values, {n});
  for (DType dtype : {kBFloat16, kFloat16}) {
    INFO(dtype_name(dtype));
    // Dense (the vectorized loops, split over threads) and every other element (strided).
    const Tensor dense = x.to(dtype);
    const Tensor strided = x.slice(0, 0, n, 2).to(dtype);
    const auto* dense_bits = static_cast<const uint16_t*>(dense.data_ptr());
    const auto* strided_bits = static_cast<const uint16_t*>(strided.contiguous().data_ptr());
    size_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t expected =
          dtype == kBFloat16 ? BFloat16(values[size_t(i)]).bits : Half(values[size_t(i)]).bits;
      wrong += dense_bits[i] != expected;
      if (i % 2 == 0) wrong += strided_bits[i / 2] != expected;
    }
    CHECK(wrong == 0);
    // And back: every value the 16 bits hold comes back exactly.
    const std::vector<float> back = dense.to(kFloat32).to_vector<float>();
    size_t wrong_back = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float expected =
          dtype == kBFloat16 ? float(BFloat16(values[size_t(i)])) : float(Half(values[size_t(i)]));
      wrong_back += bits_of(back[size_t(i)]) != bits_of(expected);
    }
    CHECK(wrong_back == 0);
  }
}
