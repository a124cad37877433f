// The CPU convolution's paths (kernels/conv.h): every case runs forward and backward through
// im2col + GEMM, through oneDNN and (depthwise cases) through the direct loops, forced with
// kernels::cpu::set_conv2d_path_override, and the outputs and all gradients must agree within
// float32 rounding (and bfloat16 rounding under autocast, where the CPU has AVX512-BF16). Also:
// the rule's per-family choices and the dtypes that never reach oneDNN.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "conv_test_util.h"
#include "mpigrad/core/autocast.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/backend.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/join.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/kernels/conv.h"
#include "mpigrad/kernels/matmul.h"
#include "mpigrad/nn/functional/conv.h"

namespace {

using namespace mpigrad;  // NOLINT
using core::Tensor;
using kernels::cpu::ConvPass;
using kernels::cpu::ConvPath;

using test::PathGuard;

struct PathCase {
  const char* name;
  int64_t batch, channels, height, width, out_channels, kernel_h, kernel_w;
  int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups;
  bool bias;
};

const PathCase kCases[] = {
    {"3x3 padding 1, bias", 2, 8, 9, 9, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},
    {"3x3 no bias, batch 1", 1, 16, 7, 7, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, false},
    {"7x7 stride 2 stem, 3 channels", 2, 3, 17, 17, 16, 7, 7, 2, 2, 3, 3, 1, 1, 1, true},
    {"4x4 stride 4 patchify", 2, 3, 16, 16, 24, 4, 4, 4, 4, 0, 0, 1, 1, 1, true},
    {"stride 2, even input (a row of padding unused)", 3, 8, 8, 10, 8, 3, 3, 2, 2, 1, 1, 1, 1, 1,
     false},
    {"asymmetric kernel, stride, padding", 2, 5, 9, 11, 7, 2, 3, 1, 2, 0, 1, 1, 1, 1, true},
    {"dilation 2", 2, 6, 10, 10, 6, 3, 3, 1, 1, 2, 2, 2, 2, 1, true},
    {"dilation 2x3 with stride 2", 1, 4, 13, 12, 8, 3, 3, 2, 2, 2, 3, 2, 3, 1, false},
    {"groups 2", 2, 8, 6, 6, 12, 3, 3, 1, 1, 1, 1, 1, 1, 2, true},
    {"groups 4, 1x1", 2, 16, 5, 5, 8, 1, 1, 1, 1, 0, 0, 1, 1, 4, false},
    {"depthwise 3x3", 2, 32, 8, 8, 32, 3, 3, 1, 1, 1, 1, 1, 1, 32, true},
    {"depthwise 3x3 stride 2, odd channels", 2, 17, 9, 9, 17, 3, 3, 2, 2, 1, 1, 1, 1, 17, false},
    {"depthwise 5x5 stride 2", 3, 48, 8, 8, 48, 5, 5, 2, 2, 2, 2, 1, 1, 48, true},
    {"depthwise 7x7 on 2x2 (kernel mostly padding)", 2, 64, 2, 2, 64, 7, 7, 1, 1, 3, 3, 1, 1, 64,
     true},
    {"depthwise 7x7 on 1x1", 4, 32, 1, 1, 32, 7, 7, 1, 1, 3, 3, 1, 1, 32, false},
    {"depthwise multiplier 2", 2, 8, 6, 6, 16, 3, 3, 1, 1, 1, 1, 1, 1, 8, true},
    {"1x1", 2, 24, 6, 6, 40, 1, 1, 1, 1, 0, 0, 1, 1, 1, true},
    {"1x1 stride 2", 2, 16, 8, 8, 32, 1, 1, 2, 2, 0, 0, 1, 1, 1, false},
    {"1x1 on 1x1 images", 8, 64, 1, 1, 96, 1, 1, 1, 1, 0, 0, 1, 1, 1, true},
    // Over 1 MiB of output: the GEMM path writes the bias image by image (core/backend.cpp).
    {"1x1, an output over 1 MiB", 2, 8, 48, 48, 64, 1, 1, 1, 1, 0, 0, 1, 1, 1, true},
    {"2x2 stride 2 downsample", 2, 16, 8, 8, 32, 2, 2, 2, 2, 0, 0, 1, 1, 1, true},
    // Unstrided stems: the direct stem loops' forward and filter gradient (the Direct path).
    {"3x3 stem, 1 channel", 2, 1, 12, 13, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},
    {"5x5 stem, 3 channels, 6 out (a partial block)", 2, 3, 11, 10, 6, 5, 5, 1, 1, 2, 2, 1, 1, 1,
     true},
    {"3x3 stem, 2 channels, no bias", 1, 2, 9, 9, 5, 3, 3, 1, 1, 0, 0, 1, 1, 1, false},
};

nn::functional::Conv2dOptions options_of(const PathCase& c) {
  nn::functional::Conv2dOptions o;
  o.stride = {c.stride_h, c.stride_w};
  o.padding = {c.pad_h, c.pad_w};
  o.dilation = {c.dilation_h, c.dilation_w};
  o.groups = c.groups;
  return o;
}

struct Results {
  std::vector<float> y, grad_x, grad_w, grad_b;
};

// A fixed, uneven upstream gradient for y.
Tensor upstream_of(const Tensor& y) {
  return core::sin(core::arange(y.numel(), y.dtype()).view(y.shape()) * 0.37) + 0.25;
}

// Forward and backward (with a fixed, uneven upstream gradient) on `path`.
Results run(ConvPath path, const Tensor& x0, const Tensor& w0, const Tensor& b0,
            const nn::functional::Conv2dOptions& options,
            std::optional<core::DType> autocast = std::nullopt) {
  PathGuard guard(path);
  Tensor x = x0.detach().set_requires_grad(true);
  Tensor w = w0.detach().set_requires_grad(true);
  Tensor b = b0.defined() ? b0.detach().set_requires_grad(true) : Tensor();
  Tensor y;
  {
    core::AutocastGuard cast(autocast);
    y = nn::functional::conv2d(x, w, b, options);
  }
  core::sum(y * upstream_of(y)).backward();
  Results r{y.to_vector<float>(), x.grad().to_vector<float>(), w.grad().to_vector<float>(), {}};
  if (b.defined()) r.grad_b = b.grad().to_vector<float>();
  return r;
}

// |a - b| <= tolerance * (1 + max |reference|), element by element.
void check_close(const std::vector<float>& gemm, const std::vector<float>& onednn, double tolerance,
                 const char* what) {
  INFO(what);
  REQUIRE(gemm.size() == onednn.size());
  double scale = 1;
  for (float v : gemm) scale = std::max(scale, double(std::fabs(v)));
  double worst = 0;
  for (size_t i = 0; i < gemm.size(); ++i) {
    CHECK(std::isfinite(onednn[i]));
    worst = std::max(worst, std::fabs(double(gemm[i]) - double(onednn[i])));
  }
  CHECK_MESSAGE(worst <= tolerance * scale, "max difference ", worst, " at scale ", scale);
}

core::Conv2dShape shape_of(const PathCase& c) {
  return test::conv_shape_of(c);
}

}  // namespace

