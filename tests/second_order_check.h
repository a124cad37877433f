// The second-order gradient check shared by the op tests (core ops, nn functional ops, ONNX
// graphs): for f(x) = sum(build(x) * w) with fixed weights w, the gradient g = df/dx is computed
// with create_graph, s(x) = sum_k <g_k(x), u_k> for fixed u, and grad(s), a Hessian-vector
// product, is compared with central finite differences of s in float64, where s is evaluated
// with first-order gradients only. A gradient that came back without a graph (a silent zero
// second derivative) fails unless the finite differences are zero too.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/tensor.h"
#include "nn/gradcheck.h"  // fd_weights: fixed, distinct, non-zero weights

namespace mpigrad::test {

struct SecondOrderCheck {
  using Build = std::function<core::Tensor(const std::vector<core::Tensor>&)>;
  Build build;
  // The inputs' values (float64); `differentiable[k]` marks those differentiated (the others,
  // indices or masks, are passed as they are).
  std::vector<core::Tensor> inputs;
  std::vector<bool> differentiable;
  uint64_t seed = 1;
  double step = 1e-5;
  double tolerance = 1e-5;  // absolute and relative
};

namespace detail {

// s(x) = sum_k <df/dx_k, u_k> at `values`, with first-order gradients only.
inline double gradient_dot(const SecondOrderCheck& check, const std::vector<core::Tensor>& values,
                           const std::vector<double>& weights,
                           const std::vector<std::vector<double>>& directions) {
  std::vector<core::Tensor> inputs, wrt;
  for (size_t k = 0; k < values.size(); ++k) {
    core::Tensor input = values[k].clone();
    if (check.differentiable[k]) {
      input.set_requires_grad(true);
      wrt.push_back(input);
    }
    inputs.push_back(input);
  }
  core::Tensor out = check.build(inputs);
  core::Tensor w = core::Tensor::from_vector(weights, out.shape(), out.dtype());
  std::vector<core::Tensor> grads = core::grad({out}, wrt, {w}, {.allow_unused = true});
  double total = 0;
  for (size_t k = 0; k < grads.size(); ++k) {
    if (!grads[k].defined()) continue;
    const std::vector<double> g = grads[k].to_vector<double>();
    for (size_t i = 0; i < g.size(); ++i) total += g[i] * directions[k][i];
  }
  return total;
}

}  // namespace detail

// "" when grad(s) matches the finite differences of s; otherwise the first mismatch.
inline std::string check_second_order(const SecondOrderCheck& check) {
  using core::Tensor;
  std::vector<Tensor> inputs, wrt;
  for (size_t k = 0; k < check.inputs.size(); ++k) {
    Tensor input = check.inputs[k].clone();
    if (check.differentiable[k]) {
      input.set_requires_grad(true);
      wrt.push_back(input);
    }
    inputs.push_back(input);
  }
  Tensor out = check.build(inputs);
  if (!out.requires_grad()) return "the output does not require grad";
  const std::vector<double> weights = fd_weights(out.numel(), check.seed);
  std::vector<std::vector<double>> directions;
  for (size_t k = 0; k < wrt.size(); ++k) {
    directions.push_back(fd_weights(wrt[k].numel(), check.seed * 31 + k + 7));
  }
  Tensor w = Tensor::from_vector(weights, out.shape(), out.dtype());
  std::vector<Tensor> grads =
      core::grad({out}, wrt, {w}, {.create_graph = true, .allow_unused = true});
  Tensor s;
  for (size_t k = 0; k < grads.size(); ++k) {
    if (!grads[k].defined()) continue;
    Tensor u = Tensor::from_vector(directions[k], grads[k].shape(), grads[k].dtype());
    Tensor term = core::sum(grads[k] * u);
    s = s.defined() ? s + term : term;
  }
  std::vector<Tensor> hessian_vector(wrt.size());
  if (s.defined() && s.requires_grad()) {
    hessian_vector = core::grad({s}, wrt, {}, {.allow_unused = true});
  }
  std::vector<Tensor> values;
  for (const Tensor& input : check.inputs) values.push_back(input.clone());
  size_t d = 0;
  for (size_t k = 0; k < values.size(); ++k) {
    if (!check.differentiable[k]) continue;
    const std::vector<double> analytic = hessian_vector[d].defined()
                                             ? hessian_vector[d].to_vector<double>()
                                             : std::vector<double>(size_t(values[k].numel()), 0.0);
    double* data = values[k].data<double>();
    for (int64_t i = 0; i < values[k].numel(); ++i) {
      const double original = data[i];
      data[i] = original + check.step;
      const double plus = detail::gradient_dot(check, values, weights, directions);
      data[i] = original - check.step;
      const double minus = detail::gradient_dot(check, values, weights, directions);
      data[i] = original;
      const double numeric = (plus - minus) / (2 * check.step);
      const double allowed = check.tolerance * (1 + std::abs(numeric));
      if (!(std::abs(analytic[size_t(i)] - numeric) <= allowed)) {
        std::ostringstream out_text;
        out_text.precision(10);
        out_text << "input " << k << " element " << i << ": Hessian-vector product "
                 << analytic[size_t(i)] << ", finite differences " << numeric
                 << (hessian_vector[d].defined() ? "" : " (the gradient had no graph)");
        return out_text.str();
      }
    }
    ++d;
  }
  return "";
}

}  // namespace mpigrad::test
