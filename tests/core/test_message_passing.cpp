// gather_mul_scatter and gather_product (core/ops/indexing.h) against the unfused composition
// they replace (index_select, mul, index_add), forward and gradients; second derivatives by
// finite differences through a SchNet-like use (the filter and the features both functions of
// one input); repeated indices, an empty edge set, and the errors. The op table (op_cases.h)
// checks the forward values, first and second derivatives of both ops once more, and CUDA
// against the CPU.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "../second_order_check.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/rng.h"

namespace {

using namespace mpigrad::core;  // NOLINT

Tensor random_leaf(Shape shape, DType dtype, uint64_t seed) {
  Generator generator(seed);
  Tensor t = randn(shape, generator, TensorOptions(dtype));
  t.set_requires_grad(true);
  return t;
}

Tensor indices(const std::vector<int64_t>& values) {
  return Tensor::from_vector<int64_t>(values, {int64_t(values.size())});
}

// Rows in [0, rows), every one of them several times and in a scrambled order.
std::vector<int64_t> scrambled_rows(int64_t count, int64_t rows, int64_t step) {
  std::vector<int64_t> out;
  for (int64_t e = 0; e < count; ++e) out.push_back((e * step + 1) % rows);
  return out;
}

void check_close(const Tensor& actual, const Tensor& expected, double tolerance) {
  REQUIRE(actual.shape() == expected.shape());
  const std::vector<double> a = actual.to_vector<double>(), b = expected.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("element ", i);
    CHECK(a[i] == doctest::Approx(b[i]).epsilon(tolerance).scale(1.0));
  }
}

struct Graph {
  int64_t atoms, edges;
  Tensor source, target;
};

Graph graph(int64_t atoms, int64_t edges) {
  return {atoms, edges, indices(scrambled_rows(edges, atoms, 7)),
          indices(scrambled_rows(edges, atoms, 3))};
}

}  // namespace

TEST_CASE("gather_mul_scatter: forward and gradients equal the unfused composition") {
  for (DType dtype : {kFloat64, kFloat32}) {
    // Trailing shapes: SchNet's [F], a width that is not a multiple of a thread's column tile,
    // and rows of rank 2.
    for (const Shape& row : {Shape{8}, Shape{37}, Shape{2, 3}}) {
      INFO("dtype ", dtype, " rows ", row);
      const Graph g = graph(6, 23);
      Shape x_shape = row, w_shape = row;
      x_shape.insert(0, g.atoms);
      w_shape.insert(0, g.edges);
      const Tensor x = random_leaf(x_shape, dtype, 1), w = random_leaf(w_shape, dtype, 2);
      const Tensor fused = gather_mul_scatter(x, g.source, w, g.target, g.atoms);
      const Tensor plain = index_add(zeros(x_shape, TensorOptions(dtype)), 0, g.target,
                                     index_select(x, 0, g.source) * w);
      const double tolerance = dtype == kFloat64 ? 1e-12 : 1e-5;
      check_close(fused, plain, tolerance);
      Generator generator(3);
      const Tensor seed = randn(x_shape, generator, TensorOptions(dtype));
      const std::vector<Tensor> fused_grads = grad({fused}, {x, w}, {seed});
      const std::vector<Tensor> plain_grads = grad({plain}, {x, w}, {seed});
      check_close(fused_grads[0], plain_grads[0], tolerance);
      check_close(fused_grads[1], plain_grads[1], tolerance);
    }
  }
}

TEST_CASE("gather_product: forward and gradients equal two index_selects and a mul") {
  const Tensor a = random_leaf({5, 4}, kFloat64, 4), b = random_leaf({3, 4}, kFloat64, 5);
  const Tensor ia = indices(scrambled_rows(11, 5, 2)), ib = indices(scrambled_rows(11, 3, 5));
  const Tensor fused = gather_product(a, ia, b, ib);
  const Tensor plain = index_select(a, 0, ia) * index_select(b, 0, ib);
  check_close(fused, plain, 1e-12);
  Generator generator(6);
  const Tensor seed = randn({11, 4}, generator, TensorOptions(kFloat64));
  const std::vector<Tensor> fused_grads = grad({fused}, {a, b}, {seed});
  const std::vector<Tensor> plain_grads = grad({plain}, {a, b}, {seed});
  check_close(fused_grads[0], plain_grads[0], 1e-12);
  check_close(fused_grads[1], plain_grads[1], 1e-12);
}

