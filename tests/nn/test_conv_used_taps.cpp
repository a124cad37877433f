// conv2d drops the kernel taps that see only padding (nn/functional/conv.h): which taps are kept,
// and that the convolution with them is the convolution with the whole kernel, forward and
// backward, the dropped taps' weight gradient zeros.
#include <doctest/doctest.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "mpigrad/core/autocast.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/nn/functional/conv.h"

namespace {

using namespace mpigrad;  // NOLINT
using core::Tensor;
namespace F = nn::functional;

void check_taps(int64_t size, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation,
                F::UsedTaps expected) {
  INFO("size ", size, " kernel ", kernel, " stride ", stride, " padding ", padding, " dilation ",
       dilation);
  const F::UsedTaps got = F::used_taps(size, kernel, stride, padding, dilation);
  CHECK(got.first == expected.first);
  CHECK(got.count == expected.count);
  CHECK(got.padding == expected.padding);
}

class DropGuard {
 public:
  explicit DropGuard(bool drop) : previous_(F::set_conv2d_drop_padding_taps(drop)) {}
  ~DropGuard() { F::set_conv2d_drop_padding_taps(previous_); }
  DropGuard(const DropGuard&) = delete;
  DropGuard& operator=(const DropGuard&) = delete;

 private:
  bool previous_;
};

struct Result {
  std::vector<double> y, grad_x, grad_w, grad_b;
};

Result run(bool drop, const Tensor& x0, const Tensor& w0, const Tensor& b0,
           const F::Conv2dOptions& options, std::optional<core::DType> autocast = std::nullopt) {
  DropGuard guard(drop);
  Tensor x = x0.detach().set_requires_grad(true);
  Tensor w = w0.detach().set_requires_grad(true);
  Tensor b = b0.detach().set_requires_grad(true);
  Tensor y;
  {
    core::AutocastGuard cast(autocast);
    y = F::conv2d(x, w, b, options);
  }
  // With the taps dropped, the convolution reads a view of the weight (its gradient goes through
  // the view's backward); without, the weight itself (its AccumulateGrad).
  const auto& weight_edge = y.grad_fn()->next.at(1);
  REQUIRE(weight_edge != nullptr);
  CHECK((std::string(weight_edge->name()) != "AccumulateGrad") == drop);
  Tensor upstream = core::sin(core::arange(y.numel(), y.dtype()).view(y.shape()) * 0.71) + 0.3;
  core::sum(y * upstream).backward();
  auto values = [](const Tensor& t) { return t.to(core::kFloat64).to_vector<double>(); };
  return {values(y), values(x.grad()), values(w.grad()), values(b.grad())};
}

void check_close(const std::vector<double>& a, const std::vector<double>& b, double tolerance,
                 const char* what) {
  INFO(what);
  REQUIRE(a.size() == b.size());
  double worst = 0, scale = 1;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  CHECK_MESSAGE(worst <= tolerance * scale, "max difference ", worst);
}

}  // namespace

TEST_CASE("used_taps: the taps that read the image at some output position") {
  // A 3x3 kernel, padding 1, on a 1x1 image: the centre alone, no padding left.
  check_taps(1, 3, 1, 1, 1, {1, 1, 0});
  // ResNet's stride-2 3x3 from a 2x2 image to 1x1: rows 0 and 1 of the image under taps 1 and 2.
  check_taps(2, 3, 2, 1, 1, {1, 2, 0});
  // A 7x7 kernel, padding 3, on 2x2 and 1x1 images.
  check_taps(2, 7, 1, 3, 1, {2, 3, 1});
  check_taps(1, 7, 1, 3, 1, {3, 1, 0});
  // Dilation 2 on a 1x1 image: taps 0 and 2 land two rows above and below it.
  check_taps(1, 3, 1, 2, 2, {1, 1, 0});
  // Every tap used: large images, no padding, a stride that reaches the first tap later.
  check_taps(28, 3, 1, 1, 1, {0, 3, 1});
  check_taps(1, 1, 1, 0, 1, {0, 1, 0});
  check_taps(3, 3, 2, 1, 1, {0, 3, 1});
  check_taps(2, 3, 1, 2, 1, {0, 3, 2});
  // No tap reads the image (the output is the bias alone): left as it is.
  check_taps(1, 3, 10, 5, 1, {0, 3, 5});
  // Invalid geometry is left to conv2d's own checks.
  check_taps(1, 5, 1, 0, 1, {0, 5, 0});
}