TEST_CASE("conv2d: oneDNN and direct paths match the im2col + GEMM path, float32, every pass") {
  core::Generator generator(33);
  for (const PathCase& c : kCases) {
    INFO("case: ", c.name);
    const Tensor x = core::randn({c.batch, c.channels, c.height, c.width}, generator);
    const Tensor w =
        core::randn({c.out_channels, c.channels / c.groups, c.kernel_h, c.kernel_w}, generator);
    const Tensor b = c.bias ? core::randn({c.out_channels}, generator) : Tensor();
    const auto options = options_of(c);
    const Results gemm = run(ConvPath::Gemm, x, w, b, options);
    const Results onednn = run(ConvPath::OneDnn, x, w, b, options);
    check_close(gemm.y, onednn.y, 1e-5, "output");
    check_close(gemm.grad_x, onednn.grad_x, 1e-5, "grad x");
    check_close(gemm.grad_w, onednn.grad_w, 1e-5, "grad w");
    check_close(gemm.grad_b, onednn.grad_b, 1e-5, "grad b");
    const Results direct = run(ConvPath::Direct, x, w, b, options);  // GEMM unless depthwise
    check_close(gemm.y, direct.y, 1e-5, "output (direct)");
    check_close(gemm.grad_x, direct.grad_x, 1e-5, "grad x (direct)");
    check_close(gemm.grad_w, direct.grad_w, 1e-5, "grad w (direct)");
    check_close(gemm.grad_b, direct.grad_b, 1e-5, "grad b (direct)");
    // And all agree with the rule's mix of paths.
    const Results rule = run(ConvPath::Rule, x, w, b, options);
    check_close(gemm.y, rule.y, 1e-5, "output (rule)");
    check_close(gemm.grad_x, rule.grad_x, 1e-5, "grad x (rule)");
    check_close(gemm.grad_w, rule.grad_w, 1e-5, "grad w (rule)");
    check_close(gemm.grad_b, rule.grad_b, 1e-5, "grad b (rule)");
  }
}

