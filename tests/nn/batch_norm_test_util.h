// What the tests of the fused batch norm ops (test_batch_norm_relu.cpp,
// test_batch_norm_relu_max_pool.cpp) share: seeded normal values, bitwise comparison, the node an
// output came from, one call's leaves and running statistics, and the check that a create_graph
// backward through a fused op gives its composition's first and second derivatives.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::test {

inline std::vector<double> normal_values(int64_t n, uint32_t seed, double centre, double spread) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> draw(centre, spread);
  std::vector<double> values(static_cast<size_t>(n));
  for (double& v : values) v = draw(rng);
  return values;
}

// `values` (made in float64) as a tensor of `dtype`.
inline core::Tensor from(const std::vector<double>& values, const core::Shape& shape,
                         core::DType dtype = core::kFloat32) {
  return core::Tensor::from_vector(values, shape, core::kFloat64).to(dtype);
}

inline core::Tensor normal(const core::Shape& shape, uint32_t seed, double centre = 0.0,
                           double spread = 1.0, core::DType dtype = core::kFloat32) {
  return from(normal_values(shape.numel(), seed, centre, spread), shape, dtype);
}

// Bitwise equality of two defined tensors of the same shape and dtype (NaN payloads included).
inline bool same_bits(const core::Tensor& a, const core::Tensor& b) {
  if (!a.defined() || !b.defined() || a.shape() != b.shape() || a.dtype() != b.dtype()) {
    return false;
  }
  const core::Tensor da = a.detach().contiguous(), db = b.detach().contiguous();
  return std::memcmp(da.data_ptr(), db.data_ptr(), size_t(da.nbytes())) == 0;
}

inline std::string node_name(const core::Tensor& t) {
  return t.grad_fn() ? t.grad_fn()->name() : "(leaf)";
}

// The leaves and running statistics of one batch norm call, and fresh copies of them.
struct BatchNormInputs {
  core::Tensor x, weight, bias, running_mean, running_var;

  BatchNormInputs copy() const {
    BatchNormInputs c;
    c.x = x.detach().clone().set_requires_grad(true);
    if (weight.defined()) c.weight = weight.detach().clone().set_requires_grad(true);
    if (bias.defined()) c.bias = bias.detach().clone().set_requires_grad(true);
    if (running_mean.defined()) c.running_mean = running_mean.clone();
    if (running_var.defined()) c.running_var = running_var.clone();
    return c;
  }
};

// x centred so that ReLU keeps about half of each channel; channel 0 has weight 0 and bias 0, so
// its output is exactly 0 (ReLU's mask is off at 0, and every pooling window there a tie of +0).
inline BatchNormInputs make_inputs(const core::Shape& shape, core::DType dtype = core::kFloat32) {
  const int64_t channels = shape[1];
  BatchNormInputs in;
  in.x = normal(shape, 1, 0.7, 2.0, dtype);
  std::vector<double> weight = normal_values(channels, 2, 1.0, 0.4);
  std::vector<double> bias = normal_values(channels, 3, 0.0, 0.3);
  weight[0] = bias[0] = 0.0;
  in.weight = from(weight, {channels}, dtype);
  in.bias = from(bias, {channels}, dtype);
  in.running_mean = normal({channels}, 4, 0.1, 0.5, dtype);
  in.running_var = normal({channels}, 5, 2.0, 0.3, dtype);
  return in.copy();
}

// A create_graph backward through `fused` (whose output's node is `fused_node`) gives
// `composed`'s first derivatives bit for bit, with a graph on the input's and the weight's; its
// first-order gradients match the fused kernel's own backward to float rounding; and the second
// derivatives of sum(dx^2) + sum(dw^2) match bit for bit and are not all zero.
template <typename Fused, typename Composed>
void check_create_graph_matches(const BatchNormInputs& start, Fused fused, Composed composed,
                                uint32_t grad_seed, const char* fused_node) {
  BatchNormInputs a = start.copy(), b = start.copy();
  core::Tensor ya = fused(a), yb = composed(b);
  REQUIRE(node_name(ya) == std::string(fused_node));
  const core::Tensor grad = normal(yb.shape(), grad_seed);
  core::GradOptions create;
  create.create_graph = true;
  std::vector<core::Tensor> ga = core::grad({ya}, {a.x, a.weight, a.bias}, {grad}, create);
  std::vector<core::Tensor> gb = core::grad({yb}, {b.x, b.weight, b.bias}, {grad}, create);
  REQUIRE(ga.size() == 3);
  // The bias's gradient, a sum of the constant incoming gradient, has no graph of its own.
  CHECK(ga[0].requires_grad());
  CHECK(ga[1].requires_grad());
  for (size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK(same_bits(ga[i], gb[i]));
  }
  {
    BatchNormInputs c = start.copy();
    core::Tensor yc = fused(c);
    yc.backward(grad);
    const double scale = core::max(core::abs(c.x.grad())).item<double>();
    CHECK(core::max(core::abs(core::sub(c.x.grad(), ga[0].detach()))).item<double>() <
          1e-5 * scale);
  }
  const auto second = [](const std::vector<core::Tensor>& g, BatchNormInputs& in) {
    core::Tensor s = core::add(core::sum(core::mul(g[0], g[0])), core::sum(core::mul(g[1], g[1])));
    return core::grad({s}, {in.x, in.weight});
  };
  std::vector<core::Tensor> sa = second(ga, a), sb = second(gb, b);
  CHECK(same_bits(sa[0], sb[0]));
  CHECK(same_bits(sa[1], sb[1]));
  CHECK(core::max(core::abs(sa[0])).item<double>() > 0.0);
}

}  // namespace mpigrad::test
