// The direct stem convolution (kernels/cpu/conv_small.cpp: groups 1, 1 to 4 input channels,
// forward and filter gradient) against the im2col + GEMM path, through nn::functional::conv2d
// with the path forced: strides, padding, dilation, widths that leave a partial vector, output
// channel counts off the kernel's block of 4, batch 1. Also: which cases it takes, that its
// filter gradient does not depend on the thread count, and where the rule sends the stems.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "conv_test_util.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/backend.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/core/threads.h"
#include "mpigrad/kernels/conv.h"
#include "mpigrad/nn/functional/conv.h"

namespace {

using namespace mpigrad;  // NOLINT
using core::Tensor;
using kernels::cpu::ConvPass;
using kernels::cpu::ConvPath;

using test::PathGuard;

struct StemCase {
  int64_t batch, channels, height, width, out_channels, kernel_h, kernel_w;
  int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
};

const StemCase kStems[] = {
    // The MNIST CNN's first layer, and at batch 1.
    {4, 1, 28, 28, 16, 3, 3, 1, 1, 1, 1, 1, 1},
    {1, 1, 28, 28, 16, 3, 3, 1, 1, 1, 1, 1, 1},
    // 2, 3 and 4 channels; widths a whole vector, one lane over, one under, and under one.
    {2, 2, 9, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1},
    {2, 3, 7, 9, 5, 3, 3, 1, 1, 1, 1, 1, 1},
    {2, 4, 6, 7, 9, 3, 3, 1, 1, 1, 1, 1, 1},
    {3, 3, 5, 5, 3, 3, 3, 1, 1, 0, 0, 1, 1},
    {1, 4, 3, 1, 4, 1, 1, 1, 1, 0, 0, 1, 1},
    // Wide rows (several vectors and a tail), 5x5 and 7x7 kernels, no and large padding.
    {2, 1, 11, 33, 7, 5, 5, 1, 1, 2, 2, 1, 1},
    {2, 3, 9, 41, 12, 7, 7, 1, 1, 3, 3, 1, 1},
    {1, 2, 8, 26, 1, 3, 3, 1, 1, 0, 0, 1, 1},
    // Strides 2, 3 and 4 (the ResNet and ConvNeXt stems), odd and even inputs.
    {2, 3, 17, 17, 16, 7, 7, 2, 2, 3, 3, 1, 1},
    {2, 1, 28, 28, 16, 3, 3, 2, 2, 1, 1, 1, 1},
    {2, 4, 33, 33, 24, 3, 3, 2, 2, 1, 1, 1, 1},
    {2, 3, 16, 16, 24, 4, 4, 4, 4, 0, 0, 1, 1},
    {1, 2, 13, 20, 6, 3, 2, 3, 2, 1, 0, 1, 1},
    // Asymmetric kernels, padding larger than the kernel reaches, dilation.
    {2, 2, 9, 11, 7, 2, 3, 1, 2, 0, 1, 1, 1},
    {2, 1, 10, 10, 6, 3, 3, 1, 1, 2, 2, 2, 2},
    {1, 4, 13, 12, 8, 3, 3, 2, 2, 2, 3, 2, 3},
    {2, 1, 4, 5, 4, 3, 3, 1, 1, 3, 3, 1, 1},
};

nn::functional::Conv2dOptions options_of(const StemCase& c) {
  nn::functional::Conv2dOptions o;
  o.stride = {c.stride_h, c.stride_w};
  o.padding = {c.pad_h, c.pad_w};
  o.dilation = {c.dilation_h, c.dilation_w};
  return o;
}

core::Conv2dShape shape_of(const StemCase& c) {
  return test::conv_shape_of(c);
}

struct Results {
  std::vector<float> y, grad_x, grad_w, grad_b;
};

Results run(ConvPath path, const Tensor& x0, const Tensor& w0, const Tensor& b0,
            const nn::functional::Conv2dOptions& options) {
  PathGuard guard(path);
  Tensor x = x0.detach().set_requires_grad(true);
  Tensor w = w0.detach().set_requires_grad(true);
  Tensor b = b0.detach().set_requires_grad(true);
  Tensor y = nn::functional::conv2d(x, w, b, options);
  const Tensor upstream =
      core::sin(core::arange(y.numel(), core::kFloat32).view(y.shape()) * 0.37) + 0.25;
  core::sum(y * upstream).backward();
  return {y.to_vector<float>(), x.grad().to_vector<float>(), w.grad().to_vector<float>(),
          b.grad().to_vector<float>()};
}

// |a - b| <= tolerance * (1 + max |reference|), element by element.
void check_close(const std::vector<float>& reference, const std::vector<float>& other,
                 const char* what) {
  INFO(what);
  REQUIRE(reference.size() == other.size());
  double scale = 1;
  for (float v : reference) scale = std::max(scale, double(std::fabs(v)));
  double worst = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    CHECK(std::isfinite(other[i]));
    worst = std::max(worst, std::fabs(double(reference[i]) - double(other[i])));
  }
  CHECK_MESSAGE(worst <= 1e-5 * scale, "max difference ", worst, " at scale ", scale);
}

