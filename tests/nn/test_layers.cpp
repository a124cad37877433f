// Layer tests: forward values against naive references or hand-computed numbers, and float64
// finite-difference checks of every gradient (inputs and parameters) for every layer.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "mpigrad/core/autocast.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/nn/functional/conv.h"
#include "mpigrad/nn/functional/normalization.h"
#include "mpigrad/nn/functional/padding.h"
#include "mpigrad/nn/functional/pooling.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/batch_norm.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/layers/conv.h"
#include "mpigrad/nn/layers/dropout.h"
#include "mpigrad/nn/layers/embedding.h"
#include "mpigrad/nn/layers/layer_norm.h"
#include "mpigrad/nn/layers/linear.h"
#include "mpigrad/nn/layers/pooling.h"

namespace {

using namespace mpigrad;  // NOLINT
using core::Tensor;
using mpigrad::test::fd_input;
using mpigrad::test::gradient_mismatch;

// Direct 7-loop convolution, the reference for the im2col + GEMM path.
std::vector<double> naive_conv2d(const Tensor& x, const Tensor& w, const Tensor& b,
                                 const nn::functional::Conv2dOptions& o) {
  const auto xs = x.shape(), ws = w.shape();
  const int64_t n = xs[0], c = xs[1], h = xs[2], wd = xs[3], oc = ws[0], kh = ws[2], kw = ws[3];
  const int64_t g = o.groups, cg = c / g, ocg = oc / g;
  const int64_t oh = (h + 2 * o.padding[0] - o.dilation[0] * (kh - 1) - 1) / o.stride[0] + 1;
  const int64_t ow = (wd + 2 * o.padding[1] - o.dilation[1] * (kw - 1) - 1) / o.stride[1] + 1;
  const auto xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const auto bv = b.defined() ? b.to_vector<double>() : std::vector<double>(size_t(oc), 0.0);
  std::vector<double> out(size_t(n * oc * oh * ow));
  for (int64_t in = 0; in < n; ++in)
    for (int64_t o_c = 0; o_c < oc; ++o_c)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t xx = 0; xx < ow; ++xx) {
          double total = bv[size_t(o_c)];
          const int64_t group = o_c / ocg;
          for (int64_t ic = 0; ic < cg; ++ic)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t sy = y * o.stride[0] - o.padding[0] + i * o.dilation[0];
                const int64_t sx = xx * o.stride[1] - o.padding[1] + j * o.dilation[1];
                if (sy < 0 || sy >= h || sx < 0 || sx >= wd) continue;
                total += xv[size_t(((in * c + group * cg + ic) * h + sy) * wd + sx)] *
                         wv[size_t(((o_c * cg + ic) * kh + i) * kw + j)];
              }
          out[size_t(((in * oc + o_c) * oh + y) * ow + xx)] = total;
        }
  return out;
}

struct ConvCase {
  const char* name;
  core::Shape input, weight;
  nn::functional::Conv2dOptions options;
  bool bias;
};

nn::functional::Conv2dOptions conv_options(int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                                           int64_t dh, int64_t dw, int64_t groups) {
  nn::functional::Conv2dOptions o;
  o.stride = {sh, sw};
  o.padding = {ph, pw};
  o.dilation = {dh, dw};
  o.groups = groups;
  return o;
}

}  // namespace

// conv2d under autocast (core/autocast.h) against float32, output and all three gradients. bf16
// operands carry 8 significant bits and fp16 ones 11, the sums are fp32, and each output adds up
// to 18 products of O(1) values: within 5e-2 (bf16) and 5e-3 (fp16), absolute and relative.
void check_autocast_conv(const Tensor& x64, const Tensor& w64, const Tensor& b64,
                         const nn::functional::Conv2dOptions& options) {
  auto run = [&](std::optional<core::DType> autocast) {
    Tensor x = x64.to(core::kFloat32).detach();
    Tensor w = w64.to(core::kFloat32).detach();
    Tensor b = b64.defined() ? b64.to(core::kFloat32).detach() : Tensor();
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    if (b.defined()) b.set_requires_grad(true);
    Tensor y;
    {
      core::AutocastGuard guard(autocast);
      y = nn::functional::conv2d(x, w, b, options);
    }
    CHECK(y.dtype() == core::kFloat32);
    core::sum(y * core::tanh(core::arange(y.numel(), core::kFloat32).view(y.shape()) * 0.37 - 2.0))
        .backward();
    std::vector<std::vector<float>> results{y.to_vector<float>(), x.grad().to_vector<float>(),
                                            w.grad().to_vector<float>()};
    if (b.defined()) results.push_back(b.grad().to_vector<float>());
    return results;
  };
  const auto reference = run(std::nullopt);
  for (core::DType dtype : {core::kBFloat16, core::kFloat16}) {
    INFO("autocast ", core::dtype_name(dtype));
    const double tolerance = dtype == core::kBFloat16 ? 5e-2 : 5e-3;
    const auto low = run(dtype);
    for (size_t r = 0; r < low.size(); ++r) {
      INFO("result ", r, " (output, grad x, grad w, grad b)");
      REQUIRE(low[r].size() == reference[r].size());
      for (size_t i = 0; i < low[r].size(); ++i) {
        CHECK(std::abs(low[r][i] - reference[r][i]) <=
              tolerance * (1.0 + std::abs(reference[r][i])));
      }
    }
  }
}

