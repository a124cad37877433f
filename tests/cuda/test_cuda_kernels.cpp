// CUDA kernels on inputs the op table does not reach: reductions big enough to take the
// multi-block paths, the vectorized elementwise body with its tail, strided and broadcast
// operands, integer/Bool/NaN semantics, casts, Philox streams, index errors and the fused
// cross-entropy. Each is compared with the CPU kernels on the same data.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cuda_test.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/ops/softmax.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/core/stream.h"
#include "mpigrad/kernels/cross_entropy.h"

namespace {

using namespace mpigrad::core;  // NOLINT
using mpigrad::test::first_mismatch;

const Device kGpu = cuda(0);

std::vector<double> on_cpu(const Tensor& t) {
  return t.to(kCPU).to_vector<double>();
}

// Deterministic values in [-2, 2) with a few repeats, from a simple LCG.
std::vector<double> noise(int64_t n, uint64_t seed) {
  std::vector<double> values(static_cast<size_t>(n));
  uint64_t state = seed;
  for (auto& v : values) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = double(state >> 40) / double(1ull << 24) * 4.0 - 2.0;
  }
  return values;
}

}  // namespace

MPIGRAD_CUDA_TEST_CASE("reductions take the multi-block paths and agree with the CPU") {
  // Long rows (block per row, split rows), long columns (split extent), many short rows.
  const std::vector<Shape> shapes = {
      {3000000}, {3, 700001}, {200000, 3}, {5000, 37}, {2, 9, 70001}};
  for (const Shape& shape : shapes) {
    INFO("shape ", shape);
    Tensor x = Tensor::from_vector(noise(shape.numel(), 7), shape, kFloat32);
    Tensor g = x.to(kGpu);
    for (int64_t dim = 0; dim < shape.size(); ++dim) {
      CHECK(first_mismatch(on_cpu(sum(g, {dim})), sum(x, {dim}).to_vector<double>(), 1e-3, 1e-5)
                .empty());
      ValuesIndices cpu_max = max(x, dim), gpu_max = max(g, dim);
      CHECK(on_cpu(gpu_max.values) == cpu_max.values.to_vector<double>());
      CHECK(on_cpu(gpu_max.indices) == cpu_max.indices.to_vector<double>());
      ValuesIndices cpu_min = min(x, dim), gpu_min = min(g, dim);
      CHECK(on_cpu(gpu_min.indices) == cpu_min.indices.to_vector<double>());
    }
  }
  // Ties keep the first position; the first NaN wins.
  std::vector<double> values(100000, 1.0);
  values[70000] = 5.0;
  values[90000] = 5.0;
  Tensor ties = Tensor::from_vector(values, {100000}, kFloat32).to(kGpu);
  CHECK(argmax(ties, 0).item<int64_t>() == 70000);
  values[80000] = std::numeric_limits<double>::quiet_NaN();
  values[95000] = std::numeric_limits<double>::quiet_NaN();
  Tensor nans = Tensor::from_vector(values, {100000}, kFloat32).to(kGpu);
  CHECK(argmax(nans, 0).item<int64_t>() == 80000);
  CHECK(std::isnan(max(nans).item<double>()));
  // bf16 sums accumulate wide: 2^20 ones is exact.
  Tensor ones_bf16 = ones({1 << 20}, TensorOptions(kBFloat16).device(kGpu));
  CHECK(sum(ones_bf16).to(kFloat32).item<double>() == double(1 << 20));
  // Integer sums are Int64.
  Tensor ints = full({1000}, 3.0, TensorOptions(kInt32).device(kGpu));
  CHECK(sum(ints).dtype() == kInt64);
  CHECK(sum(ints).item<int64_t>() == 3000);
}