TEST_CASE("conv2d: forcing oneDNN really runs oneDNN's own kernels for float32") {
  // conv2d_onednn returns false (the GEMM path then runs) only where oneDNN has nothing but its
  // reference kernel; none of these cases may fall back, or the comparison above proves nothing.
  core::Generator generator(34);
  for (const PathCase& c : kCases) {
    INFO("case: ", c.name);
    const core::Conv2dShape s = shape_of(c);
    const auto& g = s.geometry;
    const Tensor x = core::randn({c.batch, c.channels, c.height, c.width}, generator);
    const Tensor w =
        core::randn({c.out_channels, c.channels / c.groups, c.kernel_h, c.kernel_w}, generator);
    const Tensor gy = core::randn({c.batch, c.out_channels, g.out_h, g.out_w}, generator);
    Tensor y = core::empty(gy.shape()), gx = core::empty(x.shape()), gw = core::empty(w.shape());
    for (ConvPass pass : {ConvPass::Forward, ConvPass::BackwardData, ConvPass::BackwardFilter}) {
      const std::string kernel =
          kernels::cpu::conv2d_onednn_implementation(pass, core::kFloat32, core::kFloat32, s);
      INFO("pass ", int(pass), ": ", kernel);
      CHECK(kernel.rfind("ref", 0) != 0);
    }
    CHECK(kernels::cpu::conv2d_onednn(ConvPass::Forward, core::kFloat32, core::kFloat32, s,
                                      x.data_ptr(), w.data_ptr(), y.data_ptr()));
    CHECK(kernels::cpu::conv2d_onednn(ConvPass::BackwardData, core::kFloat32, core::kFloat32, s,
                                      gy.data_ptr(), w.data_ptr(), gx.data_ptr()));
    CHECK(kernels::cpu::conv2d_onednn(ConvPass::BackwardFilter, core::kFloat32, core::kFloat32, s,
                                      x.data_ptr(), gy.data_ptr(), gw.data_ptr()));
  }
}

TEST_CASE("conv2d: asymmetric padding (explicit pad, then a valid convolution) on both paths") {
  // ONNX pads a convolution asymmetrically through an explicit pad (nn/onnx/onnx_ops_nn.cpp):
  // here one column on the right and one row on top, as zeros joined on.
  core::Generator generator(35);
  const Tensor x0 = core::randn({2, 6, 7, 9}, generator);
  const Tensor w = core::randn({6, 1, 3, 3}, generator);
  const Tensor b = core::randn({6}, generator);
  nn::functional::Conv2dOptions options;
  options.groups = 6;
  options.stride = {2, 2};
  std::vector<std::vector<float>> outputs;
  for (ConvPath path : {ConvPath::Gemm, ConvPath::OneDnn}) {
    PathGuard guard(path);
    Tensor x = x0.detach().set_requires_grad(true);
    Tensor wider = core::cat({x, core::zeros({2, 6, 7, 1})}, 3);
    Tensor padded = core::cat({core::zeros({2, 6, 1, 10}), wider}, 2);
    Tensor y = nn::functional::conv2d(padded, w, b, options);
    core::sum(y * y).backward();
    outputs.push_back(y.to_vector<float>());
    outputs.push_back(x.grad().to_vector<float>());
  }
  check_close(outputs[0], outputs[2], 1e-5, "output");
  check_close(outputs[1], outputs[3], 1e-5, "grad x");
}

TEST_CASE("conv2d: the oneDNN path matches the GEMM path under bfloat16 autocast") {
  if (!kernels::cpu::has_native_bf16()) {
    MESSAGE("skipped: this CPU has no AVX512-BF16, so bf16 convolution never reaches oneDNN");
    return;
  }
  core::Generator generator(36);
  for (const PathCase& c : kCases) {
    INFO("case: ", c.name);
    const Tensor x = core::randn({c.batch, c.channels, c.height, c.width}, generator);
    const Tensor w =
        core::randn({c.out_channels, c.channels / c.groups, c.kernel_h, c.kernel_w}, generator);
    const Tensor b = c.bias ? core::randn({c.out_channels}, generator) : Tensor();
    const auto options = options_of(c);
    const Results gemm = run(ConvPath::Gemm, x, w, b, options, core::kBFloat16);
    const Results onednn = run(ConvPath::OneDnn, x, w, b, options, core::kBFloat16);
    // Both read the same bf16 operands and accumulate in fp32: only the summation order differs.
    check_close(gemm.y, onednn.y, 1e-4, "output");
    check_close(gemm.grad_x, onednn.grad_x, 1e-4, "grad x");
    check_close(gemm.grad_w, onednn.grad_w, 1e-4, "grad w");
    check_close(gemm.grad_b, onednn.grad_b, 1e-4, "grad b");
  }
}

