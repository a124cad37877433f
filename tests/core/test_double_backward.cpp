// Derivatives of derivatives (core/autograd.h): the second-order check over the whole op table,
// Hessian-vector products against analytic values, grad()'s contract (no .grad touched, unused
// inputs, non-leaf inputs, several outputs, no gradient computed for an input not asked for),
// backward with create_graph, and the one error an op without a second derivative raises.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../second_order_check.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/linalg.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/ops/softmax.h"
#include "mpigrad/core/profiler.h"
#include "op_cases.h"

namespace {

using namespace mpigrad::core;  // NOLINT
using mpigrad::test::OpCase;

Tensor leaf(const std::vector<double>& values, Shape shape) {
  Tensor t = Tensor::from_vector(values, shape, kFloat64);
  t.set_requires_grad(true);
  return t;
}

std::vector<double> values_of(const Tensor& t) {
  return t.to_vector<double>();
}

void check_close(const std::vector<double>& actual, const std::vector<double>& expected,
                 double tolerance = 1e-10) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    INFO("element ", i);
    CHECK(actual[i] == doctest::Approx(expected[i]).epsilon(tolerance));
  }
}

// A node with a first derivative only: y = 2 x, differentiable once.
struct FirstOrderOnlyBackward final : Node {
  const char* name() const override { return "FirstOrderOnlyBackward"; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override { grads[0] = grad * 2.0; }
};

Tensor first_order_only(const Tensor& x) {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = x * 2.0;
  }
  if (any_requires_grad({&x})) set_history(out, std::make_shared<FirstOrderOnlyBackward>(), {&x});
  return out;
}

}  // namespace

TEST_CASE("op table: second derivatives match float64 finite differences of the gradient") {
  uint64_t seed = 100;
  int checked = 0;
  for (const OpCase& op : mpigrad::test::op_cases()) {
    ++seed;
    if (!op.differentiable) continue;
    INFO("op case: ", op.name);
    mpigrad::test::SecondOrderCheck check;
    check.build = op.build;
    check.seed = seed;
    for (const auto& input : op.inputs) {
      check.inputs.push_back(
          Tensor::from_vector(input.values, input.shape, input.fixed_dtype.value_or(kFloat64)));
      check.differentiable.push_back(!input.fixed_dtype.has_value());
    }
    try {
      const std::string mismatch = mpigrad::test::check_second_order(check);
      CHECK_MESSAGE(mismatch.empty(), mismatch);
      ++checked;
    } catch (const std::exception& e) {
      FAIL_CHECK("threw: " << std::string(e.what()));
    }
  }
  CHECK(checked > 40);
}

TEST_CASE("Hessian-vector products against analytic values") {
  const std::vector<double> x0 = {0.3, -1.2, 0.8, 2.0};
  const std::vector<double> v0 = {1.0, 0.5, -2.0, 0.25};
  const Tensor v = Tensor::from_vector(v0, {4}, kFloat64);

  SUBCASE("sum(x^3): H v = 6 x v") {
    Tensor x = leaf(x0, {4});
    Tensor g = grad({sum(pow(x, 3.0))}, {x}, {}, {.create_graph = true})[0];
    check_close(values_of(g), {3 * 0.09, 3 * 1.44, 3 * 0.64, 3 * 4.0});
    Tensor hv = grad({sum(g * v)}, {x})[0];
    std::vector<double> expected;
    for (size_t i = 0; i < 4; ++i) expected.push_back(6 * x0[i] * v0[i]);
    check_close(values_of(hv), expected);
  }
  SUBCASE("x^T A x: H v = (A + A^T) v") {
    const std::vector<double> a = {1, 2, 0, -1, 0.5, 3, 1, 0, -2, 1, 4, 0.5, 0, 1, -1, 2};
    Tensor A = Tensor::from_vector(a, {4, 4}, kFloat64);
    Tensor x = leaf(x0, {4});
    Tensor f = sum(x * matmul(A, x));
    Tensor g = grad({f}, {x}, {}, {.create_graph = true})[0];
    Tensor hv = grad({sum(g * v)}, {x})[0];
    std::vector<double> expected(4, 0.0);
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 4; ++j)
        expected[size_t(i)] += (a[size_t(4 * i + j)] + a[size_t(4 * j + i)]) * v0[size_t(j)];
    }
    check_close(values_of(hv), expected);
  }
  SUBCASE("log-sum-exp: H = diag(p) - p p^T") {
    Tensor x = leaf(x0, {4});
    Tensor f =
        sum(log_softmax(x, 0) * Tensor::from_vector<double>({-1.0, 0.0, 0.0, 0.0}, {4}, kFloat64));
    // f = -(x_0 - lse(x)) = lse(x) - x_0; its Hessian is that of lse.
    Tensor g = grad({f}, {x}, {}, {.create_graph = true})[0];
    Tensor hv = grad({sum(g * v)}, {x})[0];
    double z = 0;
    for (double value : x0) z += std::exp(value);
    std::vector<double> p;
    for (double value : x0) p.push_back(std::exp(value) / z);
    double pv = 0;
    for (size_t i = 0; i < 4; ++i) pv += p[i] * v0[i];
    std::vector<double> expected;
    for (size_t i = 0; i < 4; ++i) expected.push_back(p[i] * v0[i] - p[i] * pv);
    check_close(values_of(hv), expected);
  }
  SUBCASE("a third derivative: d3/dx3 sum(exp(2x)) = 8 exp(2x)") {
    Tensor x = leaf(x0, {4});
    Tensor f = sum(exp(x * 2.0));
    Tensor g1 = grad({f}, {x}, {}, {.create_graph = true})[0];
    Tensor g2 = grad({sum(g1)}, {x}, {}, {.create_graph = true})[0];
    Tensor g3 = grad({sum(g2)}, {x})[0];
    std::vector<double> expected;
    for (double value : x0) expected.push_back(8 * std::exp(2 * value));
    check_close(values_of(g3), expected);
  }
}