TEST_CASE("gather_mul_scatter: second and third derivatives through a SchNet-like use") {
  // x and the filters both depend on one input p, as the features and the edge filters of an
  // interatomic potential depend on the positions: the check differentiates the gradient in p
  // (the forces) once more.
  const Graph g = graph(4, 9);
  const Tensor filter_weights = Tensor::from_vector<double>(
      {0.3, -0.7, 1.1, 0.4, -0.2, 0.9, -1.3, 0.6, 0.5, -0.8, 0.2, 1.4}, {4, 3});
  mpigrad::test::SecondOrderCheck check;
  check.build = [&](const std::vector<Tensor>& in) {
    const Tensor& p = in[0];  // [4, 3]
    const Tensor x = tanh(p) * p;
    const Tensor w = sin(index_select(p, 0, g.target) - index_select(p, 0, g.source)) *
                     index_select(filter_weights, 0, g.source);
    return gather_mul_scatter(x, g.source, w, g.target, g.atoms) * x;
  };
  check.inputs = {Tensor::from_vector<double>(
      {0.2, -0.5, 0.9, 1.1, 0.3, -0.7, -0.4, 0.8, 0.1, 0.6, -1.2, 0.35}, {4, 3})};
  check.differentiable = {true};
  check.seed = 11;
  const std::string mismatch = mpigrad::test::check_second_order(check);
  CHECK_MESSAGE(mismatch.empty(), mismatch);

  // Third order: the gradient of a second derivative, against the unfused composition.
  const auto third = [&](bool fused) {
    Tensor p = check.inputs[0].clone();
    p.set_requires_grad(true);
    const Tensor x = tanh(p) * p;
    const Tensor w = sin(index_select(p, 0, g.target) - index_select(p, 0, g.source));
    const Tensor out = fused ? gather_mul_scatter(x, g.source, w, g.target, g.atoms)
                             : index_add(zeros({4, 3}, TensorOptions(kFloat64)), 0, g.target,
                                         index_select(x, 0, g.source) * w);
    const Tensor g1 = grad({sum(out * out)}, {p}, {}, {.create_graph = true})[0];
    const Tensor g2 = grad({sum(g1 * g1)}, {p}, {}, {.create_graph = true})[0];
    return grad({sum(g2 * p)}, {p})[0];
  };
  check_close(third(true), third(false), 1e-10);
}

TEST_CASE("gather_mul_scatter: an empty edge set gives zeros and zero gradients") {
  const Tensor x = random_leaf({3, 4}, kFloat64, 7), w = random_leaf({0, 4}, kFloat64, 8);
  const Tensor none = Tensor::from_vector<int64_t>({}, {0});
  const Tensor out = gather_mul_scatter(x, none, w, none, 5);
  CHECK(out.shape() == Shape{5, 4});
  for (double v : out.to_vector<double>()) CHECK(v == 0.0);
  const std::vector<Tensor> grads = grad({sum(out * out + out)}, {x, w});
  CHECK(grads[0].shape() == x.shape());
  for (double v : grads[0].to_vector<double>()) CHECK(v == 0.0);
  CHECK(grads[1].shape() == w.shape());
  CHECK(gather_product(x, none, x, none).shape() == Shape{0, 4});
}

TEST_CASE("gather_mul_scatter: bad indices and shapes are errors that name them") {
  const Tensor x = random_leaf({3, 2}, kFloat64, 9), w = random_leaf({4, 2}, kFloat64, 10);
  const Tensor good = indices({0, 1, 2, 1});
  CHECK_THROWS_WITH_AS(gather_mul_scatter(x, indices({0, 3, 2, 1}), w, good, 3),
                       doctest::Contains("source index 3 (at position 1) is out of range for 3"),
                       Error);
  CHECK_THROWS_WITH_AS(gather_mul_scatter(x, good, w, indices({0, 1, -1, 1}), 3),
                       doctest::Contains("target index -1 (at position 2)"), Error);
  CHECK_THROWS_WITH_AS(gather_mul_scatter(x, good, w, indices({0, 1, 2}), 3),
                       doctest::Contains("target index must be [4]"), Error);
  CHECK_THROWS_WITH_AS(gather_mul_scatter(x, good, random_leaf({4, 3}, kFloat64, 11), good, 3),
                       doctest::Contains("rows must have one shape"), Error);
  CHECK_THROWS_WITH_AS(gather_mul_scatter(x, good, w.to(kFloat32), good, 3),
                       doctest::Contains("two float32 or two float64"), Error);
  CHECK_THROWS_WITH_AS(gather_product(x, good, w, indices({0, 1, 2, 4})),
                       doctest::Contains("index_b index 4 (at position 3)"), Error);
}