namespace {

// The output of conv2d(x, w, b) (the bias fused into the path's forward) and of the composition
// it replaced, the convolution without bias and then a broadcast add, as doubles.
struct BiasForward {
  std::vector<double> fused, composed;
};

BiasForward bias_forward(ConvPath path, const Tensor& x, const Tensor& w, const Tensor& b,
                         const nn::functional::Conv2dOptions& options,
                         std::optional<core::DType> autocast = std::nullopt) {
  PathGuard guard(path);
  core::AutocastGuard cast(autocast);
  const Tensor fused = nn::functional::conv2d(x, w, b, options);
  const Tensor composed =
      nn::functional::conv2d(x, w, Tensor(), options) + b.view({1, b.numel(), 1, 1});
  return {fused.to(core::kFloat64).to_vector<double>(),
          composed.to(core::kFloat64).to_vector<double>()};
}

// Bitwise (exact) or within tolerance * (1 + max |composed|).
void check_bias_forward(const BiasForward& r, bool exact, const char* what) {
  INFO(std::string(what));
  REQUIRE(r.fused.size() == r.composed.size());
  double scale = 1, worst = 0;
  for (double v : r.composed) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < r.fused.size(); ++i) {
    worst = std::max(worst, std::fabs(r.fused[i] - r.composed[i]));
  }
  if (exact) {
    CHECK_MESSAGE(worst == 0, "max difference ", worst);
  } else {
    CHECK_MESSAGE(worst <= 1e-6 * scale, "max difference ", worst, " at scale ", scale);
  }
}

}  // namespace

TEST_CASE("conv2d: every path adds the bias inside its forward, as the separate add did") {
  // The direct loops add it to each plane or vector after its taps: the same float additions as
  // the old separate pass, so the same bits. The GEMM path starts each product from the bias and
  // oneDNN adds it inside its kernel, which may round differently.
  core::Generator generator(38);
  const bool bf16 = kernels::cpu::has_native_bf16();
  for (const PathCase& c : kCases) {
    INFO("case: ", c.name);
    const Tensor x = core::randn({c.batch, c.channels, c.height, c.width}, generator);
    const Tensor w =
        core::randn({c.out_channels, c.channels / c.groups, c.kernel_h, c.kernel_w}, generator);
    const Tensor b = core::randn({c.out_channels}, generator) * 3.0;
    const auto options = options_of(c);
    const core::Conv2dShape s = shape_of(c);
    const bool direct = kernels::cpu::has_direct_conv2d(ConvPass::Forward, core::kFloat32, s);
    check_bias_forward(bias_forward(ConvPath::Gemm, x, w, b, options), false, "float32, GEMM");
    check_bias_forward(bias_forward(ConvPath::Direct, x, w, b, options), direct,
                       direct ? "float32, direct" : "float32, direct (GEMM)");
    check_bias_forward(bias_forward(ConvPath::OneDnn, x, w, b, options), false, "float32, oneDNN");
    check_bias_forward(bias_forward(ConvPath::Rule, x, w, b, options), false, "float32, rule");
    const Tensor x64 = x.to(core::kFloat64), w64 = w.to(core::kFloat64);
    const Tensor b64 = b.to(core::kFloat64);
    const bool depthwise = kernels::cpu::is_depthwise(s);
    check_bias_forward(bias_forward(ConvPath::Gemm, x64, w64, b64, options), false,
                       "float64, GEMM");
    check_bias_forward(bias_forward(ConvPath::Direct, x64, w64, b64, options), depthwise,
                       depthwise ? "float64, direct" : "float64, direct (GEMM)");
    check_bias_forward(bias_forward(ConvPath::Gemm, x, w, b, options, core::kBFloat16), false,
                       "bfloat16 autocast, GEMM");
    if (bf16) {
      check_bias_forward(bias_forward(ConvPath::OneDnn, x, w, b, options, core::kBFloat16), false,
                         "bfloat16 autocast, oneDNN");
    }
  }
}