TEST_CASE("grad() returns gradients and leaves .grad alone") {
  Tensor x = leaf({1.0, 2.0}, {2});
  Tensor w = leaf({3.0, -1.0}, {2});
  Tensor y = sum(x * x * w);
  std::vector<Tensor> grads = grad({y}, {x}, {}, {.retain_graph = true});
  check_close(values_of(grads[0]), {6.0, -4.0});
  CHECK_FALSE(grads[0].requires_grad());
  CHECK_FALSE(x.grad().defined());
  CHECK_FALSE(w.grad().defined());  // w's accumulator never ran
  y.backward();
  check_close(values_of(x.grad()), {6.0, -4.0});
  check_close(values_of(w.grad()), {1.0, 4.0});
}

TEST_CASE("grad() takes results of ops, several outputs and their weights") {
  Tensor x = leaf({1.0, -2.0}, {2});
  Tensor h = x * 3.0;  // a result, not a leaf
  Tensor a = sum(h * h), b = h * 2.0;
  std::vector<Tensor> grads =
      grad({a, b}, {h, x}, {Tensor(), Tensor::from_vector<double>({1.0, 10.0}, {2}, kFloat64)});
  // d/dh: 2h + (2, 20); d/dx: 3 times that.
  check_close(values_of(grads[0]), {6.0 + 2.0, -12.0 + 20.0});
  check_close(values_of(grads[1]), {24.0, 24.0});
}

TEST_CASE("grad() names an input the outputs do not use, unless allow_unused") {
  Tensor x = leaf({1.0}, {1});
  Tensor unused = leaf({2.0}, {1});
  Tensor y = sum(x * 5.0);
  try {
    grad({y}, {x, unused}, {}, {.retain_graph = true});
    FAIL("an unused input was accepted");
  } catch (const Error& error) {
    CHECK(std::string(error.what()).find("grad: inputs[1] (shape [1]) was not used") !=
          std::string::npos);
  }
  std::vector<Tensor> grads = grad({y}, {x, unused}, {}, {.allow_unused = true});
  check_close(values_of(grads[0]), {5.0});
  CHECK_FALSE(grads[1].defined());
  Tensor constant = Tensor::from_vector<double>({1.0}, {1}, kFloat64);
  CHECK_THROWS_WITH_AS(grad({sum(x * 2.0)}, {constant}),
                       doctest::Contains("inputs[0] does not require grad"), Error);
}

TEST_CASE("backward with create_graph leaves a .grad that can be differentiated again") {
  Tensor x = leaf({0.5, -1.5}, {2});
  sum(pow(x, 4.0)).backward(Tensor(), false, /*create_graph=*/true);
  Tensor first = x.grad();
  REQUIRE(first.requires_grad());
  check_close(values_of(first), {4 * 0.125, 4 * -3.375});
  Tensor second = grad({sum(first)}, {x})[0];
  check_close(values_of(second), {12 * 0.25, 12 * 2.25});
}

TEST_CASE("create_graph through an op with no second derivative is one error naming it") {
  Tensor x = leaf({1.0, 2.0}, {2});
  Tensor y = sum(first_order_only(x) * x);
  // First order works as ever.
  check_close(values_of(grad({y}, {x}, {}, {.retain_graph = true})[0]), {4.0, 8.0});
  try {
    grad({y}, {x}, {}, {.create_graph = true});
    FAIL("create_graph went through an op without a second derivative");
  } catch (const Error& error) {
    const std::string message = error.what();
    CHECK(message.find("FirstOrderOnlyBackward has no second derivative yet") != std::string::npos);
  }
}

namespace {

// Passes its gradient to both inputs unchanged, and notes what gradient_needed said for each.
struct NeededProbe final : Node {
  std::vector<std::vector<bool>> seen;
  const char* name() const override { return "NeededProbe"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    seen.push_back({gradient_needed(*this, 0), gradient_needed(*this, 1)});
    if (seen.back()[0]) grads[0] = grad;
    if (seen.back()[1]) grads[1] = grad;
  }
};

// Counts the spans of each name.
class CountSpans final : public ProfileSink {
 public:
  void record(const ProfileEvent& event) noexcept override { ++counts[event.name]; }
  std::map<std::string, int> counts;
};

}  // namespace