TEST_CASE("conv2d matches a direct convolution and finite differences") {
  const std::vector<ConvCase> cases = {
      {"3x3 padding 1", {2, 2, 5, 5}, {3, 2, 3, 3}, conv_options(1, 1, 1, 1, 1, 1, 1), true},
      {"stride 2, padding 1", {1, 2, 6, 5}, {2, 2, 3, 3}, conv_options(2, 2, 1, 1, 1, 1, 1), true},
      {"asymmetric stride/padding/kernel",
       {1, 1, 5, 6},
       {2, 1, 2, 3},
       conv_options(1, 2, 0, 1, 1, 1, 1),
       true},
      {"dilation 2", {1, 2, 6, 6}, {2, 2, 3, 3}, conv_options(1, 1, 2, 2, 2, 2, 1), false},
      {"groups 2", {2, 4, 4, 4}, {6, 2, 3, 3}, conv_options(1, 1, 1, 1, 1, 1, 2), true},
      {"depthwise with stride",
       {1, 3, 5, 5},
       {3, 1, 3, 3},
       conv_options(2, 2, 1, 1, 1, 1, 3),
       true},
      {"1x1 direct path", {2, 3, 3, 4}, {4, 3, 1, 1}, conv_options(1, 1, 0, 0, 1, 1, 1), true},
      {"1x1 grouped direct path",
       {1, 4, 2, 3},
       {2, 2, 1, 1},
       conv_options(1, 1, 0, 0, 1, 1, 2),
       false},
  };
  uint64_t seed = 10;
  for (const ConvCase& c : cases) {
    INFO("conv case: ", c.name);
    Tensor x = fd_input(c.input, ++seed);
    Tensor w = fd_input(c.weight, ++seed);
    Tensor b = c.bias ? fd_input({c.weight[0]}, ++seed) : Tensor();
    const std::vector<double> expected = naive_conv2d(x, w, b, c.options);
    const std::vector<double> got = nn::functional::conv2d(x, w, b, c.options).to_vector<double>();
    REQUIRE(got.size() == expected.size());
    for (size_t i = 0; i < got.size(); ++i)
      CHECK(got[i] == doctest::Approx(expected[i]).epsilon(1e-12));
    // float32 agrees too (the training dtype).
    const std::vector<float> got32 =
        nn::functional::conv2d(x.to(core::kFloat32), w.to(core::kFloat32),
                               b.defined() ? b.to(core::kFloat32) : Tensor(), c.options)
            .to_vector<float>();
    for (size_t i = 0; i < got32.size(); ++i)
      CHECK(got32[i] == doctest::Approx(expected[i]).epsilon(1e-5));

    std::vector<Tensor> leaves{x, w};
    if (b.defined()) leaves.push_back(b);
    const std::string mismatch = gradient_mismatch(
        leaves, [&] { return nn::functional::conv2d(x, w, b, c.options); }, seed);
    CHECK_MESSAGE(mismatch.empty(), mismatch);
    check_autocast_conv(x, w, b, c.options);
  }
}