TEST_CASE("conv2d: oneDNN's and the stem loops' filter gradient write the bias's gradient too") {
  core::Generator generator(39);
  auto& backend = core::backend_for(core::kCPU);
  for (const PathCase& c : kCases) {
    INFO("case: ", c.name);
    const core::Conv2dShape s = shape_of(c);
    const auto& g = s.geometry;
    const Tensor x = core::randn({c.batch, c.channels, c.height, c.width}, generator);
    const Tensor gy = core::randn({c.batch, c.out_channels, g.out_h, g.out_w}, generator);
    const core::Shape w_shape{c.out_channels, c.channels / c.groups, c.kernel_h, c.kernel_w};
    const std::vector<float> sums = core::sum(gy, {0, 2, 3}).to_vector<float>();
    for (ConvPath path : {ConvPath::Gemm, ConvPath::OneDnn, ConvPath::Direct, ConvPath::Rule}) {
      INFO("path ", int(path));
      PathGuard guard(path);
      Tensor gw = core::empty(w_shape), gw_alone = core::empty(w_shape);
      Tensor gb = core::full({c.out_channels}, -7.0);
      backend.conv2d_backward_filter(core::kFloat32, s, x.data_ptr(), gy.data_ptr(),
                                     gw_alone.data_ptr());
      const bool fused = backend.conv2d_backward_filter_bias(
          core::kFloat32, s, x.data_ptr(), gy.data_ptr(), gw.data_ptr(), gb.data_ptr());
      const ConvPath ran = kernels::cpu::conv2d_path(ConvPass::BackwardFilter, core::kFloat32, s);
      // oneDNN runs its own kernel for every case here (the test above), so it always fuses; of
      // the direct loops the stems' do, the depthwise ones leave the sum to the caller.
      const bool stem = ran == ConvPath::Direct && kernels::cpu::is_small_channel(s);
      CHECK(fused == (ran == ConvPath::OneDnn || stem));
      check_close(gw_alone.to_vector<float>(), gw.to_vector<float>(), 1e-5, "grad w");
      if (fused) {
        check_close(sums, gb.to_vector<float>(), 1e-5, "grad b");
      } else {
        CHECK(gb.to_vector<float>() == std::vector<float>(size_t(c.out_channels), -7.0f));
      }
      // Not asked for: not reported as written.
      CHECK_FALSE(backend.conv2d_backward_filter_bias(core::kFloat32, s, x.data_ptr(),
                                                      gy.data_ptr(), gw.data_ptr(), nullptr));
    }
    // float64 never reaches oneDNN: the caller sums.
    const Tensor x64 = x.to(core::kFloat64), gy64 = gy.to(core::kFloat64);
    Tensor gw64 = core::empty(w_shape, core::kFloat64),
           gb64 = core::empty({c.out_channels}, core::kFloat64);
    CHECK_FALSE(backend.conv2d_backward_filter_bias(
        core::kFloat64, s, x64.data_ptr(), gy64.data_ptr(), gw64.data_ptr(), gb64.data_ptr()));
  }
}

TEST_CASE("conv2d on oneDNN: one of weight and bias frozen, and an empty batch, with a bias") {
  // The filter gradient's pass writes the bias's gradient only when both are wanted; a frozen
  // weight leaves the bias's to the sum, a frozen bias asks oneDNN for none.
  PathGuard guard(ConvPath::OneDnn);
  core::Generator generator(42);
  const PathCase& c = kCases[0];
  const auto options = options_of(c);
  const Tensor x0 = core::randn({c.batch, c.channels, c.height, c.width}, generator);
  const Tensor w0 =
      core::randn({c.out_channels, c.channels / c.groups, c.kernel_h, c.kernel_w}, generator);
  const Tensor b0 = core::randn({c.out_channels}, generator);
  const Tensor y0 = nn::functional::conv2d(x0, w0, b0, options);
  const Tensor upstream = upstream_of(y0);
  const std::vector<float> bias_grad = core::sum(upstream, {0, 2, 3}).to_vector<float>();
  std::vector<float> weight_grad;
  {
    Tensor w = w0.detach().set_requires_grad(true);
    Tensor b = b0.detach().set_requires_grad(true);
    core::sum(nn::functional::conv2d(x0, w, b, options) * upstream).backward();
    check_close(bias_grad, b.grad().to_vector<float>(), 1e-5, "both wanted: grad b");
    weight_grad = w.grad().to_vector<float>();
  }
  {
    Tensor b = b0.detach().set_requires_grad(true);
    core::sum(nn::functional::conv2d(x0, w0, b, options) * upstream).backward();
    check_close(bias_grad, b.grad().to_vector<float>(), 1e-5, "weight frozen: grad b");
  }
  {
    Tensor w = w0.detach().set_requires_grad(true);
    core::sum(nn::functional::conv2d(x0, w, b0, options) * upstream).backward();
    check_close(weight_grad, w.grad().to_vector<float>(), 1e-5, "bias frozen: grad w");
  }
  Tensor x = core::ones({0, c.channels, c.height, c.width}).set_requires_grad(true);
  Tensor w = w0.detach().set_requires_grad(true);
  Tensor b = b0.detach().set_requires_grad(true);
  Tensor y = nn::functional::conv2d(x, w, b, options);
  CHECK(y.numel() == 0);
  core::sum(y).backward();
  CHECK(w.grad().to_vector<float>() == std::vector<float>(size_t(w.numel()), 0.0f));
  CHECK(b.grad().to_vector<float>() == std::vector<float>(size_t(c.out_channels), 0.0f));
}