MPIGRAD_CUDA_TEST_CASE("elementwise: vectorized body, tail, strided and broadcast operands") {
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(4099), int64_t(1 << 20) + 3}) {
    INFO("n = ", n);
    Tensor a = Tensor::from_vector(noise(n, 1), {n}, kFloat32);
    Tensor b = Tensor::from_vector(noise(n, 2), {n}, kFloat32);
    CHECK(first_mismatch(on_cpu(a.to(kGpu) * b.to(kGpu) + b.to(kGpu)),
                         (a * b + b).to_vector<double>(), 1e-6, 1e-6)
              .empty());
    // A misaligned start (offset 1) takes the scalar path.
    if (n > 1) {
      Tensor ga = a.to(kGpu).slice(0, 1, n), gb = b.to(kGpu).slice(0, 1, n);
      CHECK(first_mismatch(on_cpu(exp(ga) - gb),
                           (exp(a.slice(0, 1, n)) - b.slice(0, 1, n)).to_vector<double>(), 1e-6,
                           1e-6)
                .empty());
    }
  }
  Tensor m = Tensor::from_vector(noise(64 * 48, 3), {64, 48}, kFloat32);
  Tensor row = Tensor::from_vector(noise(48, 4), {48}, kFloat32);
  CHECK(first_mismatch(on_cpu(m.to(kGpu).t() * row.to(kGpu).unsqueeze(1)),
                       (m.t() * row.unsqueeze(1)).to_vector<double>(), 1e-6, 1e-6)
            .empty());
  CHECK(first_mismatch(on_cpu(m.to(kGpu).t().contiguous()), m.t().contiguous().to_vector<double>(),
                       0, 0)
            .empty());
}

MPIGRAD_CUDA_TEST_CASE("integer, Bool and NaN rules match the CPU kernels") {
  auto both = [](const Tensor& cpu_result, const Tensor& gpu_result) {
    CHECK(gpu_result.dtype() == cpu_result.dtype());
    CHECK(first_mismatch(on_cpu(gpu_result), cpu_result.to_vector<double>(), 0, 0).empty());
  };
  Tensor i =
      Tensor::from_vector(std::vector<int32_t>{7, -7, 2147483647, -2147483647 - 1, 0, 5}, {6});
  Tensor j = Tensor::from_vector(std::vector<int32_t>{2, 0, 1, -1, 3, -2}, {6});
  both(i / j, i.to(kGpu) / j.to(kGpu));  // x / 0 is 0, MIN / -1 wraps
  both(i + i, i.to(kGpu) + i.to(kGpu));  // wraps
  both(maximum(i, j), maximum(i.to(kGpu), j.to(kGpu)));
  both(abs(i), abs(i.to(kGpu)));
  Tensor p = Tensor::from_vector(std::vector<bool>{true, false, true, false}, {4});
  Tensor q = Tensor::from_vector(std::vector<bool>{true, true, false, false}, {4});
  both(p + q, p.to(kGpu) + q.to(kGpu));
  both(p * q, p.to(kGpu) * q.to(kGpu));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor f = Tensor::from_vector(std::vector<double>{nan, 1.0, -2.0, nan}, {4}, kFloat32);
  Tensor g = Tensor::from_vector(std::vector<double>{0.0, nan, 3.0, nan}, {4}, kFloat32);
  both(maximum(f, g), maximum(f.to(kGpu), g.to(kGpu)));
  both(minimum(f, g), minimum(f.to(kGpu), g.to(kGpu)));
  both(relu(f), relu(f.to(kGpu)));
  both(sign(f), sign(f.to(kGpu)));
  both(clamp(f, -1.0, 0.5), clamp(f.to(kGpu), -1.0, 0.5));
}

MPIGRAD_CUDA_TEST_CASE("casts between every dtype match the CPU bit for bit") {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> values = {0.0,
                                      -0.0,
                                      1.0,
                                      -1.0,
                                      2.5,
                                      -2.5,
                                      65504.0,
                                      70000.0,
                                      1e-8,
                                      3.0e38,
                                      -1e10,
                                      1e10,
                                      255.5,
                                      256.0,
                                      inf,
                                      -inf,
                                      std::numeric_limits<double>::quiet_NaN(),
                                      1.00390625};
  const std::vector<DType> dtypes = {kFloat32, kFloat64, kBFloat16, kFloat16,
                                     kInt32,   kInt64,   kUInt8,    kBool};
  for (DType from : dtypes) {
    Tensor source = Tensor::from_vector(values, {int64_t(values.size())}, kFloat64).to(from);
    for (DType to : dtypes) {
      INFO(dtype_name(from), " -> ", dtype_name(to));
      const std::vector<double> expected = source.to(to).to_vector<double>();
      const std::vector<double> actual = on_cpu(source.to(kGpu).to(to));
      CHECK(first_mismatch(actual, expected, 0, 0).empty());
    }
  }
}