TEST_CASE("conv2d without the taps on padding equals the whole kernel, forward and backward") {
  core::Generator generator(91);
  struct Case {
    const char* name;
    int64_t channels, height, width, out, kernel_h, kernel_w, groups;
    F::Conv2dOptions options;
  };
  const Case cases[] = {
      {"3x3 on 1x1 (ResNet's last stage on 32x32 images)",
       16,
       1,
       1,
       8,
       3,
       3,
       1,
       {{1, 1}, {1, 1}, {1, 1}, 1}},
      {"3x3 stride 2 from 2x2", 8, 2, 2, 12, 3, 3, 1, {{2, 2}, {1, 1}, {1, 1}, 1}},
      {"depthwise 7x7 on 2x2", 6, 2, 2, 6, 7, 7, 6, {{1, 1}, {3, 3}, {1, 1}, 6}},
      {"5x5 on a 1x3 strip (rows cut, columns kept)",
       4,
       1,
       3,
       5,
       5,
       5,
       1,
       {{1, 1}, {2, 2}, {1, 1}, 1}},
      {"dilated 3x3 on 1x1", 4, 1, 1, 4, 3, 3, 1, {{1, 1}, {2, 2}, {2, 2}, 1}},
  };
  for (const Case& c : cases) {
    INFO("case: ", std::string(c.name));
    for (core::DType dtype : {core::kFloat32, core::kFloat64}) {
      INFO("dtype ", dtype);
      const Tensor x = core::randn({3, c.channels, c.height, c.width}, generator).to(dtype);
      const Tensor w =
          core::randn({c.out, c.channels / c.groups, c.kernel_h, c.kernel_w}, generator).to(dtype);
      const Tensor b = core::randn({c.out}, generator).to(dtype);
      const Result whole = run(false, x, w, b, c.options);
      const Result used = run(true, x, w, b, c.options);
      const double tolerance = dtype == core::kFloat32 ? 1e-5 : 1e-12;
      check_close(used.y, whole.y, tolerance, "output");
      check_close(used.grad_x, whole.grad_x, tolerance, "grad x");
      check_close(used.grad_w, whole.grad_w, tolerance, "grad w");
      check_close(used.grad_b, whole.grad_b, tolerance, "grad b");
      // The weight's gradient has the whole kernel's shape, exact zeros at the dropped taps.
      const int64_t taps = c.kernel_h * c.kernel_w;
      REQUIRE(used.grad_w.size() == size_t(c.out * (c.channels / c.groups) * taps));
      const auto& g = c.options;
      const F::UsedTaps rows =
          F::used_taps(c.height, c.kernel_h, g.stride[0], g.padding[0], g.dilation[0]);
      const F::UsedTaps cols =
          F::used_taps(c.width, c.kernel_w, g.stride[1], g.padding[1], g.dilation[1]);
      CHECK((rows.count < c.kernel_h || cols.count < c.kernel_w));  // the case drops some
      int64_t dropped_nonzero = 0;
      for (size_t i = 0; i < used.grad_w.size(); ++i) {
        const int64_t tap = int64_t(i) % taps, row = tap / c.kernel_w, col = tap % c.kernel_w;
        const bool kept = row >= rows.first && row < rows.first + rows.count && col >= cols.first &&
                          col < cols.first + cols.count;
        if (!kept && used.grad_w[i] != 0.0) ++dropped_nonzero;
      }
      CHECK(dropped_nonzero == 0);
    }
  }
}

TEST_CASE("conv2d without the taps on padding under bfloat16 autocast") {
  // The kept taps are cast to 16 bits, not the whole weight; the results agree with the whole
  // kernel's within bfloat16 rounding, and the dropped taps' gradient is zeros.
  core::Generator generator(92);
  const Tensor x = core::randn({4, 16, 1, 1}, generator);
  const Tensor w = core::randn({24, 16, 3, 3}, generator);
  const Tensor b = core::randn({24}, generator);
  F::Conv2dOptions options;
  options.padding = {1, 1};
  const Result whole = run(false, x, w, b, options, core::kBFloat16);
  const Result used = run(true, x, w, b, options, core::kBFloat16);
  check_close(used.y, whole.y, 2e-2, "output");
  check_close(used.grad_x, whole.grad_x, 2e-2, "grad x");
  check_close(used.grad_w, whole.grad_w, 2e-2, "grad w");
  check_close(used.grad_b, whole.grad_b, 2e-2, "grad b");
  for (size_t i = 0; i < used.grad_w.size(); ++i) {
    if (i % 9 != 4) REQUIRE(used.grad_w[i] == 0.0);  // all but the centre tap
  }
}