TEST_CASE("Conv2d with circular padding convolves a periodic domain") {
  // A 3x3 stencil on a periodic 5x6 grid: out[n, o, i, j] = sum w[o, c, a, b] *
  // x[n, c, (i + a - 1) mod H, (j + b - 1) mod W] + bias[o].
  core::Generator generator(11);
  nn::Conv2dConfig config;
  config.in_channels = 2;
  config.out_channels = 3;
  config.padding = {1, 1};
  config.padding_mode = nn::PaddingMode::Circular;
  nn::Conv2d conv(config, generator);
  conv.to(core::kFloat64);
  Tensor x = fd_input({2, 2, 5, 6}, 21);
  const std::vector<double> xs = x.to_vector<double>(), ws = conv.weight().to_vector<double>();
  const std::vector<double> bs = conv.bias().to_vector<double>();
  const std::vector<double> got = conv.forward(x).to_vector<double>();
  REQUIRE(got.size() == size_t(2 * 3 * 5 * 6));
  for (int64_t n = 0; n < 2; ++n) {
    for (int64_t o = 0; o < 3; ++o) {
      for (int64_t i = 0; i < 5; ++i) {
        for (int64_t j = 0; j < 6; ++j) {
          double expected = bs[size_t(o)];
          for (int64_t c = 0; c < 2; ++c) {
            for (int64_t a = 0; a < 3; ++a) {
              for (int64_t b = 0; b < 3; ++b) {
                const int64_t row = (i + a - 1 + 5) % 5, column = (j + b - 1 + 6) % 6;
                expected += ws[size_t(((o * 2 + c) * 3 + a) * 3 + b)] *
                            xs[size_t(((n * 2 + c) * 5 + row) * 6 + column)];
              }
            }
          }
          CHECK(got[size_t(((n * 3 + o) * 5 + i) * 6 + j)] ==
                doctest::Approx(expected).epsilon(1e-12));
        }
      }
    }
  }
  CHECK(conv.extra_repr().find("padding_mode=circular") != std::string::npos);
  std::vector<Tensor> leaves{x, conv.weight(), conv.bias()};
  const std::string mismatch = gradient_mismatch(
      leaves, [&] { return conv.forward(x); }, 31);
  CHECK_MESSAGE(mismatch.empty(), mismatch);
  // The same padding as torch's F.pad(mode="circular") refuses more padding than the extent.
  CHECK_THROWS_WITH_AS(nn::functional::pad_circular(x, {6, 1}),
                       doctest::Contains("must be in [0, 5]"), core::Error);
}

TEST_CASE("conv2d of an empty batch: empty output, zero weight and bias gradients") {
  const core::TensorOptions options(core::kFloat64);
  Tensor x = core::ones({0, 2, 5, 5}, options).set_requires_grad();
  Tensor w = core::ones({3, 2, 3, 3}, options).set_requires_grad();
  Tensor b = core::ones({3}, options).set_requires_grad();
  Tensor y = nn::functional::conv2d(x, w, b, {});
  CHECK(y.shape() == core::Shape({0, 3, 3, 3}));
  core::sum(y).backward();
  CHECK(x.grad().shape() == x.shape());
  CHECK(w.grad().to_vector<double>() == std::vector<double>(54, 0.0));
  CHECK(b.grad().to_vector<double>() == std::vector<double>(3, 0.0));
}

TEST_CASE("conv2d hands the weight's and bias's gradients over before computing the input's") {
  // DDP starts a bucket from these hooks: they must fire before the data gradient is computed,
  // so the input's gradient is not there yet in them (x is a leaf, whose hook runs later).
  const core::TensorOptions options(core::kFloat64);
  Tensor x = core::ones({2, 2, 5, 5}, options).set_requires_grad();
  Tensor w = core::ones({3, 2, 3, 3}, options).set_requires_grad();
  Tensor b = core::ones({3}, options).set_requires_grad();
  std::vector<std::string> order;
  bool input_grad_absent = true;
  auto hook = [&](const char* name) {
    return [&, name](Tensor&) {
      order.emplace_back(name);
      if (std::string(name) != "x") input_grad_absent = input_grad_absent && !x.grad().defined();
    };
  };
  w.register_grad_ready_hook(hook("w"));
  b.register_grad_ready_hook(hook("b"));
  x.register_grad_ready_hook(hook("x"));
  core::sum(nn::functional::conv2d(x, w, b, {})).backward();
  CHECK(order == std::vector<std::string>{"w", "b", "x"});
  CHECK(input_grad_absent);
  CHECK(w.grad().to_vector<double>() == std::vector<double>(54, 18.0));  // 2 images x 9 outputs
  CHECK(b.grad().to_vector<double>() == std::vector<double>(3, 18.0));
}