MPIGRAD_CUDA_TEST_CASE("Philox fills: uniform and bernoulli bitwise, normal to 1 ulp") {
  for (uint64_t offset : {uint64_t(0), uint64_t(1), uint64_t(3), uint64_t(1) << 33}) {
    for (DType dtype : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
      INFO("offset ", offset, ", dtype ", dtype_name(dtype));
      Generator cpu_gen(1234, offset), gpu_gen(1234, offset);
      Tensor cu = rand({1001}, cpu_gen, dtype),
             gu = rand({1001}, gpu_gen, TensorOptions(dtype).device(kGpu));
      CHECK(on_cpu(gu) == cu.to_vector<double>());
      CHECK(cpu_gen.offset() == gpu_gen.offset());
      Tensor cn = randn({1001}, cpu_gen, dtype),
             gn = randn({1001}, gpu_gen, TensorOptions(dtype).device(kGpu));
      // A last-bit difference in float may still flip a 16-bit rounding: allow one 16-bit ulp.
      const double tol = dtype == kFloat64   ? 1e-12
                         : dtype == kFloat32 ? 2e-6
                         : dtype == kFloat16 ? 2e-3
                                             : 1.6e-2;
      CHECK(first_mismatch(on_cpu(gn), cn.to_vector<double>(), tol, tol).empty());
      Tensor cb = bernoulli({1001}, 0.3, cpu_gen, dtype);
      Tensor gb = bernoulli({1001}, 0.3, gpu_gen, TensorOptions(dtype).device(kGpu));
      CHECK(on_cpu(gb) == cb.to_vector<double>());
    }
  }
}

MPIGRAD_CUDA_TEST_CASE("index ops name a bad index and leave the output alone") {
  Tensor x = Tensor::from_vector(noise(12, 5), {4, 3}, kFloat32).to(kGpu);
  Tensor bad = Tensor::from_vector(std::vector<int64_t>{1, 4, 0}, {3}).to(kGpu);
  CHECK_THROWS_WITH_AS(index_select(x, 0, bad), doctest::Contains("index 4 (at position 1)"),
                       Error);
  Tensor negative = Tensor::from_vector(std::vector<int64_t>{0, -1, 2, 1, 0, 0}, {2, 3}).to(kGpu);
  CHECK_THROWS_AS(gather(x, 0, negative), Error);
  // Large index_add with many repeats (atomics) matches the CPU.
  Tensor weight =
      Tensor::from_vector(noise(1000 * 64, 6), {1000, 64}, kFloat32).set_requires_grad();
  std::vector<int64_t> ids;
  for (int i = 0; i < 20000; ++i) ids.push_back((i * 37) % 1000 / 3);
  Tensor index = Tensor::from_vector(ids, {20000});
  Tensor gweight = weight.detach().to(kGpu).set_requires_grad();
  sum(embedding(weight, index)).backward();
  sum(embedding(gweight, index.to(kGpu))).backward();
  CHECK(first_mismatch(on_cpu(gweight.grad()), weight.grad().to_vector<double>(), 1e-4, 1e-6)
            .empty());
}