bool has_kernel() {
  const bool yes = kernels::cpu::has_small_channel_conv2d(ConvPass::Forward, core::kFloat32,
                                                          shape_of(kStems[0]));
  if (!yes) MESSAGE("skipped: this CPU has no AVX2 + FMA, the stems stay on the GEMM path");
  return yes;
}

}  // namespace

TEST_CASE("conv2d stems: the direct loops take float32 forward and filter, 1 to 4 channels") {
  if (!has_kernel()) return;
  core::Conv2dShape s = shape_of(kStems[4]);  // 4 channels
  CHECK(kernels::cpu::is_small_channel(s));
  CHECK(kernels::cpu::has_direct_conv2d(ConvPass::Forward, core::kFloat32, s));
  CHECK(kernels::cpu::has_direct_conv2d(ConvPass::BackwardFilter, core::kFloat32, s));
  CHECK_FALSE(kernels::cpu::has_direct_conv2d(ConvPass::BackwardData, core::kFloat32, s));
  CHECK_FALSE(kernels::cpu::has_direct_conv2d(ConvPass::Forward, core::kFloat64, s));
  CHECK_FALSE(kernels::cpu::has_direct_conv2d(ConvPass::Forward, core::kBFloat16, s));
  core::Conv2dShape five = s;
  five.geometry.channels = 5;
  CHECK_FALSE(kernels::cpu::is_small_channel(five));
  CHECK_FALSE(kernels::cpu::has_direct_conv2d(ConvPass::Forward, core::kFloat32, five));
  // Grouped (not depthwise) shapes with few channels are not stems.
  core::Conv2dShape grouped = s;
  grouped.groups = 2;
  CHECK_FALSE(kernels::cpu::has_direct_conv2d(ConvPass::Forward, core::kFloat32, grouped));
  // A case it does not take is refused, not miscomputed.
  std::vector<float> x(1024), w(1024), y(1024);
  CHECK_THROWS_AS(kernels::cpu::small_channel_conv2d(ConvPass::BackwardData, core::kFloat32, s,
                                                     y.data(), w.data(), x.data()),
                  std::invalid_argument);
}

TEST_CASE("conv2d stems: the direct loops match the im2col + GEMM path") {
  if (!has_kernel()) return;
  core::Generator generator(41);
  for (const StemCase& c : kStems) {
    const core::Conv2dShape s = shape_of(c);
    INFO("stem ", c.channels, "->", c.out_channels, " ", c.height, "x", c.width, " kernel ",
         c.kernel_h, "x", c.kernel_w, " stride ", c.stride_h, "x", c.stride_w, " pad ", c.pad_h,
         "x", c.pad_w, " dilation ", c.dilation_h, "x", c.dilation_w, " batch ", c.batch);
    REQUIRE(kernels::cpu::has_direct_conv2d(ConvPass::Forward, core::kFloat32, s));
    const Tensor x = core::randn({c.batch, c.channels, c.height, c.width}, generator);
    const Tensor w = core::randn({c.out_channels, c.channels, c.kernel_h, c.kernel_w}, generator);
    const Tensor b = core::randn({c.out_channels}, generator);
    const Results gemm = run(ConvPath::Gemm, x, w, b, options_of(c));
    const Results direct = run(ConvPath::Direct, x, w, b, options_of(c));
    check_close(gemm.y, direct.y, "output");
    check_close(gemm.grad_w, direct.grad_w, "grad w");
    check_close(gemm.grad_x, direct.grad_x, "grad x (GEMM on both)");
    check_close(gemm.grad_b, direct.grad_b, "grad b");
  }
}