TEST_CASE("conv2d: the Backend defaults (a backend without the fusion) add and leave the sum") {
  // The base class's versions, called past the CPU backend's overrides: the convolution, then
  // the bias added with `binary`; the filter gradient alone, reported as without the bias's.
  core::Generator generator(41);
  core::Backend& backend = core::backend_for(core::kCPU);
  for (const PathCase& c : kCases) {
    INFO("case: ", c.name);
    const core::Conv2dShape s = shape_of(c);
    const auto& g = s.geometry;
    const Tensor x = core::randn({c.batch, c.channels, c.height, c.width}, generator);
    const Tensor w =
        core::randn({c.out_channels, c.channels / c.groups, c.kernel_h, c.kernel_w}, generator);
    const Tensor b = core::randn({c.out_channels}, generator);
    const core::Shape y_shape{c.batch, c.out_channels, g.out_h, g.out_w};
    Tensor y = core::empty(y_shape), fused = core::empty(y_shape);
    backend.core::Backend::conv2d_forward_bias(core::kFloat32, s, x.data_ptr(), w.data_ptr(),
                                               b.data_ptr(), y.data_ptr());
    backend.conv2d_forward_bias(core::kFloat32, s, x.data_ptr(), w.data_ptr(), b.data_ptr(),
                                fused.data_ptr());
    check_close(fused.to_vector<float>(), y.to_vector<float>(), 1e-6, "forward");
    backend.core::Backend::conv2d_forward_bias(core::kFloat32, s, x.data_ptr(), w.data_ptr(),
                                               nullptr, y.data_ptr());
    backend.conv2d_forward(core::kFloat32, s, x.data_ptr(), w.data_ptr(), fused.data_ptr());
    CHECK(y.to_vector<float>() == fused.to_vector<float>());
    const Tensor x16 = x.to(core::kBFloat16), w16 = w.to(core::kBFloat16);
    backend.core::Backend::conv2d_forward_mixed_bias(
        core::kBFloat16, s, x16.data_ptr(), w16.data_ptr(), b.data<float>(), y.data<float>());
    backend.conv2d_forward_mixed_bias(core::kBFloat16, s, x16.data_ptr(), w16.data_ptr(),
                                      b.data<float>(), fused.data<float>());
    check_close(fused.to_vector<float>(), y.to_vector<float>(), 1e-5, "forward, bfloat16");
    Tensor gw = core::empty(w.shape()), gw_alone = core::empty(w.shape());
    Tensor gb = core::full({c.out_channels}, -7.0);
    CHECK_FALSE(backend.core::Backend::conv2d_backward_filter_bias(
        core::kFloat32, s, x.data_ptr(), y.data_ptr(), gw.data_ptr(), gb.data_ptr()));
    backend.conv2d_backward_filter(core::kFloat32, s, x.data_ptr(), y.data_ptr(),
                                   gw_alone.data_ptr());
    CHECK(gw.to_vector<float>() == gw_alone.to_vector<float>());
    CHECK(gb.to_vector<float>() == std::vector<float>(size_t(c.out_channels), -7.0f));
  }
}