TEST_CASE("conv2d reports bad shapes") {
  Tensor x = core::zeros({1, 3, 4, 4}, core::kFloat64);
  CHECK_THROWS_WITH_AS(
      nn::functional::conv2d(x, core::zeros({2, 2, 3, 3}, core::kFloat64), Tensor()),
      doctest::Contains("expects 2 input channels"), core::Error);
  CHECK_THROWS_WITH_AS(
      nn::functional::conv2d(x, core::zeros({2, 3, 5, 5}, core::kFloat64), Tensor()),
      doctest::Contains("smaller than the dilated kernel"), core::Error);
  nn::functional::Conv2dOptions groups;
  groups.groups = 2;
  CHECK_THROWS_AS(
      nn::functional::conv2d(x, core::zeros({2, 1, 3, 3}, core::kFloat64), Tensor(), groups),
      core::Error);
}

TEST_CASE("Linear and Conv2d use PyTorch's default init bounds and names") {
  core::Generator generator(3);
  nn::Linear linear(16, 4, generator);
  CHECK(linear.weight().shape() == core::Shape({4, 16}));
  const double bound = 1.0 / std::sqrt(16.0);
  CHECK(core::max(core::abs(linear.weight())).item<double>() <= bound);
  CHECK(core::max(core::abs(linear.bias())).item<double>() <= bound);
  // The draws fill the range, not a narrow part of it.
  CHECK(core::max(core::abs(linear.weight())).item<double>() > 0.8 * bound);

  nn::Conv2d conv(3, 8, 3, generator, 1, 1);
  CHECK(conv.weight().shape() == core::Shape({8, 3, 3, 3}));
  const double conv_bound = 1.0 / std::sqrt(27.0);
  CHECK(core::max(core::abs(conv.weight())).item<double>() <= conv_bound);
  CHECK(core::max(core::abs(conv.bias())).item<double>() <= conv_bound);
  CHECK(conv.str() == "Conv2d(3, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))");

  // Same seed, same model.
  core::Generator again(3);
  nn::Linear twin(16, 4, again);
  CHECK(twin.weight().to_vector<float>() == linear.weight().to_vector<float>());
}

TEST_CASE("Linear and Embedding gradients match finite differences") {
  core::Generator generator(5);
  nn::Linear linear(3, 2, generator);
  linear.to(core::kFloat64);
  Tensor x = fd_input({4, 3}, 7);
  std::string mismatch =
      gradient_mismatch({x, linear.weight(), linear.bias()}, [&] { return linear(x); });
  CHECK_MESSAGE(mismatch.empty(), mismatch);

  nn::Embedding embedding(5, 3, generator);
  embedding.to(core::kFloat64);
  Tensor indices = Tensor::from_vector<int64_t>({1, 4, 1, 0}, {2, 2});
  CHECK(embedding(indices).shape() == core::Shape({2, 2, 3}));
  mismatch = gradient_mismatch({embedding.weight()}, [&] { return embedding(indices); });
  CHECK_MESSAGE(mismatch.empty(), mismatch);
}

TEST_CASE("BatchNorm in training mode: values, running statistics and gradients") {
  nn::BatchNorm1d bn(3);
  bn.to(core::kFloat64);
  // [N=4, C=3]; channel 0 is 1,2,3,4: mean 2.5, biased var 1.25, unbiased 5/3.
  Tensor x = Tensor::from_vector<double>({1, 0.5, -2, 2, 0.1, 3, 3, -0.7, 1, 4, 2.2, 0}, {4, 3});
  Tensor y = bn(x);
  const auto yv = y.to_vector<double>();
  CHECK(yv[0] == doctest::Approx((1 - 2.5) / std::sqrt(1.25 + 1e-5)));
  CHECK(yv[9] == doctest::Approx((4 - 2.5) / std::sqrt(1.25 + 1e-5)));
  CHECK(bn.buffer("running_mean").to_vector<double>()[0] == doctest::Approx(0.1 * 2.5));
  CHECK(bn.buffer("running_var").to_vector<double>()[0] == doctest::Approx(0.9 + 0.1 * 5.0 / 3.0));
  CHECK(bn.buffer("num_batches_tracked").item<int64_t>() == 1);

  // Gradients through the batch statistics: [N, C], [N, C, L] and 2-d.
  nn::BatchNorm1d bn1(3);
  bn1.to(core::kFloat64);
  {
    core::NoGradGuard no_grad;
    bn1.parameter("weight").copy_(Tensor::from_vector<double>({0.5, -1.5, 2.0}, {3}));
    bn1.parameter("bias").copy_(Tensor::from_vector<double>({0.1, 0.2, -0.3}, {3}));
  }
  std::string mismatch = gradient_mismatch({x, bn1.parameter("weight"), bn1.parameter("bias")},
                                           [&] { return bn1(x); });
  CHECK_MESSAGE(mismatch.empty(), mismatch);

  Tensor x3 = fd_input({3, 2, 4}, 21);
  nn::BatchNorm1d bn3(2);
  bn3.to(core::kFloat64);
  mismatch = gradient_mismatch({x3, bn3.parameter("weight")}, [&] { return bn3(x3) * x3; });
  CHECK_MESSAGE(mismatch.empty(), mismatch);

  Tensor x4 = fd_input({2, 3, 3, 2}, 22);
  nn::BatchNorm2d bn2(3);
  bn2.to(core::kFloat64);
  mismatch = gradient_mismatch({x4, bn2.parameter("weight"), bn2.parameter("bias")},
                               [&] { return bn2(x4); });
  CHECK_MESSAGE(mismatch.empty(), mismatch);
}

