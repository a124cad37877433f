// The scatter kernels with atomics on a GPU against the CPU, on inputs large enough that many
// threads hit one position at once: scatter_add and index_add (atomicAdd), and scatter_reduce's
// mul, max and min (compare-and-swap loops), forward and backward. Max and min must agree
// exactly, ties included (the winner is the lowest position on both devices); the adds and mul
// only up to the order of their float operations.
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

namespace {

using namespace mpigrad::core;  // NOLINT
using mpigrad::test::first_mismatch;

const Device kGpu = cuda(0);

std::vector<double> on_cpu(const Tensor& t) {
  return t.to(kCPU).to_vector<double>();
}

// Deterministic values: `levels` > 0 rounds them to that many steps in [-2, 2) (ties galore).
std::vector<double> values(int64_t n, uint64_t seed, int levels = 0) {
  std::vector<double> out(static_cast<size_t>(n));
  uint64_t state = seed;
  for (auto& v : out) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const double u = double(state >> 40) / double(1ull << 24);
    v = levels > 0 ? std::floor(u * levels) / levels * 4.0 - 2.0 : u * 4.0 - 2.0;
  }
  return out;
}

// `n` indices in [0, extent), each repeated about n / extent times.
Tensor repeated_index(int64_t n, int64_t extent, uint64_t seed, const Shape& shape) {
  std::vector<int64_t> ids;
  uint64_t state = seed;
  for (int64_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    ids.push_back(int64_t((state >> 33) % uint64_t(extent)));
  }
  return Tensor::from_vector(ids, shape);
}

struct Result {
  std::vector<double> out, grad_base, grad_src;
};

// op(base, dim, index, src) and the gradients of sum(out * weights), on `device`.
template <typename Op>
Result run(Op op, Device device, const Tensor& base, const Tensor& index, const Tensor& src) {
  Tensor b = base.to(device).detach().set_requires_grad();
  Tensor s = src.to(device).detach().set_requires_grad();
  Tensor out = op(b, index.to(device), s);
  const Tensor weights =
      Tensor::from_vector(values(out.numel(), 99), out.shape(), out.dtype()).to(device);
  sum(out * weights).backward();
  return {on_cpu(out), on_cpu(b.grad()), on_cpu(s.grad())};
}

}  // namespace

MPIGRAD_CUDA_TEST_CASE("scatter_reduce max and min on a GPU are the CPU's, ties included") {
  for (const ScatterReduceOp reduce : {ScatterReduceOp::Max, ScatterReduceOp::Min}) {
    for (const DType dtype : {kFloat32, kFloat64}) {
      for (const int levels : {0, 7}) {
        INFO((reduce == ScatterReduceOp::Max ? "max" : "min"), ", ", dtype_name(dtype), ", levels ",
             levels);
        // 60000 updates into 40 x 8 positions along dim 0, and into 3 x 50 along dim 1.
        const Tensor base0 = Tensor::from_vector(values(40 * 8, 1, levels), {40, 8}, dtype);
        const Tensor src0 = Tensor::from_vector(values(7500 * 8, 2, levels), {7500, 8}, dtype);
        const Tensor index0 = repeated_index(7500 * 8, 40, 3, {7500, 8});
        const auto dim0 = [reduce](const Tensor& b, const Tensor& i, const Tensor& s) {
          return scatter_reduce(b, 0, i, s, reduce);
        };
        const Result cpu0 = run(dim0, kCPU, base0, index0, src0);
        const Result gpu0 = run(dim0, kGpu, base0, index0, src0);
        CHECK(gpu0.out == cpu0.out);
        CHECK(gpu0.grad_base == cpu0.grad_base);
        CHECK(gpu0.grad_src == cpu0.grad_src);

        const Tensor base1 = Tensor::from_vector(values(3 * 50, 4, levels), {3, 50}, dtype);
        const Tensor src1 = Tensor::from_vector(values(3 * 20000, 5, levels), {3, 20000}, dtype);
        const Tensor index1 = repeated_index(3 * 20000, 50, 6, {3, 20000});
        const auto dim1 = [reduce](const Tensor& b, const Tensor& i, const Tensor& s) {
          return scatter_reduce(b, 1, i, s, reduce);
        };
        const Result cpu1 = run(dim1, kCPU, base1, index1, src1);
        const Result gpu1 = run(dim1, kGpu, base1, index1, src1);
        CHECK(gpu1.out == cpu1.out);
        CHECK(gpu1.grad_base == cpu1.grad_base);
        CHECK(gpu1.grad_src == cpu1.grad_src);
        // Every position's gradient went to exactly one winner.
        double routed = 0;
        for (double g : cpu1.grad_base) routed += g != 0 ? 1 : 0;
        for (double g : cpu1.grad_src) routed += g != 0 ? 1 : 0;
        CHECK(routed == 3 * 50);
      }
    }
  }
  // A NaN update never wins; a NaN already there stays.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor base = Tensor::from_vector(std::vector<double>{1.0, nan}, {2}, kFloat32);
  const Tensor src = Tensor::from_vector(std::vector<double>{nan, 3.0, 2.0, nan}, {4}, kFloat32);
  const Tensor index = Tensor::from_vector(std::vector<int64_t>{0, 1, 0, 1}, {4});
  const std::vector<double> max_gpu =
      on_cpu(scatter_reduce(base.to(kGpu), 0, index.to(kGpu), src.to(kGpu), ScatterReduceOp::Max));
  CHECK(max_gpu[0] == 2.0);
  CHECK(std::isnan(max_gpu[1]));
}