TEST_CASE("conv2d stems: the direct loops write every output and leave nothing else touched") {
  if (!has_kernel()) return;
  // Outputs start as NaN, and a guard band after them must keep its value: a row's last
  // partial vector is stored lane by lane.
  core::Generator generator(42);
  for (const StemCase& c : {kStems[3], kStems[7], kStems[12]}) {
    const core::Conv2dShape s = shape_of(c);
    const auto& g = s.geometry;
    const Tensor x = core::randn({c.batch, c.channels, c.height, c.width}, generator);
    const Tensor w = core::randn({c.out_channels, c.channels, c.kernel_h, c.kernel_w}, generator);
    const int64_t outputs = c.batch * c.out_channels * g.out_h * g.out_w;
    std::vector<float> y(size_t(outputs + 64), std::nanf(""));
    std::fill(y.begin() + outputs, y.end(), 7.0f);
    kernels::cpu::small_channel_conv2d(ConvPass::Forward, core::kFloat32, s, x.data_ptr(),
                                       w.data_ptr(), y.data());
    const std::vector<float> gw_expected = [&] {
      std::vector<float> out(size_t(w.numel()));
      PathGuard guard(ConvPath::Gemm);
      core::backend_for(core::kCPU)
          .conv2d_backward_filter(core::kFloat32, s, x.data_ptr(), y.data(), out.data());
      return out;
    }();
    for (int64_t i = 0; i < outputs; ++i) REQUIRE(std::isfinite(y[size_t(i)]));
    for (size_t i = size_t(outputs); i < y.size(); ++i) CHECK(y[i] == 7.0f);
    std::vector<float> gw(size_t(w.numel() + 16), 7.0f);
    kernels::cpu::small_channel_conv2d(ConvPass::BackwardFilter, core::kFloat32, s, x.data_ptr(),
                                       y.data(), gw.data());
    for (size_t i = size_t(w.numel()); i < gw.size(); ++i) CHECK(gw[i] == 7.0f);
    gw.resize(size_t(w.numel()));
    check_close(gw_expected, gw, "grad w, called directly");
  }
}

TEST_CASE("conv2d stems: the direct filter gradient does not depend on the thread count") {
  if (!has_kernel()) return;
  core::Generator generator(43);
  const StemCase c = kStems[0];
  const core::Conv2dShape s = shape_of(c);
  const Tensor x = core::randn({c.batch, c.channels, c.height, c.width}, generator);
  const Tensor gy =
      core::randn({c.batch, c.out_channels, s.geometry.out_h, s.geometry.out_w}, generator);
  const int threads = core::num_threads();
  std::vector<std::vector<float>> results;
  for (int n : {1, 2, 3}) {
    core::set_num_threads(n);
    std::vector<float> gw(size_t(c.out_channels * c.channels * c.kernel_h * c.kernel_w));
    kernels::cpu::small_channel_conv2d(ConvPass::BackwardFilter, core::kFloat32, s, x.data_ptr(),
                                       gy.data_ptr(), gw.data());
    results.push_back(gw);
  }
  core::set_num_threads(threads);
  CHECK(results[0] == results[1]);
  CHECK(results[0] == results[2]);
}

TEST_CASE("conv2d stems: the rule sends unstrided stems to the direct loops") {
  if (!has_kernel()) return;
  PathGuard guard(ConvPath::Rule);
  const auto path = [](ConvPass pass, const StemCase& c) {
    return kernels::cpu::conv2d_path(pass, core::kFloat32, shape_of(c));
  };
  const StemCase mnist{64, 1, 28, 28, 16, 3, 3, 1, 1, 1, 1, 1, 1};
  const StemCase rgb{64, 3, 32, 32, 32, 3, 3, 1, 1, 1, 1, 1, 1};
  const StemCase strided{8, 3, 32, 32, 64, 7, 7, 2, 2, 3, 3, 1, 1};
  for (const StemCase& c : {mnist, rgb}) {
    CHECK(path(ConvPass::Forward, c) == ConvPath::Direct);
    CHECK(path(ConvPass::BackwardFilter, c) == ConvPath::Direct);
    CHECK(path(ConvPass::BackwardData, c) == ConvPath::Gemm);
    CHECK(kernels::cpu::conv2d_path(ConvPass::Forward, core::kFloat64, shape_of(c)) ==
          ConvPath::Gemm);
  }
  CHECK(path(ConvPass::Forward, strided) == ConvPath::OneDnn);
  CHECK(path(ConvPass::BackwardFilter, strided) == ConvPath::OneDnn);
  // Five channels is no longer a stem for these loops.
  const StemCase five{8, 5, 16, 16, 16, 3, 3, 1, 1, 1, 1, 1, 1};
  CHECK(path(ConvPass::Forward, five) == ConvPath::OneDnn);
}