TEST_CASE("batch_norm updates running statistics of another dtype and layout in place") {
  // The backends blend dense running statistics of the data's dtype; these (float64 for float32
  // data, strided views) go through a temporary and are written back into the views.
  // [N=4, C=2]: channel 0 is 1,2,3,4 (mean 2.5, unbiased var 5/3), channel 1 is all 0.
  Tensor x = Tensor::from_vector<float>({1, 0, 2, 0, 3, 0, 4, 0}, {4, 2});
  Tensor mean_storage = Tensor::from_vector<double>({0, -7, 0, -7}, {2, 2});
  Tensor var_storage = Tensor::from_vector<double>({1, -7, 1, -7}, {2, 2});
  Tensor running_mean = mean_storage.select(1, 0);
  Tensor running_var = var_storage.select(1, 0);
  REQUIRE_FALSE(running_mean.is_contiguous());
  Tensor y =
      nn::functional::batch_norm(x, running_mean, running_var, Tensor(), Tensor(), true, 0.1, 1e-5);
  CHECK(y.dtype() == core::kFloat32);
  const auto means = mean_storage.to_vector<double>();
  const auto vars = var_storage.to_vector<double>();
  CHECK(means[0] == doctest::Approx(0.1 * 2.5));
  CHECK(means[2] == doctest::Approx(0.0));
  CHECK(vars[0] == doctest::Approx(0.9 + 0.1 * 5.0 / 3.0));
  CHECK(vars[2] == doctest::Approx(0.9));
  CHECK(means[1] == -7);  // the other column of each storage is untouched
  CHECK(vars[3] == -7);
}

TEST_CASE("BatchNorm in eval mode uses running statistics") {
  nn::BatchNorm2d bn(2, 1e-5, 0.5);
  bn.to(core::kFloat64);
  Tensor x = fd_input({4, 2, 3, 3}, 31);
  bn(x);
  bn(x * 2.0);
  bn.eval();
  const double mean = bn.buffer("running_mean").to_vector<double>()[1];
  const double var = bn.buffer("running_var").to_vector<double>()[1];
  Tensor probe = fd_input({1, 2, 2, 2}, 32);
  const auto out = bn(probe).to_vector<double>();
  const auto in = probe.to_vector<double>();
  CHECK(out[5] == doctest::Approx((in[5] - mean) / std::sqrt(var + 1e-5)));
  CHECK(bn.buffer("num_batches_tracked").item<int64_t>() == 2);  // eval does not count
  const std::string mismatch = gradient_mismatch(
      {probe, bn.parameter("weight"), bn.parameter("bias")}, [&] { return bn(probe); });
  CHECK_MESSAGE(mismatch.empty(), mismatch);

  // momentum unset: a cumulative average over batches.
  nn::BatchNorm1d cumulative(1, 1e-5, std::nullopt);
  cumulative.to(core::kFloat64);
  cumulative(Tensor::from_vector<double>({1, 3}, {2, 1}));
  cumulative(Tensor::from_vector<double>({5, 7}, {2, 1}));
  CHECK(cumulative.buffer("running_mean").item<double>() == doctest::Approx(4.0));
}

