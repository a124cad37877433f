// Second derivatives of the nn functional ops on CUDA against the CPU (core/autograd.h's
// create_graph): convolution (cuDNN's C, D and F), batch norm in training, layer norm, max
// pooling (whose winners cuDNN does not keep: they are found again on the CPU), average pooling
// and cross-entropy. For f = sum(op(x) * w) the gradient is taken with create_graph, and the
// gradient of sum(g * g) / 2 + sum(g) (a Hessian-vector product) is compared, in float64.
#include <functional>
#include <string>
#include <vector>

#include "mpigrad/core/cuda.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/nn/functional/conv.h"
#include "mpigrad/nn/functional/normalization.h"
#include "mpigrad/nn/functional/pooling.h"
#include "mpigrad/nn/loss.h"
#include "nn_cuda_test.h"

namespace {

using namespace mpigrad;  // NOLINT
using core::Tensor;
namespace F = nn::functional;
using Build = std::function<Tensor(const std::vector<Tensor>&)>;

Tensor scrambled(core::Shape shape, double scale) {
  const int64_t n = shape.numel();
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(double((7 * i) % n) / double(n) * scale - scale / 2);
  return Tensor::from_vector(v, shape, core::kFloat64);
}

// The Hessian-vector products of `build` at `inputs` (the first `differentiable` of them) on
// `device`.
std::vector<Tensor> hessian_vector(const Build& build, std::vector<Tensor> inputs,
                                   size_t differentiable, core::Device device) {
  std::vector<Tensor> wrt;
  for (size_t k = 0; k < inputs.size(); ++k) {
    inputs[k] = inputs[k].to(device);
    if (k < differentiable) {
      inputs[k].set_requires_grad(true);
      wrt.push_back(inputs[k]);
    }
  }
  const Tensor out = build(inputs);
  std::vector<Tensor> g =
      core::grad({out}, wrt, {core::ones_like(out) * 0.75}, {.create_graph = true});
  Tensor s;
  for (const Tensor& gk : g) {
    const Tensor term = core::sum(gk * gk * 0.5 + gk);
    s = s.defined() ? s + term : term;
  }
  std::vector<Tensor> h = core::grad({s}, wrt, {}, {.allow_unused = true});
  for (size_t k = 0; k < wrt.size(); ++k) {
    if (!h[k].defined()) h[k] = core::zeros_like(wrt[k]);
  }
  return h;
}

void check(const std::string& name, const Build& build, const std::vector<Tensor>& inputs,
           size_t differentiable) {
  INFO("case: ", name);
  const auto expected = hessian_vector(build, inputs, differentiable, core::kCPU);
  const auto actual = hessian_vector(build, inputs, differentiable, core::cuda(0));
  REQUIRE(actual.size() == expected.size());
  for (size_t k = 0; k < actual.size(); ++k) {
    CHECK_MESSAGE(test::mismatch(actual[k], expected[k], {1e-8, 1e-8}).empty(),
                  "second derivative of input ", k);
  }
}

}  // namespace

MPIGRAD_NN_CUDA_TEST_CASE("second derivatives of conv, norms, pooling and cross-entropy on CUDA") {
  F::Conv2dOptions conv;
  conv.padding = {1, 1};
  conv.groups = 2;
  check(
      "conv2d",
      [conv](const std::vector<Tensor>& in) {
        return core::tanh(F::conv2d(in[0], in[1], in[2], conv));
      },
      {scrambled({2, 4, 5, 5}, 1.6), scrambled({6, 2, 3, 3}, 1.2), scrambled({6}, 0.4)}, 3);
  check(
      "batch_norm (training)",
      [](const std::vector<Tensor>& in) {
        return core::tanh(F::batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], true, 0.1, 1e-5));
      },
      {scrambled({3, 2, 4, 4}, 2.0), scrambled({2}, 1.0) + 1.0, scrambled({2}, 0.5)}, 3);
  check(
      "layer_norm",
      [](const std::vector<Tensor>& in) {
        return core::tanh(F::layer_norm(in[0], {8}, in[1], in[2], 1e-5));
      },
      {scrambled({5, 8}, 2.0), scrambled({8}, 1.0) + 1.0, scrambled({8}, 0.5)}, 3);
  check(
      "max_pool2d (winners found on the CPU)",
      [](const std::vector<Tensor>& in) {
        F::Pool2dOptions o;
        o.kernel_size = {2, 2};
        return core::tanh(F::max_pool2d(in[0], o)) * in[0].narrow(2, 0, 2).narrow(3, 0, 2);
      },
      {scrambled({2, 3, 4, 4}, 2.0)}, 1);
  check(
      "avg_pool2d",
      [](const std::vector<Tensor>& in) {
        F::Pool2dOptions o;
        o.kernel_size = {3, 3};
        o.stride = {1, 1};
        return core::tanh(F::avg_pool2d(in[0], o));
      },
      {scrambled({2, 3, 5, 5}, 2.0)}, 1);
  check(
      "cross_entropy",
      [](const std::vector<Tensor>& in) { return nn::cross_entropy(in[0], in[1]).reshape({1}); },
      {scrambled({6, 5}, 3.0), Tensor::from_vector<int64_t>({0, 4, 2, 2, -100, 1}, {6})}, 1);
}
