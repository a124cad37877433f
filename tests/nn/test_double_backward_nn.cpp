// Second derivatives of the nn functional ops and losses (tests/second_order_check.h): convolution
// (its backward's backward is convolution and transposed convolution), batch and layer norm in
// training and evaluation, max pooling through its winners, average and adaptive pooling, the
// losses (cross-entropy with and without ignored labels, MSE, L1, BCE with logits), dropout with
// a fixed mask, and embedding.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "../second_order_check.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/nn/functional/conv.h"
#include "mpigrad/nn/functional/normalization.h"
#include "mpigrad/nn/functional/pooling.h"
#include "mpigrad/nn/loss.h"

namespace {

using namespace mpigrad;  // NOLINT
using core::Shape;
using core::Tensor;
namespace F = nn::functional;

// Distinct values in a scrambled order (no ties for max pooling, no zero for L1).
Tensor values(Shape shape, double scale = 0.37, double shift = -1.1, int multiplier = 7) {
  const int64_t n = shape.numel();
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i)
    v.push_back(double((multiplier * i) % n) * scale / double(n) * 4 + shift);
  return Tensor::from_vector(v, shape, core::kFloat64);
}

struct Case {
  std::string name;
  std::vector<Tensor> inputs;
  std::vector<bool> differentiable;
  mpigrad::test::SecondOrderCheck::Build build;
};