TEST_CASE("LayerNorm values and gradients") {
  nn::LayerNorm ln({4});
  ln.to(core::kFloat64);
  Tensor x = Tensor::from_vector<double>({1, 2, 3, 4, -1, 0, 1, 6}, {2, 4});
  const auto y = ln(x).to_vector<double>();
  CHECK(y[0] == doctest::Approx(-1.5 / std::sqrt(1.25 + 1e-5)));
  {
    core::NoGradGuard no_grad;
    ln.parameter("weight").copy_(Tensor::from_vector<double>({0.5, 1.5, -1, 2}, {4}));
    ln.parameter("bias").copy_(Tensor::from_vector<double>({0.1, 0, 0.3, -0.2}, {4}));
  }
  std::string mismatch =
      gradient_mismatch({x, ln.parameter("weight"), ln.parameter("bias")}, [&] { return ln(x); });
  CHECK_MESSAGE(mismatch.empty(), mismatch);
  nn::LayerNorm ln2({2, 3});
  ln2.to(core::kFloat64);
  Tensor x2 = fd_input({2, 2, 3}, 41);
  mismatch = gradient_mismatch({x2, ln2.parameter("weight")}, [&] { return ln2(x2); });
  CHECK_MESSAGE(mismatch.empty(), mismatch);
}

// Rows wider than the kernel's 64-column blocks for the weight and bias gradients (150: two
// blocks and a tail), with and without the affine vectors, against the same normalization written
// in core ops, forward and backward.
TEST_CASE("LayerNorm over wide rows matches its formula in core ops") {
  const int64_t rows = 5, cols = 150;
  Tensor x = fd_input({rows, cols}, 61);
  Tensor weight = fd_input({cols}, 62), bias = fd_input({cols}, 63);
  Tensor upstream = fd_input({rows, cols}, 64);
  for (bool affine : {true, false}) {
    INFO("affine ", affine);
    Tensor a = x.detach().clone().set_requires_grad(true);
    Tensor b = x.detach().clone().set_requires_grad(true);
    Tensor w1 = weight.detach().clone().set_requires_grad(true);
    Tensor w2 = weight.detach().clone().set_requires_grad(true);
    Tensor c1 = bias.detach().clone().set_requires_grad(true);
    Tensor c2 = bias.detach().clone().set_requires_grad(true);
    Tensor y =
        nn::functional::layer_norm(a, {cols}, affine ? w1 : Tensor(), affine ? c1 : Tensor(), 1e-5);
    const Tensor centred = b - core::mean(b, {1}, true);
    Tensor expected = centred / core::sqrt(core::mean(centred * centred, {1}, true) + 1e-5);
    if (affine) expected = expected * w2 + c2;
    CHECK(core::max(core::abs(y - expected)).item<double>() < 1e-12);
    core::sum(y * upstream).backward();
    core::sum(expected * upstream).backward();
    CHECK(core::max(core::abs(a.grad() - b.grad())).item<double>() < 1e-12);
    if (affine) {
      CHECK(core::max(core::abs(w1.grad() - w2.grad())).item<double>() < 1e-12);
      CHECK(core::max(core::abs(c1.grad() - c2.grad())).item<double>() < 1e-12);
    }
  }
}

TEST_CASE("pooling values and gradients") {
  // 1x1x4x4 with distinct values (no ties, so max pooling is differentiable everywhere).
  std::vector<double> values;
  for (int i = 0; i < 16; ++i) values.push_back(((i * 7) % 16) * 0.25 - 2.0);
  Tensor x = Tensor::from_vector(values, {1, 1, 4, 4});
  nn::MaxPool2d max2(2);
  CHECK(max2(x).to_vector<double>() == std::vector<double>{1.0, 1.5, 1.75, 1.25});
  nn::AvgPool2d avg2(2);
  CHECK(avg2(x).to_vector<double>() == std::vector<double>{-0.625, -0.125, 0.375, -0.125});
  nn::AdaptiveAvgPool2d global(1);
  CHECK(global(x).item<double>() == doctest::Approx(-0.125));
  CHECK(max2.str() == "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)");

  Tensor big = fd_input({2, 2, 5, 5}, 51);
  nn::MaxPool2d max3(3, 2, 1);
  nn::AvgPool2d avg_pad(3, 2, 1, true);
  nn::AvgPool2d avg_nopad(3, 2, 1, false);
  nn::AdaptiveAvgPool2d adaptive(std::array<int64_t, 2>{3, 2});
  // Padding: a corner window of avg_pad divides by 9, of avg_nopad by 4.
  const double corner = (big.to_vector<double>()[0] + big.to_vector<double>()[1] +
                         big.to_vector<double>()[5] + big.to_vector<double>()[6]);
  CHECK(avg_pad(big).to_vector<double>()[0] == doctest::Approx(corner / 9));
  CHECK(avg_nopad(big).to_vector<double>()[0] == doctest::Approx(corner / 4));
  CHECK(adaptive(big).shape() == core::Shape({2, 2, 3, 2}));
  for (nn::Module* pool : std::vector<nn::Module*>{&max3, &avg_pad, &avg_nopad, &adaptive, &max2}) {
    INFO("pool: ", pool->str());
    const std::string mismatch = gradient_mismatch({big}, [&] { return (*pool)(big); });
    CHECK_MESSAGE(mismatch.empty(), mismatch);
  }
}