MPIGRAD_CUDA_TEST_CASE("scatter_reduce mul on a GPU matches the CPU, zero updates included") {
  for (const DType dtype : {kFloat32, kFloat64}) {
    INFO(dtype_name(dtype));
    // Factors near 1 so that ~150 of them per position stay finite; a few exact zeros.
    std::vector<double> factors = values(6000 * 4, 7);
    for (size_t i = 0; i < factors.size(); ++i)
      factors[i] = i % 997 == 0 ? 0.0 : 1.0 + 0.01 * factors[i];
    const Tensor base = Tensor::from_vector(values(40 * 4, 8), {40, 4}, dtype);
    const Tensor src = Tensor::from_vector(factors, {6000, 4}, dtype);
    const Tensor index = repeated_index(6000 * 4, 40, 9, {6000, 4});
    const auto op = [](const Tensor& b, const Tensor& i, const Tensor& s) {
      return scatter_reduce(b, 0, i, s, ScatterReduceOp::Mul);
    };
    const Result cpu = run(op, kCPU, base, index, src);
    const Result gpu = run(op, kGpu, base, index, src);
    const double tol = dtype == kFloat32 ? 1e-4 : 1e-10;
    CHECK(first_mismatch(gpu.out, cpu.out, tol, tol).empty());
    CHECK(first_mismatch(gpu.grad_base, cpu.grad_base, tol, tol).empty());
    CHECK(first_mismatch(gpu.grad_src, cpu.grad_src, tol, tol).empty());
  }
  // Integers multiply exactly and wrap alike.
  for (const DType dtype : {kInt32, kInt64}) {
    std::vector<double> small;
    for (int64_t i = 0; i < 3000; ++i) small.push_back(double(i % 5 - 2 == 0 ? 3 : i % 5 - 2));
    const Tensor base = Tensor::from_vector(std::vector<double>(10, 1.0), {10}, dtype);
    const Tensor src = Tensor::from_vector(small, {3000}, dtype);
    const Tensor index = repeated_index(3000, 10, 10, {3000});
    const Tensor cpu = scatter_reduce(base, 0, index, src, ScatterReduceOp::Mul);
    const Tensor gpu =
        scatter_reduce(base.to(kGpu), 0, index.to(kGpu), src.to(kGpu), ScatterReduceOp::Mul);
    CHECK(gpu.to(kCPU).to_vector<int64_t>() == cpu.to_vector<int64_t>());
  }
}

MPIGRAD_CUDA_TEST_CASE("scatter_add and index_add with many repeats match the CPU") {
  for (const DType dtype : {kFloat32, kFloat64}) {
    INFO(dtype_name(dtype));
    const Tensor base = Tensor::from_vector(values(64 * 16, 11), {64, 16}, dtype);
    const Tensor src = Tensor::from_vector(values(20000 * 16, 12), {20000, 16}, dtype);
    const Tensor per_element = repeated_index(20000 * 16, 64, 13, {20000, 16});
    const Tensor rows = repeated_index(20000, 64, 14, {20000});
    const double tol = dtype == kFloat32 ? 1e-3 : 1e-9;
    const auto scatter = [](const Tensor& b, const Tensor& i, const Tensor& s) {
      return scatter_add(b, 0, i, s);
    };
    const Result cpu = run(scatter, kCPU, base, per_element, src);
    const Result gpu = run(scatter, kGpu, base, per_element, src);
    CHECK(first_mismatch(gpu.out, cpu.out, tol, tol).empty());
    CHECK(first_mismatch(gpu.grad_src, cpu.grad_src, tol, tol).empty());
    const auto add_rows = [](const Tensor& b, const Tensor& i, const Tensor& s) {
      return index_add(b, 0, i, s);
    };
    const Result cpu_rows = run(add_rows, kCPU, base, rows, src);
    const Result gpu_rows = run(add_rows, kGpu, base, rows, src);
    CHECK(first_mismatch(gpu_rows.out, cpu_rows.out, tol, tol).empty());
    CHECK(first_mismatch(gpu_rows.grad_src, cpu_rows.grad_src, tol, tol).empty());
  }
  // A bad index is an error naming it, and nothing is written.
  const Tensor base = zeros({4}, TensorOptions(kFloat32).device(kGpu));
  const Tensor bad = Tensor::from_vector(std::vector<int64_t>{1, 9, 0}, {3}).to(kGpu);
  const Tensor src = ones({3}, TensorOptions(kFloat32).device(kGpu));
  CHECK_THROWS_WITH_AS(scatter_reduce(base, 0, bad, src, ScatterReduceOp::Max),
                       doctest::Contains("index 9 (at position 1)"), Error);
}