#if MPIGRAD_TEST_CUDA_KERNELS
MPIGRAD_CUDA_TEST_CASE("fused cross-entropy on CUDA matches the CPU kernel") {
  for (int64_t cols : {int64_t(10), int64_t(1000), int64_t(5000)}) {
    for (DType dtype : {kFloat32, kBFloat16}) {
      INFO("cols ", cols, ", dtype ", dtype_name(dtype));
      const int64_t rows = 37;
      Tensor logits = Tensor::from_vector(noise(rows * cols, 8), {rows, cols}, dtype);
      std::vector<int64_t> target_values;
      for (int64_t r = 0; r < rows; ++r)
        target_values.push_back(r % 5 == 4 ? -100 : (r * 13) % cols);
      Tensor targets = Tensor::from_vector(target_values, {rows});
      Tensor cpu_loss = empty({rows}, kFloat32), cpu_grad = empty({rows, cols}, dtype);
      CHECK(mpigrad::kernels::cpu::cross_entropy(dtype, rows, cols, logits.data_ptr(),
                                                 targets.data<int64_t>(), -100, 0.5,
                                                 cpu_loss.data_ptr(), cpu_grad.data_ptr()) == -1);
      Tensor g_logits = logits.to(kGpu), g_targets = targets.to(kGpu);
      Tensor gpu_loss = empty({rows}, TensorOptions(kFloat32).device(kGpu));
      Tensor gpu_grad = empty({rows, cols}, TensorOptions(dtype).device(kGpu));
      // The bad-target code, as int64: -1 has every bit set, which is kNoBadTarget.
      Tensor code = full({1}, -1.0, TensorOptions(kInt64).device(kGpu));
      auto* code_ptr = static_cast<uint64_t*>(code.data_ptr());
      mpigrad::kernels::cuda::cross_entropy(
          dtype, rows, cols, g_logits.data_ptr(), g_targets.data<int64_t>(), -100, 0.5,
          gpu_loss.data_ptr(), gpu_grad.data_ptr(), code_ptr, current_stream(kGpu).handle());
      CHECK(uint64_t(code.item<int64_t>()) == mpigrad::kernels::cuda::kNoBadTarget);
      const double tol = dtype == kFloat32 ? 1e-5 : 2e-2;
      CHECK(first_mismatch(on_cpu(gpu_loss), cpu_loss.to_vector<double>(), tol, tol).empty());
      CHECK(first_mismatch(on_cpu(gpu_grad), cpu_grad.to_vector<double>(), tol, tol).empty());
      // Two bad targets: the code keeps the first row and its value; those rows get NaN, the
      // others are still right, and nothing waited for the check.
      target_values[3] = cols;
      target_values[20] = -7;
      Tensor bad = Tensor::from_vector(target_values, {rows}).to(kGpu);
      mpigrad::kernels::cuda::cross_entropy(
          dtype, rows, cols, g_logits.data_ptr(), bad.data<int64_t>(), -100, 0.5,
          gpu_loss.data_ptr(), gpu_grad.data_ptr(), code_ptr, current_stream(kGpu).handle());
      const auto raised = uint64_t(code.item<int64_t>());
      CHECK(mpigrad::kernels::cuda::bad_target_row(raised) == 3);
      CHECK(mpigrad::kernels::cuda::bad_target_value(raised) == cols);
      const std::vector<double> losses = on_cpu(gpu_loss);
      CHECK(std::isnan(losses[3]));
      CHECK(std::isnan(losses[20]));
      CHECK(losses[0] == doctest::Approx(cpu_loss.to_vector<double>()[0]).epsilon(tol));
    }
  }
}
#endif

MPIGRAD_CUDA_TEST_CASE("softmax rows of every length match the CPU") {
  for (int64_t cols : {int64_t(1), int64_t(33), int64_t(1024), int64_t(1025), int64_t(20000)}) {
    INFO("cols ", cols);
    Tensor x = Tensor::from_vector(noise(9 * cols, 9), {9, cols}, kFloat32);
    CHECK(first_mismatch(on_cpu(softmax(x.to(kGpu))), softmax(x).to_vector<double>(), 1e-6, 1e-5)
              .empty());
    CHECK(first_mismatch(on_cpu(log_softmax(x.to(kGpu))), log_softmax(x).to_vector<double>(), 1e-5,
                         1e-5)
              .empty());
  }
}

MPIGRAD_CUDA_TEST_CASE("softmax of masked (-inf) logits matches the CPU") {
  const double inf = std::numeric_limits<double>::infinity();
  for (int64_t cols : {int64_t(5), int64_t(3000)}) {
    std::vector<double> values = noise(2 * cols, 11);
    for (int64_t j = 0; j < cols; j += 2) values[size_t(j)] = -inf;  // row 0 starts masked
    Tensor x = Tensor::from_vector(values, {2, cols}, kFloat32);
    CHECK(first_mismatch(on_cpu(softmax(x.to(kGpu))), softmax(x).to_vector<double>(), 1e-6, 1e-5)
              .empty());
  }
}

MPIGRAD_CUDA_TEST_CASE("unavailable CUDA devices are a clear error") {
  CHECK_THROWS_WITH_AS(zeros({2}, TensorOptions().device(cuda(999))),
                       doctest::Contains("cuda:999 is not available"), Error);
}