TEST_CASE("pooling names its op in errors and its backward node") {
  Tensor x = fd_input({1, 1, 4, 4}, 52);
  x.set_requires_grad(true);
  nn::functional::Pool2dOptions o;
  o.kernel_size = {2, 2};
  CHECK(std::string(nn::functional::max_pool2d(x, o).grad_fn()->name()) == "MaxPool2dBackward");
  CHECK(std::string(nn::functional::avg_pool2d(x, o).grad_fn()->name()) == "AvgPool2dBackward");
  CHECK(std::string(nn::functional::adaptive_avg_pool2d(x, {2, 2}).grad_fn()->name()) ==
        "AdaptiveAvgPool2dBackward");
  Tensor flat = fd_input({4}, 53);
  CHECK_THROWS_WITH_AS(nn::functional::max_pool2d(flat, o), doctest::Contains("max_pool2d: "),
                       core::Error);
  CHECK_THROWS_WITH_AS(nn::functional::avg_pool2d(flat, o), doctest::Contains("avg_pool2d: "),
                       core::Error);
  CHECK_THROWS_WITH_AS(nn::functional::adaptive_avg_pool2d(flat, {2, 2}),
                       doctest::Contains("adaptive_avg_pool2d: "), core::Error);
  // A 2x2 window does not fit a 1-wide or 1-high input (the output size's numerator is -1, which
  // truncating division would have turned into one output reading past the plane).
  for (const core::Shape& shape : {core::Shape{1, 1, 4, 1}, core::Shape{1, 1, 1, 4}}) {
    const Tensor thin = fd_input(shape, 54);
    CHECK_THROWS_WITH_AS(nn::functional::max_pool2d(thin, o), doctest::Contains("too small"),
                         core::Error);
    CHECK_THROWS_WITH_AS(nn::functional::avg_pool2d(thin, o), doctest::Contains("too small"),
                         core::Error);
  }
}

TEST_CASE("max pooling lets NaN win and takes -inf windows, with the matching index") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  // Windows: {1, nan, 3, 2} -> nan at 1; {-inf, -inf, -inf, -inf} -> -inf at its first element.
  Tensor x = Tensor::from_vector<double>({1, nan, -inf, -inf, 3, 2, -inf, -inf}, {1, 1, 2, 4})
                 .set_requires_grad();
  nn::MaxPool2d pool(2);
  Tensor y = pool(x);
  std::vector<double> out = y.to_vector<double>();
  CHECK(std::isnan(out[0]));
  CHECK(out[1] == -inf);
  core::sum(y).backward();  // each window's gradient lands on the element its index names
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 1, 1, 0, 0, 0, 0, 0});
  // The general window loop (3x3, stride 1, padding 1) follows the same rule as the 2x2 one:
  // every window that covers the NaN at column 1 is NaN; the last column's sees only -inf.
  nn::MaxPool2d general(3, 1, 1);
  std::vector<double> wide = general(x.detach()).to_vector<double>();
  CHECK((std::isnan(wide[0]) && std::isnan(wide[1]) && std::isnan(wide[2])));
  CHECK(wide[3] == -inf);
  CHECK((std::isnan(wide[4]) && std::isnan(wide[5]) && std::isnan(wide[6])));
  CHECK(wide[7] == -inf);
}

