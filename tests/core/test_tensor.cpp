// Tensor basics: dtypes and 16-bit float conversions, factories, host round trips, views and
// storage sharing, copies and conversions, in-place ops, printing, devices, and the wording of
// the errors users see.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "mpigrad/core/device.h"
#include "mpigrad/core/dtype.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/ops/join.h"
#include "mpigrad/core/ops/linalg.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/shape.h"
#include "mpigrad/core/tensor.h"

namespace {

using namespace mpigrad::core;  // NOLINT

// The message of the core::Error that `fn` throws; fails the test if it throws nothing else.
template <typename Fn>
std::string error_message(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("expected mpigrad::core::Error");
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

float float_from_bits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace

TEST_CASE("dtype names, sizes and kinds") {
  CHECK(dtype_name(kFloat32) == "float32");
  CHECK(dtype_name(kFloat64) == "float64");
  CHECK(dtype_name(kBFloat16) == "bfloat16");
  CHECK(dtype_name(kFloat16) == "float16");
  CHECK(dtype_name(kInt32) == "int32");
  CHECK(dtype_name(kInt64) == "int64");
  CHECK(dtype_name(kUInt8) == "uint8");
  CHECK(dtype_name(kBool) == "bool");
  CHECK(mpigrad::core::element_size(kFloat64) == 8);
  CHECK(mpigrad::core::element_size(kInt64) == 8);
  CHECK(mpigrad::core::element_size(kFloat32) == 4);
  CHECK(mpigrad::core::element_size(kInt32) == 4);
  CHECK(mpigrad::core::element_size(kBFloat16) == 2);
  CHECK(mpigrad::core::element_size(kFloat16) == 2);
  CHECK(mpigrad::core::element_size(kUInt8) == 1);
  CHECK(mpigrad::core::element_size(kBool) == 1);
  CHECK(is_floating(kBFloat16));
  CHECK_FALSE(is_floating(kInt64));
  CHECK(zeros({3, 5}, kFloat16).nbytes() == 30);
}

TEST_CASE("Half conversion: exact values, round to nearest even, inf, NaN, subnormals") {
  CHECK(Half(1.0f).bits == 0x3c00);
  CHECK(Half(-2.0f).bits == 0xc000);
  CHECK(Half(65504.0f).bits == 0x7bff);  // the largest finite half
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties go to the even mantissa (down) ...
  CHECK(Half(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00);
  // ... while 1 + 3 * 2^-11 lies halfway between mantissas 1 and 2, so it goes up to 2.
  CHECK(Half(1.0f + 3 * std::ldexp(1.0f, -11)).bits == 0x3c02);
  CHECK(Half(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)).bits == 0x3c01);
  // 65520 is halfway between 65504 and 65536 (= inf in half); even wins, which is inf.
  CHECK(Half(65520.0f).bits == 0x7c00);
  CHECK(Half(65519.0f).bits == 0x7bff);
  CHECK(Half(std::numeric_limits<float>::infinity()).bits == 0x7c00);
  CHECK(Half(-std::numeric_limits<float>::infinity()).bits == 0xfc00);
  CHECK(std::isnan(float(Half(std::numeric_limits<float>::quiet_NaN()))));
  // Subnormals: 2^-24 is the smallest; 2^-25 ties to even (0); 3 * 2^-25 ties to even (2).
  CHECK(Half(std::ldexp(1.0f, -24)).bits == 0x0001);
  CHECK(Half(std::ldexp(1.0f, -25)).bits == 0x0000);
  CHECK(Half(3 * std::ldexp(1.0f, -25)).bits == 0x0002);
  CHECK(Half(std::ldexp(1.0f, -14)).bits == 0x0400);  // the smallest normal
  CHECK(Half(-0.0f).bits == 0x8000);
  CHECK(Half::to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(Half::to_float(0x03ff) == 1023 * std::ldexp(1.0f, -24));
  CHECK(std::signbit(Half::to_float(0x8000)));

  // Every non-NaN half survives half -> float -> half unchanged.
  int mismatches = 0;
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    if ((bits & 0x7c00) == 0x7c00 && (bits & 0x3ff) != 0) continue;  // NaN payloads
    if (Half::from_float(Half::to_float(uint16_t(bits))) != bits) ++mismatches;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("BFloat16 conversion: round to nearest even, inf, NaN, subnormals") {
  CHECK(BFloat16(1.0f).bits == 0x3f80);
  CHECK(BFloat16(-1.0f).bits == 0xbf80);
  CHECK(BFloat16(1.0f + std::ldexp(1.0f, -8)).bits == 0x3f80);      // tie, even is down
  CHECK(BFloat16(1.0f + 3 * std::ldexp(1.0f, -8)).bits == 0x3f82);  // tie, even is up
  CHECK(BFloat16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)).bits == 0x3f81);
  CHECK(BFloat16(std::numeric_limits<float>::infinity()).bits == 0x7f80);
  CHECK(BFloat16(std::numeric_limits<float>::max()).bits == 0x7f80);  // rounds up to inf
  CHECK(std::isnan(float(BFloat16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(float(BFloat16(float_from_bits(0x7f800001)))));  // NaN must not become inf
  CHECK(BFloat16(float_from_bits(0x00020000)).bits == 0x0002);      // a float subnormal
  CHECK(float(BFloat16(float_from_bits(0x00020000))) == float_from_bits(0x00020000));

  int mismatches = 0;
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    if ((bits & 0x7f80) == 0x7f80 && (bits & 0x7f) != 0) continue;
    BFloat16 original;
    original.bits = uint16_t(bits);
    if (BFloat16(float(original)).bits != bits) ++mismatches;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("16-bit tensors convert through to() and compute in float") {
  Tensor x = Tensor::from_vector<float>({1.0f, 2.5f, -3.0f}, {3});
  Tensor h = x.to(kFloat16);
  CHECK(h.dtype() == kFloat16);
  CHECK(h.to_vector<float>() == std::vector<float>{1.0f, 2.5f, -3.0f});
  Tensor b = x.to(kBFloat16);
  CHECK((b + b).dtype() == kBFloat16);
  CHECK((b + b).to_vector<float>() == std::vector<float>{2.0f, 5.0f, -6.0f});
  CHECK((h * h).to_vector<float>() == std::vector<float>{1.0f, 6.25f, 9.0f});
  CHECK(Tensor::from_vector<double>({1.0 / 3.0}, {1}).to(kFloat16).item<float>() ==
        float(Half(1.0f / 3.0f)));
}

TEST_CASE("promote_types follows the bool < int < float lattice") {
  CHECK(promote_types(kFloat32, kFloat64) == kFloat64);
  CHECK(promote_types(kInt64, kFloat32) == kFloat32);
  CHECK(promote_types(kFloat16, kInt64) == kFloat16);
  CHECK(promote_types(kBool, kInt32) == kInt32);
  CHECK(promote_types(kUInt8, kBool) == kUInt8);
  CHECK(promote_types(kInt32, kInt64) == kInt64);
  CHECK(promote_types(kBFloat16, kFloat16) == kFloat32);
  CHECK(promote_types(kFloat16, kBFloat16) == kFloat32);
  CHECK(promote_types(kBFloat16, kFloat32) == kFloat32);
  CHECK(promote_types(kBool, kBool) == kBool);
  CHECK(promote_types(kFloat64, kInt32) == kFloat64);
}

TEST_CASE("factories") {
  Tensor z = zeros({2, 3});
  CHECK(z.dtype() == kFloat32);
  CHECK(z.shape() == Shape{2, 3});
  CHECK(z.to_vector<float>() == std::vector<float>(6, 0.0f));
  CHECK(ones({4}, kInt32).to_vector<int32_t>() == std::vector<int32_t>(4, 1));
  CHECK(full({2, 2}, 2.5, kFloat64).to_vector<double>() == std::vector<double>(4, 2.5));
  CHECK(zeros_like(ones({3}, kFloat64)).dtype() == kFloat64);
  CHECK(ones_like(zeros({2, 5}, kUInt8)).to_vector<int>() == std::vector<int>(10, 1));

  Tensor r = arange(5);
  CHECK(r.dtype() == kInt64);
  CHECK(r.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4});
  // ceil((1 - 0) / 0.3) = 4 elements, the last one below the end.
  Tensor f = arange(0.0, 1.0, 0.3, kFloat64);
  REQUIRE(f.numel() == 4);
  CHECK(f.to_vector<double>()[3] == doctest::Approx(0.9));
  CHECK(arange(1.0, 2.5, 0.5, kFloat32).to_vector<float>() == std::vector<float>{1.0f, 1.5f, 2.0f});
  CHECK(arange(5.0, 1.0, -2.0, kInt64).to_vector<int64_t>() == std::vector<int64_t>{5, 3});
  CHECK(arange(0.0, 0.0, 1.0, kFloat32).numel() == 0);

  Tensor s = Tensor::scalar(3.5);
  CHECK(s.dim() == 0);
  CHECK(s.numel() == 1);
  CHECK(s.item<double>() == 3.5);
}

TEST_CASE("from_vector, to_vector and item") {
  Tensor t = Tensor::from_vector<int64_t>({1, -2, 3, 4, 5, 6}, {2, 3});
  CHECK(t.dtype() == kInt64);
  CHECK(t.to_vector<double>() == std::vector<double>{1, -2, 3, 4, 5, 6});
  Tensor converted = Tensor::from_vector<double>({1.7, -2.7}, {2}, kInt32);
  CHECK(converted.to_vector<int32_t>() == std::vector<int32_t>{1, -2});  // C-style truncation
  Tensor flags = Tensor::from_vector<bool>({true, false, true}, {3});
  CHECK(flags.to_vector<bool>() == std::vector<bool>{true, false, true});
  CHECK(flags.to_vector<float>() == std::vector<float>{1, 0, 1});
  CHECK(t.data<int64_t>()[4] == 5);
  CHECK_THROWS_AS(t.data<float>(), Error);
  CHECK(contains(error_message([&] { Tensor::from_vector<float>({1, 2, 3}, {2, 2}); }), "[2, 2]"));
  const std::string item_error = error_message([&] { t.item<double>(); });
  CHECK(contains(item_error, "item"));
  CHECK(contains(item_error, "[2, 3]"));
}

TEST_CASE("views share storage with their base") {
  Tensor base = arange(0.0, 12.0, 1.0, kFloat32).view({3, 4});
  Tensor row = base.select(0, 1);
  CHECK(row.storage() == base.storage());
  row.fill_(-1.0);
  CHECK(base.to_vector<float>() == std::vector<float>{0, 1, 2, 3, -1, -1, -1, -1, 8, 9, 10, 11});

  Tensor every_other = base.slice(1, 1, 4, 2);  // columns 1 and 3
  CHECK(every_other.shape() == Shape{3, 2});
  CHECK_FALSE(every_other.is_contiguous());
  every_other.fill_(7.0);
  CHECK(base.to_vector<float>() == std::vector<float>{0, 7, 2, 7, -1, 7, -1, 7, 8, 7, 10, 7});

  Tensor transposed = base.t();
  CHECK_FALSE(transposed.is_contiguous());
  CHECK(transposed.strides() == Shape{1, 4});
  transposed.select(0, 2).copy_(Tensor::from_vector<float>({20, 21, 22}, {3}));
  CHECK(base.select(1, 2).to_vector<float>() == std::vector<float>{20, 21, 22});

  // The version counter lives in the shared storage: a write through a view bumps the base's.
  const uint32_t before = base.version();
  base.narrow(0, 2, 1).mul_(2.0);
  CHECK(base.version() > before);
  CHECK(base.select(0, 2).to_vector<float>() == std::vector<float>{16, 14, 44, 14});

  Tensor flat = base.view({-1});
  CHECK(flat.storage() == base.storage());
  CHECK(base.unsqueeze(0).shape() == Shape{1, 3, 4});
  CHECK(base.expand({2, 3, 4}).shape() == Shape{2, 3, 4});
  CHECK(base.unsqueeze(0).expand({2, 3, 4}).strides()[0] == 0);
}

TEST_CASE("contiguous, clone and to(dtype)") {
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(x.contiguous().is_same(x));  // already contiguous: no copy
  Tensor xt = x.t();
  Tensor packed = xt.contiguous();
  CHECK(packed.is_contiguous());
  CHECK(packed.storage() != x.storage());
  CHECK(packed.to_vector<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});

  Tensor copy = x.clone();
  CHECK(copy.storage() != x.storage());
  copy.fill_(0.0);
  CHECK(x.to_vector<float>()[0] == 1.0f);

  CHECK(x.to(kFloat32).is_same(x));
  Tensor as_int = Tensor::from_vector<double>({2.7, -1.5, 0.2}, {3}).to(kInt64);
  CHECK(as_int.dtype() == kInt64);
  CHECK(as_int.to_vector<int64_t>() == std::vector<int64_t>{2, -1, 0});
  CHECK(xt.to(kFloat64).to_vector<double>() == std::vector<double>{1, 4, 2, 5, 3, 6});
  CHECK(Tensor::from_vector<float>({0.0f, -2.0f}, {2}).to(kBool).to_vector<bool>() ==
        std::vector<bool>{false, true});
  Tensor reshaped = xt.reshape({6});  // not expressible as a view: copies
  CHECK(reshaped.to_vector<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});
  CHECK(x.reshape({3, 2}).storage() == x.storage());  // expressible: a view
}

TEST_CASE("in-place ops: fill_, copy_ with broadcast and conversion, arithmetic") {
  Tensor x = zeros({2, 3});
  x.copy_(Tensor::from_vector<int64_t>({1, 2, 3}, {3}));
  CHECK(x.to_vector<float>() == std::vector<float>{1, 2, 3, 1, 2, 3});
  x.copy_(Tensor::from_vector<double>({10, 20}, {2, 1}));
  CHECK(x.to_vector<float>() == std::vector<float>{10, 10, 10, 20, 20, 20});
  CHECK_THROWS_AS(x.copy_(zeros({4})), Error);

  Tensor y = Tensor::from_vector<float>({1, -2, 3, -4}, {4});
  y.add_(ones({4}), 2.0);  // y += 2 * 1
  CHECK(y.to_vector<float>() == std::vector<float>{3, 0, 5, -2});
  y.mul_(2.0).add_(1.0);
  CHECK(y.to_vector<float>() == std::vector<float>{7, 1, 11, -3});
  y.sub_(full({4}, 1.0)).div_(2.0);
  CHECK(y.to_vector<float>() == std::vector<float>{3, 0, 5, -2});
  y.mul_(Tensor::from_vector<float>({1, 2, 3, 4}, {4})).div_(full({1}, 0.5));
  CHECK(y.to_vector<float>() == std::vector<float>{6, 0, 30, -16});
  y.clamp_(-10.0, 10.0);
  CHECK(y.to_vector<float>() == std::vector<float>{6, 0, 10, -10});
  y.relu_();
  CHECK(y.to_vector<float>() == std::vector<float>{6, 0, 10, 0});
  y.zero_();
  CHECK(y.to_vector<float>() == std::vector<float>(4, 0.0f));
}

TEST_CASE("printing shows values, dtype and nesting") {
  Tensor x = Tensor::from_vector<double>({1.5, -2.25, 3, 4, 5, 6}, {2, 3});
  const std::string text = x.str();
  CHECK(contains(text, "1.5"));
  CHECK(contains(text, "-2.25"));
  CHECK(contains(text, "float64"));
  CHECK(contains(text, "[["));  // two nesting levels for a 2-d tensor
  std::ostringstream streamed;
  streamed << x;
  CHECK(streamed.str() == text);
  CHECK(contains(Tensor::from_vector<int64_t>({42}, {1}).str(), "42"));
  CHECK(contains(Tensor().str(), "undefined"));
}

TEST_CASE("Device parsing and naming") {
  CHECK(Device::parse("cpu") == kCPU);
  CHECK(Device::parse("cuda") == cuda(0));
  CHECK(Device::parse("cuda:1") == cuda(1));
  CHECK(cuda(1).str() == "cuda:1");
  CHECK(kCPU.str() == "cpu");
  for (const char* bad : {"gpu", "", "cuda:", "cuda:x", "cuda:-1", "cpu:1x", "CUDA:0x"}) {
    INFO("text: '", bad, "'");
    CHECK_THROWS_AS(Device::parse(bad), Error);
  }
  CHECK(contains(error_message([] { Device::parse("tpu:0"); }), "tpu:0"));
  Tensor x = ones({2});
  CHECK(x.device() == kCPU);
  CHECK(x.to(kCPU).is_same(x));  // nothing to move
  CHECK(x.to(kCPU, kFloat64).dtype() == kFloat64);
}

TEST_CASE("Shape helpers") {
  CHECK(Shape{2, 3}.str() == "[2, 3]");
  CHECK(Shape{}.numel() == 1);
  CHECK(Shape{2, 0, 3}.numel() == 0);
  CHECK(contiguous_strides({2, 3, 4}) == Shape{12, 4, 1});
  CHECK(broadcast_shapes({3, 1}, {4}, "test") == Shape{3, 4});
  CHECK(broadcast_shapes({2, 1, 4}, {3, 1}, "test") == Shape{2, 3, 4});
  CHECK(wrap_dim(-1, 3, "test") == 2);
  const std::string message = error_message([] { wrap_dim(3, 3, "my_op"); });
  CHECK(contains(message, "my_op"));
  CHECK(contains(message, "3"));
}

TEST_CASE("errors name what was wrong") {
  const std::string add_error = error_message([] { add(zeros({2, 3}), zeros({4})); });
  CHECK(contains(add_error, "[2, 3]"));
  CHECK(contains(add_error, "[4]"));

  const std::string matmul_error = error_message([] { matmul(zeros({2, 3}), zeros({4, 5})); });
  CHECK(contains(matmul_error, "[2, 3]"));
  CHECK(contains(matmul_error, "[4, 5]"));

  // A transposed tensor cannot be flattened without a copy: view must say to use reshape.
  const std::string view_error = error_message([] { zeros({2, 3}).t().view({6}); });
  CHECK(contains(view_error, "reshape"));
  CHECK(contains(error_message([] { zeros({2, 3}).view({4}); }), "[2, 3]"));

  const std::string index_error = error_message([] {
    index_select(zeros({4, 2}), 0, Tensor::from_vector<int64_t>({1, 7}, {2}));
  });
  CHECK(contains(index_error, "7"));
  CHECK(contains(error_message([] {
                   gather(zeros({2, 3}), 1, Tensor::from_vector<int64_t>({0, 5, 1, 2}, {2, 2}));
                 }),
                 "5"));
  CHECK(contains(error_message([] {
                   embedding(zeros({3, 2}), Tensor::from_vector<int64_t>({-4}, {1}));
                 }),
                 "-4"));
  CHECK(contains(error_message([] { zeros({2, 3}).select(1, 9); }), "9"));
  CHECK_THROWS_AS(zeros({2, 3}).permute({0, 0}), Error);
  CHECK_THROWS_AS(zeros({2, 3}).expand({4, 3}), Error);
  CHECK_THROWS_AS(cat({zeros({2, 3}), zeros({2, 4})}, 0), Error);
  CHECK_THROWS_AS(stack({zeros({2, 3}), zeros({3, 2})}), Error);
  CHECK_THROWS_AS(zeros({2}, kInt64).set_requires_grad(true), Error);
}

TEST_CASE("index_select and one_hot on valid and invalid indices") {
  Tensor out =
      index_select(arange(0.0, 4.0, 1.0, kFloat32), 0, Tensor::from_vector<int64_t>({3, 0}, {2}));
  CHECK(out.to_vector<float>() == std::vector<float>{3, 0});
  CHECK_THROWS_AS(one_hot(Tensor::from_vector<int64_t>({0, 3}, {2}), 3), Error);
  CHECK(one_hot(Tensor::from_vector<int64_t>({1}, {1}), 2).to_vector<int64_t>() ==
        std::vector<int64_t>{0, 1});
}

TEST_CASE("fill_ and zero_ on contiguous tensors and on views, every dtype, -0.0 kept") {
  for (DType dtype : {kFloat32, kFloat64, kBFloat16, kFloat16, kInt32, kInt64, kUInt8, kBool}) {
    INFO(dtype);
    Tensor t = ones({3, 4}, dtype);
    t.zero_();  // contiguous: one flat fill
    for (double v : t.to_vector<double>()) CHECK(v == 0.0);
    t.fill_(1.0);
    t.t().narrow(0, 1, 2).zero_();  // a strided view: columns 1 and 2 of every row
    std::vector<double> values = t.to_vector<double>();
    for (int i = 0; i < 12; ++i) {
      CHECK(values[size_t(i)] == ((i % 4 == 1 || i % 4 == 2) ? 0.0 : 1.0));
    }
  }
  Tensor negative_zero = ones({5}, kFloat32);
  negative_zero.fill_(-0.0);  // not all zero bits: must not be a memset
  for (float v : negative_zero.to_vector<float>()) CHECK(std::signbit(v));
}