TEST_CASE("conv2d: double backward with a bias agrees on every path") {
  // gx = d/dx sum(y * y * u) with create_graph, then sum(gx * gx) differentiated again: the bias
  // reaches the second derivative through y, so its gradient needs the graph of the fused
  // forward. Every float32 path against float64 on GEMM.
  core::Generator generator(40);
  for (const PathCase& c : kCases) {
    if (!c.bias) continue;
    INFO("case: ", c.name);
    const Tensor x0 = core::randn({c.batch, c.channels, c.height, c.width}, generator);
    const Tensor w0 =
        core::randn({c.out_channels, c.channels / c.groups, c.kernel_h, c.kernel_w}, generator) *
        0.3;
    const Tensor b0 = core::randn({c.out_channels}, generator);
    const auto options = options_of(c);
    auto second = [&](ConvPath path, core::DType dtype) {
      PathGuard guard(path);
      Tensor x = x0.to(dtype).detach().set_requires_grad(true);
      Tensor w = w0.to(dtype).detach().set_requires_grad(true);
      Tensor b = b0.to(dtype).detach().set_requires_grad(true);
      const Tensor y = nn::functional::conv2d(x, w, b, options);
      const Tensor gx =
          core::grad({core::sum(y * y * upstream_of(y))}, {x}, {}, {.create_graph = true})[0];
      const std::vector<Tensor> grads = core::grad({core::sum(gx * gx)}, {w, b}, {});
      Results r;
      r.grad_w = grads[0].to(core::kFloat32).to_vector<float>();
      r.grad_b = grads[1].to(core::kFloat32).to_vector<float>();
      return r;
    };
    const Results reference = second(ConvPath::Gemm, core::kFloat64);
    double norm = 0;
    for (float v : reference.grad_b) norm += std::fabs(v);
    CHECK(norm > 0);  // the bias does reach the second derivative
    for (ConvPath path : {ConvPath::Gemm, ConvPath::OneDnn, ConvPath::Direct, ConvPath::Rule}) {
      INFO("path ", int(path));
      const Results r = second(path, core::kFloat32);
      // Float32 against float64 through four convolutions, summing up to 4608 products each (the
      // large 1x1 case's values reach 2e5): 1e-3 of the scale. A bias missing from the graph
      // would be off by a whole term.
      check_close(reference.grad_w, r.grad_w, 1e-3, "second-order grad w");
      check_close(reference.grad_b, r.grad_b, 1e-3, "second-order grad b");
    }
  }
}

TEST_CASE("conv2d paths: the override, and the dtypes that stay on the GEMM path") {
  const core::Conv2dShape depthwise = shape_of(kCases[10]);
  {
    PathGuard guard(ConvPath::Gemm);
    CHECK(kernels::cpu::conv2d_path(ConvPass::Forward, core::kFloat32, depthwise) ==
          ConvPath::Gemm);
  }
  {
    PathGuard guard(ConvPath::OneDnn);
    CHECK(kernels::cpu::conv2d_path(ConvPass::Forward, core::kFloat32, depthwise) ==
          ConvPath::OneDnn);
    // float64 and float16 have no oneDNN kernels here: forcing oneDNN leaves them on GEMM.
    CHECK(kernels::cpu::conv2d_path(ConvPass::Forward, core::kFloat64, depthwise) ==
          ConvPath::Gemm);
    CHECK(kernels::cpu::conv2d_path(ConvPass::Forward, core::kFloat16, depthwise) ==
          ConvPath::Gemm);
    CHECK(kernels::cpu::conv2d_path(ConvPass::Forward, core::kBFloat16, depthwise) ==
          (kernels::cpu::has_native_bf16() ? ConvPath::OneDnn : ConvPath::Gemm));
  }
  // A float64 convolution with oneDNN forced still runs (on GEMM) and agrees with float32.
  PathGuard guard(ConvPath::OneDnn);
  core::Generator generator(37);
  const Tensor x = core::randn({2, 4, 5, 5}, generator, core::kFloat64);
  const Tensor w = core::randn({4, 1, 3, 3}, generator, core::kFloat64);
  nn::functional::Conv2dOptions options;
  options.groups = 4;
  options.padding = {1, 1};
  const auto y64 = nn::functional::conv2d(x, w, Tensor(), options).to_vector<double>();
  const auto y32 =
      nn::functional::conv2d(x.to(core::kFloat32), w.to(core::kFloat32), Tensor(), options)
          .to_vector<float>();
  REQUIRE(y64.size() == y32.size());
  for (size_t i = 0; i < y64.size(); ++i) CHECK(y32[i] == doctest::Approx(y64[i]).epsilon(1e-5));
}