TEST_CASE("max pooling's recorded winners give the same gradient on every backward path") {
  // Float32 with ties, signed zeros, -inf and NaN. The first-order backward reads the window
  // taps the forward recorded (2x2: the vector routines; disjoint windows: one write per input;
  // overlapping: zero and scatter); the create_graph backward turns the same taps into flat
  // positions for a scatter_add. Both must give the same bits.
  const auto pattern = [](core::Shape shape, int multiplier, bool with_specials) {
    const float specials[] = {-0.0f, 0.0f, -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN()};
    std::vector<float> data;
    for (int64_t i = 0; i < shape.numel(); ++i) {
      data.push_back(with_specials && i % 17 == 0 ? specials[(i / 17) % 4]
                                                  : float((i * multiplier) % 11) * 0.375f - 2.0f);
    }
    return Tensor::from_vector(data, shape, core::kFloat32);
  };
  struct Window {
    int64_t kernel, stride, padding;
  } windows[] = {{2, 2, 0}, {3, 3, 1}, {2, 3, 1}, {3, 2, 1}, {17, 1, 0}};
  for (const Window& w : windows) {
    INFO("kernel ", w.kernel, " stride ", w.stride, " padding ", w.padding);
    nn::functional::Pool2dOptions o;
    o.kernel_size = {w.kernel, w.kernel};
    o.stride = {w.stride, w.stride};
    o.padding = {w.padding, w.padding};
    // The 17x17 window (289 taps: Int32 taps) needs a larger input.
    const Tensor input =
        pattern(w.kernel == 17 ? core::Shape{2, 3, 20, 19} : core::Shape{2, 3, 11, 13}, 7, true)
            .set_requires_grad(true);
    const Tensor y = nn::functional::max_pool2d(input, o);
    // Gradients without infinities or NaN (a NaN gradient would hide a difference); the sine
    // makes sums on shared winners round differently in another order.
    const Tensor upstream = core::sin(pattern(y.shape(), 3, false));
    const Tensor fast = core::grad({y}, {input}, {upstream})[0];
    const Tensor y2 = nn::functional::max_pool2d(input, o);
    const Tensor graph = core::grad({y2}, {input}, {upstream}, {.create_graph = true})[0];
    const std::vector<float> a = fast.to_vector<float>(), b = graph.detach().to_vector<float>();
    REQUIRE(a.size() == b.size());
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("activations, Flatten, Identity and Sequential") {
  Tensor x = fd_input({2, 3}, 61);
  std::vector<std::shared_ptr<nn::Module>> modules = {
      std::make_shared<nn::ReLU>(),
      std::make_shared<nn::GELU>(),
      std::make_shared<nn::GELU>(core::GeluApproximation::Tanh),
      std::make_shared<nn::SiLU>(),
      std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Sigmoid>(),
      std::make_shared<nn::Identity>()};
  for (auto& module : modules) {
    INFO("module: ", module->str());
    const std::string mismatch = gradient_mismatch({x}, [&] { return (*module)(x); });
    CHECK_MESSAGE(mismatch.empty(), mismatch);
  }
  CHECK(nn::Sigmoid()(x).to_vector<double>()[0] ==
        doctest::Approx(1.0 / (1.0 + std::exp(-x.to_vector<double>()[0]))));

  core::Generator generator(1);
  nn::Sequential net{std::make_shared<nn::Conv2d>(1, 2, 3, generator, 1, 1),
                     std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2),
                     std::make_shared<nn::Flatten>(),
                     std::make_shared<nn::Linear>(8, 3, generator)};
  net.to(core::kFloat64);
  Tensor image = fd_input({2, 1, 4, 4}, 62);
  CHECK(net(image).shape() == core::Shape({2, 3}));
  std::vector<Tensor> leaves{image};
  for (auto& p : net.parameters()) leaves.push_back(p);
  const std::string mismatch = gradient_mismatch(leaves, [&] { return net(image); });
  CHECK_MESSAGE(mismatch.empty(), mismatch);
}

TEST_CASE("Dropout is deterministic, scales survivors and is the identity in eval") {
  Tensor x = core::ones({1000}, core::kFloat64);
  nn::Dropout drop(0.25, nullptr, 7);
  Tensor a = drop(x);
  const auto av = a.to_vector<double>();
  int zeros = 0;
  for (double v : av) {
    CHECK((v == 0.0 || v == doctest::Approx(1.0 / 0.75)));
    zeros += v == 0.0;
  }
  CHECK(zeros > 180);
  CHECK(zeros < 320);
  nn::Dropout same(0.25, nullptr, 7);
  CHECK(same(x).to_vector<double>() == av);  // same seed, same mask
  CHECK(drop(x).to_vector<double>() != av);  // the stream moves on
  drop.eval();
  CHECK(drop(x).is_same(x));

  // Gradient: the same mask scales the gradient (the generator is rewound per evaluation).
  auto generator = std::make_shared<core::Generator>(9);
  nn::Dropout seeded(0.5, generator);
  Tensor input = fd_input({3, 4}, 71);
  const std::string mismatch = gradient_mismatch({input}, [&] {
    generator->set_state(9, 0);
    return seeded(input);
  });
  CHECK_MESSAGE(mismatch.empty(), mismatch);
}