// grad() runs only what leads to the tensors asked for, and tells a node which of its inputs
// those are, so that grad(energy, positions) computes no weight's gradient.
TEST_CASE("gradient_needed: in grad(), only the inputs that lead to a tensor asked for") {
  Tensor a = leaf({1.0, 2.0}, {2});
  Tensor w = leaf({3.0, 4.0}, {1, 2});
  // The second input reaches its leaf through a transpose, as a Linear's weight does: the
  // accumulator behind it must not count as asked for (it sorts after its parents).
  const Tensor twice = a * 2.0;
  const Tensor w_t = w.t().reshape({2});
  auto probe = std::make_shared<NeededProbe>();
  Tensor y = twice.detach() + w_t.detach();
  set_history(y, probe, {&twice, &w_t});
  const Tensor out = sum(y * y);

  std::vector<Tensor> da = grad({out}, {a}, {}, {.retain_graph = true});
  REQUIRE(probe->seen.size() == 1);
  CHECK(probe->seen[0] == std::vector<bool>{true, false});
  CHECK(da[0].defined());
  std::vector<Tensor> dw = grad({out}, {w}, {}, {.retain_graph = true});
  REQUIRE(probe->seen.size() == 2);
  CHECK(probe->seen[1] == std::vector<bool>{false, true});
  CHECK(dw[0].defined());
  std::vector<Tensor> both = grad({out}, {w, a}, {}, {.retain_graph = true});
  REQUIRE(probe->seen.size() == 3);
  CHECK(probe->seen[2] == std::vector<bool>{true, true});
  // backward() fills every leaf's .grad: every edge is needed.
  out.backward();
  REQUIRE(probe->seen.size() == 4);
  CHECK(probe->seen[3] == std::vector<bool>{true, true});
  CHECK(a.grad().defined());
  CHECK(w.grad().defined());
  // Outside the engine: whether the edge exists.
  CHECK(gradient_needed(*probe, 0));
  CHECK_FALSE(gradient_needed(*probe, 2));
}

TEST_CASE(
    "gradient_needed: a Linear's backward in grad() wrt its input skips the weight and bias") {
  // x W^T + b, then a nonlinearity, as in a force pass: grad() wrt x with create_graph.
  Tensor x = leaf({0.5, -1.0, 2.0, 0.25, 1.5, -0.75}, {3, 2});
  Tensor w = leaf({0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8}, {4, 2});
  Tensor b = leaf({0.1, -0.1, 0.2, -0.2}, {4});
  const auto energy = [&] { return sum(tanh(matmul(x, w.t()) + b)); };
  const auto count = [&](bool only_x) {
    Tensor e = energy();
    CountSpans sink;
    {
      ProfileSession session(sink);
      if (only_x) {
        grad({e}, {x}, {}, {.create_graph = true});
      } else {
        grad({e}, {x, w, b}, {}, {.create_graph = true});
      }
    }
    return sink.counts;
  };
  std::map<std::string, int> only_x = count(true), all = count(false);
  CHECK(only_x["gemm"] == 1);  // the input's gradient alone
  CHECK(all["gemm"] == 2);
  CHECK(only_x["sum"] == 0);  // no bias gradient summed over the rows
  CHECK(all["sum"] == 1);
  // And the gradient is the same either way.
  const Tensor e = energy();
  const std::vector<Tensor> alone = grad({e}, {x}, {}, {.retain_graph = true});
  const std::vector<Tensor> together = grad({e}, {x, w, b});
  check_close(values_of(alone[0]), values_of(together[0]), 1e-15);
}

// A force pass makes the positions a leaf inside the step function; once that returns, nobody
// holds them, and the training backward must not compute their gradient.
TEST_CASE("backward() runs no node whose gradient could reach only leaves nobody holds") {
  Tensor w = leaf({0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8}, {4, 2});
  const std::vector<double> x_values = {0.5, -1.0, 2.0, 0.25, 1.5, -0.75};
  Tensor kept_x;
  const auto energy = [&](bool keep_x) {
    Tensor x = leaf(x_values, {3, 2});
    if (keep_x) kept_x = x;
    return sum(tanh(matmul(x, w.t())));
  };
  const auto run = [&](bool keep_x) {
    w.set_grad(Tensor());
    Tensor e = energy(keep_x);
    CountSpans sink;
    {
      ProfileSession session(sink);
      e.backward();
    }
    return std::make_pair(sink.counts, values_of(w.grad()));
  };
  const auto [dead_counts, dead_grad] = run(false);
  const auto [live_counts, live_grad] = run(true);
  CHECK(dead_counts.at("gemm") == 1);  // the weight's gradient alone
  CHECK(live_counts.at("gemm") == 2);
  CHECK(dead_counts.at("AccumulateGrad") == 1);
  CHECK(live_counts.at("AccumulateGrad") == 2);
  check_close(dead_grad, live_grad, 1e-15);
  REQUIRE(kept_x.grad().defined());
}