TEST_CASE("conv2d paths: the rule sends each zoo family where the benchmark measured it faster") {
  auto shape = [](int64_t channels, int64_t size, int64_t out, int64_t kernel, int64_t stride,
                  int64_t pad, int64_t groups) {
    PathCase c{"",     8,      channels, size, size, out, kernel, kernel,
               stride, stride, pad,      pad,  1,    1,   groups, false};
    return shape_of(c);
  };
  PathGuard guard(ConvPath::Rule);
  const auto path = [](ConvPass pass, const core::Conv2dShape& s) {
    return kernels::cpu::conv2d_path(pass, core::kFloat32, s);
  };
  // Depthwise (ConvNeXt's 7x7, MobileNet's and EfficientNet's 3x3 and 5x5): oneDNN's depthwise
  // kernel where it has one, else the direct loops, never im2col. Dense 3x3: oneDNN.
  for (ConvPass pass : {ConvPass::Forward, ConvPass::BackwardData, ConvPass::BackwardFilter}) {
    INFO("pass ", int(pass));
    for (const core::Conv2dShape& s :
         {shape(96, 8, 96, 7, 1, 3, 96), shape(768, 1, 768, 7, 1, 3, 768),
          shape(32, 16, 32, 3, 1, 1, 32), shape(144, 8, 144, 5, 2, 2, 144)}) {
      const std::string kernel =
          kernels::cpu::conv2d_onednn_implementation(pass, core::kFloat32, core::kFloat32, s);
      INFO("oneDNN kernel ", kernel);
      const bool gemm_based = kernel.find("gemm") != std::string::npos;
      CHECK(path(pass, s) == (gemm_based ? ConvPath::Direct : ConvPath::OneDnn));
      CHECK(kernels::cpu::conv2d_path(pass, core::kFloat64, s) == ConvPath::Direct);
    }
    CHECK(path(pass, shape(64, 8, 64, 3, 1, 1, 1)) == ConvPath::OneDnn);
  }
  // The stem's data gradient (3 input channels): GEMM.
  CHECK(path(ConvPass::BackwardData, shape(3, 32, 64, 7, 2, 3, 1)) == ConvPath::Gemm);
  CHECK(path(ConvPass::Forward, shape(3, 32, 64, 7, 2, 3, 1)) == ConvPath::OneDnn);
  // A thin 1x1 (MobileNet's 16 -> 72): GEMM, which reads NCHW as it is.
  CHECK(path(ConvPass::Forward, shape(16, 8, 72, 1, 1, 0, 1)) == ConvPath::Gemm);
}

TEST_CASE("conv2d paths: in bfloat16 a 1x1 convolution on small images goes to oneDNN") {
  if (!kernels::cpu::has_native_bf16()) {
    MESSAGE("skipped: no AVX512-BF16, bfloat16 convolutions never reach oneDNN on this CPU");
    return;
  }
  auto shape = [](int64_t channels, int64_t size, int64_t out) {
    PathCase c{"", 8, channels, size, size, out, 1, 1, 1, 1, 0, 0, 1, 1, 1, false};
    return shape_of(c);
  };
  PathGuard guard(ConvPath::Rule);
  const auto path = [](ConvPass pass, core::DType operand, const core::Conv2dShape& s) {
    return kernels::cpu::conv2d_path(pass, operand, s);
  };
  // ResNet-50's last stage on 32x32 inputs (2048 -> 512 on a 1x1 image): the GEMM path's one
  // product over the batch in both dtypes and every pass, at batch 8 and at 64.
  for (const core::Conv2dShape& last :
       {shape(2048, 1, 512),
        shape_of(PathCase{"", 64, 2048, 1, 1, 512, 1, 1, 1, 1, 0, 0, 1, 1, 1, false})}) {
    for (ConvPass pass : {ConvPass::Forward, ConvPass::BackwardData, ConvPass::BackwardFilter}) {
      INFO("pass ", int(pass), " batch ", last.batch);
      CHECK(path(pass, core::kFloat32, last) == ConvPath::Gemm);
      CHECK(path(pass, core::kBFloat16, last) == ConvPath::Gemm);
    }
  }
  // On 2x2 images the GEMM path's filter gradient would be 8 rank-4 updates of the whole weight
  // gradient: oneDNN's, one pass over the batch, in both dtypes. From 4x4 on, the GEMM path's.
  const core::Conv2dShape third = shape(1024, 2, 256);
  CHECK(path(ConvPass::Forward, core::kBFloat16, third) == ConvPath::OneDnn);
  CHECK(path(ConvPass::BackwardFilter, core::kBFloat16, third) == ConvPath::OneDnn);
  CHECK(path(ConvPass::BackwardFilter, core::kFloat32, third) == ConvPath::OneDnn);
  for (core::DType dtype : {core::kFloat32, core::kBFloat16}) {
    CHECK(path(ConvPass::BackwardFilter, dtype, shape(512, 4, 128)) == ConvPath::Gemm);
  }
  // Thin layers stay on the GEMM path in bfloat16 too (MobileNet's 16 -> 72).
  CHECK(path(ConvPass::Forward, core::kBFloat16, shape(16, 1, 72)) == ConvPath::Gemm);
}