std::vector<Case> cases() {
  std::vector<Case> all;
  const auto add = [&](std::string name, std::vector<Tensor> inputs, std::vector<bool> diff,
                       mpigrad::test::SecondOrderCheck::Build build) {
    all.push_back({std::move(name), std::move(inputs), std::move(diff), std::move(build)});
  };
  // Convolution: the product of input and weight makes every second derivative a cross term,
  // so tanh after it makes the pure ones non-zero too.
  // Variants 4 and 5 drop the taps that see only padding (nn/functional/conv.h): a 1x1 image,
  // and a stride-2 kernel on a 2x2 one.
  for (int variant = 0; variant < 6; ++variant) {
    F::Conv2dOptions o;
    Shape x_shape{2, 4, 5, 5}, w_shape{6, 4, 3, 3};
    if (variant == 1) o.stride = {2, 1}, o.padding = {1, 0};
    if (variant == 2) o.dilation = {2, 2}, o.padding = {1, 1};
    if (variant == 3) o.groups = 2, w_shape = {6, 2, 3, 3};
    if (variant == 4) x_shape = {2, 4, 1, 1}, o.padding = {1, 1};
    if (variant == 5) x_shape = {2, 4, 2, 2}, o.stride = {2, 2}, o.padding = {1, 1};
    add("conv2d variant " + std::to_string(variant),
        {values({x_shape}, 0.8), values({w_shape}, 0.6, -0.4, 5), values({6}, 0.2, -0.1, 1)},
        {true, true, true}, [o](const std::vector<Tensor>& in) {
          return core::tanh(F::conv2d(in[0], in[1], in[2], o));
        });
  }
  add("batch_norm training",
      {values({3, 2, 2, 2}), values({2}, 0.5, 0.8, 1), values({2}, 0.3, 0.1, 1)},
      {true, true, true}, [](const std::vector<Tensor>& in) {
        return core::tanh(F::batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], true, 0.1, 1e-5));
      });
  add("batch_norm eval", {values({3, 2, 2, 2}), values({2}, 0.5, 0.8, 1), values({2}, 0.3, 0.1, 1)},
      {true, true, true}, [](const std::vector<Tensor>& in) {
        Tensor running_mean = Tensor::from_vector<double>({0.2, -0.1}, {2}, core::kFloat64);
        Tensor running_var = Tensor::from_vector<double>({1.5, 0.7}, {2}, core::kFloat64);
        return core::tanh(
            F::batch_norm(in[0], running_mean, running_var, in[1], in[2], false, 0.1, 1e-5));
      });
  add("layer_norm", {values({3, 2, 4}), values({2, 4}, 0.5, 0.8, 3), values({2, 4}, 0.3, 0.1, 3)},
      {true, true, true}, [](const std::vector<Tensor>& in) {
        return core::tanh(F::layer_norm(in[0], {2, 4}, in[1], in[2], 1e-5));
      });
  add("max_pool2d", {values({2, 2, 5, 5})}, {true}, [](const std::vector<Tensor>& in) {
    F::Pool2dOptions o;
    o.kernel_size = {3, 3};
    o.stride = {2, 2};
    o.padding = {1, 1};
    return core::tanh(F::max_pool2d(in[0], o));
  });
  // The winners the CPU records as taps of their window, turned into flat positions for the
  // scatter: 2x2 (the byte taps of the 2x2 routines), disjoint 3x3 windows with padding, and a
  // window of more than 256 taps (Int32 taps).
  add("max_pool2d 2x2", {values({2, 2, 6, 7})}, {true}, [](const std::vector<Tensor>& in) {
    F::Pool2dOptions o;
    o.kernel_size = {2, 2};
    return core::tanh(F::max_pool2d(in[0], o));
  });
  add("max_pool2d 3x3 stride 3 padding 1", {values({2, 2, 7, 5})}, {true},
      [](const std::vector<Tensor>& in) {
        F::Pool2dOptions o;
        o.kernel_size = {3, 3};
        o.padding = {1, 1};
        return core::tanh(F::max_pool2d(in[0], o));
      });
  add("max_pool2d 17x16 stride 2", {values({1, 2, 19, 18})}, {true},
      [](const std::vector<Tensor>& in) {
        F::Pool2dOptions o;
        o.kernel_size = {17, 16};
        o.stride = {2, 2};
        return core::tanh(F::max_pool2d(in[0], o));
      });
  add("avg_pool2d", {values({2, 2, 5, 5})}, {true}, [](const std::vector<Tensor>& in) {
    F::Pool2dOptions o;
    o.kernel_size = {2, 3};
    o.stride = {2, 1};
    return core::tanh(F::avg_pool2d(in[0], o));
  });
  add("adaptive_avg_pool2d", {values({2, 3, 5, 4})}, {true}, [](const std::vector<Tensor>& in) {
    return core::tanh(F::adaptive_avg_pool2d(in[0], {3, 2}));
  });
  const Tensor labels = Tensor::from_vector<int64_t>({2, 0, 1, -100, 3}, {5});
  add("cross_entropy (one ignored label)", {values({5, 4}, 2.0), labels}, {true, false},
      [](const std::vector<Tensor>& in) { return nn::cross_entropy(in[0], in[1]).reshape({1}); });
  add("cross_entropy with label smoothing", {values({5, 4}, 2.0), labels}, {true, false},
      [](const std::vector<Tensor>& in) {
        nn::CrossEntropyOptions o;
        o.label_smoothing = 0.1;
        return nn::cross_entropy(in[0], in[1], o).reshape({1});
      });
  add("cross_entropy per row", {values({5, 4}, 2.0), labels}, {true, false},
      [](const std::vector<Tensor>& in) {
        nn::CrossEntropyOptions o;
        o.reduction = nn::Reduction::None;
        return nn::cross_entropy(in[0], in[1], o);
      });
  add("mse_loss", {values({3, 4}), values({3, 4}, 0.5, 0.2, 5)}, {true, true},
      [](const std::vector<Tensor>& in) {
        return nn::mse_loss(core::tanh(in[0]), in[1]).reshape({1});
      });
  add("l1_loss", {values({3, 4}), values({3, 4}, 0.5, 0.2, 5)}, {true, true},
      [](const std::vector<Tensor>& in) {
        return nn::l1_loss(core::tanh(in[0]), in[1]).reshape({1});
      });
  add("binary_cross_entropy_with_logits", {values({3, 4}), values({3, 4}, 0.25, 0.4, 5)},
      {true, true}, [](const std::vector<Tensor>& in) {
        return nn::binary_cross_entropy_with_logits(in[0] * in[0], in[1]).reshape({1});
      });
  add("embedding", {values({5, 3}), Tensor::from_vector<int64_t>({1, 4, 1, 0}, {2, 2})},
      {true, false},
      [](const std::vector<Tensor>& in) { return core::tanh(core::embedding(in[0], in[1])); });
  return all;
}

}  // namespace

TEST_CASE("nn functional ops and losses: second derivatives match finite differences") {
  uint64_t seed = 500;
  for (const Case& c : cases()) {
    INFO("case: ", c.name);
    mpigrad::test::SecondOrderCheck check;
    check.build = c.build;
    check.inputs = c.inputs;
    check.differentiable = c.differentiable;
    check.seed = ++seed;
    try {
      const std::string mismatch = mpigrad::test::check_second_order(check);
      CHECK_MESSAGE(mismatch.empty(), mismatch);
    } catch (const std::exception& e) {
      FAIL_CHECK("threw: " << std::string(e.what()));
    }
  }
}
