// The Float32 weight copies between plain [out, in, kh, kw] and oneDNN's OIhw16i16o
// (kernels/cpu/conv_weight_layout.h), which conv_dnnl.cpp runs in place of oneDNN's reorders:
// every element lands where the blocked layout's formula puts it, the way back (streamed to
// memory or not) restores the plain weight bit for bit, at 1 and 2 threads, and the oneDNN path
// built on them still matches the GEMM path on shapes whose weight copies run on several threads.
// The same placement check for the bfloat16 weights' three pair layouts; that oneDNN reads them
// as these formulas say is pinned by the bfloat16 convolution tests in tests/nn, which compare
// oneDNN's bfloat16 passes with float32 ones (a swapped pair fails them).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../thread_count.h"
#include "conv_test_util.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/core/threads.h"
#include "mpigrad/kernels/conv.h"
#include "mpigrad/kernels/cpu/conv_weight_layout.h"
#include "mpigrad/nn/functional/conv.h"

namespace {

using namespace mpigrad;  // NOLINT
using core::Tensor;
using kernels::cpu::ConvPath;

using test::ThreadCount;

// Where OIhw16i16o keeps plain element (o, i, t).
int64_t blocked_index(int64_t in, int64_t taps, int64_t o, int64_t i, int64_t t) {
  const int64_t tile = (o / 16) * (in / 16) + i / 16;
  return ((tile * taps + t) * 16 + i % 16) * 16 + o % 16;
}

struct LayoutCase {
  int64_t out, in, taps;
};

}  // namespace

TEST_CASE("conv weight layout: plain <-> OIhw16i16o puts every element where the formula says") {
  if (!kernels::cpu::has_blocked_weight_copies()) {
    MESSAGE("skipped: this CPU has no AVX-512F, so conv_dnnl.cpp uses oneDNN's reorders");
    return;
  }
  // 512 x 512 x 9 is ResNet-18's deep weight, 9.4 MB, which the copies split over threads.
  const LayoutCase cases[] = {{16, 16, 1}, {32, 48, 9}, {48, 32, 25}, {64, 16, 4}, {512, 512, 9}};
  for (int threads : {1, 2}) {
    const ThreadCount count(threads);
    for (const LayoutCase& c : cases) {
      INFO("out ", c.out, " in ", c.in, " taps ", c.taps, ", ", threads, " thread(s)");
      const size_t n = size_t(c.out * c.in * c.taps);
      std::vector<float> plain(n), blocked(n, -1.0f);
      // The way back into a 64-byte aligned buffer (large weights are then streamed to memory)
      // and into one a float off that alignment (stored through the caches).
      std::vector<float> back_storage(n + 32, -1.0f);
      float* aligned = back_storage.data();
      while (reinterpret_cast<uintptr_t>(aligned) % 64 != 0) ++aligned;
      for (size_t k = 0; k < n; ++k) plain[k] = float(k);  // distinct and exact in float
      kernels::cpu::weights_to_blocked_16i16o(c.out, c.in, c.taps, plain.data(), blocked.data());
      int64_t misplaced = 0;
      for (int64_t o = 0; o < c.out; ++o) {
        for (int64_t i = 0; i < c.in; ++i) {
          for (int64_t t = 0; t < c.taps; ++t) {
            const float expected = plain[size_t((o * c.in + i) * c.taps + t)];
            if (blocked[size_t(blocked_index(c.in, c.taps, o, i, t))] != expected) ++misplaced;
          }
        }
      }
      CHECK(misplaced == 0);
      for (float* back : {aligned, aligned + 1}) {
        kernels::cpu::weights_from_blocked_16i16o(c.out, c.in, c.taps, blocked.data(), back);
        CHECK(std::memcmp(back, plain.data(), n * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("conv weight layout: bfloat16 weights into the pair layouts, every element placed") {
  if (!kernels::cpu::has_blocked_weight_copies()) {
    MESSAGE("skipped: this CPU has no AVX-512F, so conv_dnnl.cpp uses oneDNN's reorders");
    return;
  }
  using kernels::cpu::Bf16PairLayout;
  // 1x1 with odd and even counts of 16-wide input blocks (the forward's 1x1 copy takes them two
  // at a time), ResNet-50's 512 x 2048, which threads share, and kernels of 4, 9 and 25 taps.
  const LayoutCase cases[] = {{16, 16, 1}, {32, 48, 1}, {48, 16, 1},   {64, 80, 1}, {512, 2048, 1},
                              {16, 32, 4}, {48, 32, 9}, {256, 256, 9}, {32, 16, 25}};
  const Bf16PairLayout layouts[] = {Bf16PairLayout::InPairs, Bf16PairLayout::OutPairsInOuter,
                                    Bf16PairLayout::OutPairsOutOuter};
  for (int threads : {1, 2}) {
    const ThreadCount count(threads);
    for (const LayoutCase& c : cases) {
      const size_t n = size_t(c.out * c.in * c.taps);
      std::vector<uint16_t> plain(n);
      for (size_t k = 0; k < n; ++k) plain[k] = uint16_t(k * 2654435761u >> 7);
      const int64_t in_blocks = c.in / 16, out_blocks = c.out / 16;
      for (Bf16PairLayout layout : layouts) {
        INFO("out ", c.out, " in ", c.in, " taps ", c.taps, ", layout ", int(layout), ", ", threads,
             " thread(s)");
        std::vector<uint16_t> blocked(n, 0xFFFF);
        kernels::cpu::bf16_weights_to_pairs(layout, c.out, c.in, c.taps, plain.data(),
                                            blocked.data());
        int64_t misplaced = 0;
        for (int64_t o = 0; o < c.out; ++o) {
          for (int64_t i = 0; i < c.in; ++i) {
            for (int64_t t = 0; t < c.taps; ++t) {
              int64_t index = 0;
              if (layout == Bf16PairLayout::InPairs) {
                // ABcd8b16a2b: [out/16][in/16][taps][8 pairs of in][16 out][2].
                index = ((((o / 16) * in_blocks + i / 16) * c.taps + t) * 8 + i % 16 / 2) * 32 +
                        o % 16 * 2 + i % 2;
              } else {
                // BAcd8a16b2a / ABcd8a16b2a: [in/16][out/16] or [out/16][in/16], then
                // [taps][8 pairs of out][16 in][2].
                const int64_t tile = layout == Bf16PairLayout::OutPairsInOuter
                                         ? (i / 16) * out_blocks + o / 16
                                         : (o / 16) * in_blocks + i / 16;
                index = ((tile * c.taps + t) * 8 + o % 16 / 2) * 32 + i % 16 * 2 + o % 2;
              }
              if (blocked[size_t(index)] != plain[size_t((o * c.in + i) * c.taps + t)]) {
                ++misplaced;
              }
            }
          }
        }
        CHECK(misplaced == 0);
      }
    }
  }
}

TEST_CASE("conv weight layout: oneDNN convolutions with threaded weight copies match GEMM") {
  // Weights of 295 KB and 1.2 MB (above the copies' grain, so 2 threads share them), on the
  // 2x2 and 1x1 images of ResNet-18's late stages; the filter gradient goes back to plain
  // through the same copies.
  struct Case {
    int64_t batch, channels, size, out_channels, stride;
  };
  const Case cases[] = {{8, 128, 2, 64, 1}, {4, 256, 2, 128, 2}, {8, 128, 1, 256, 1}};
  core::Generator generator(57);
  const ThreadCount count(2);
  for (const Case& c : cases) {
    INFO("channels ", c.channels, " -> ", c.out_channels, " on ", c.size, "x", c.size);
    const Tensor x0 = core::randn({c.batch, c.channels, c.size, c.size}, generator);
    const Tensor w0 = core::randn({c.out_channels, c.channels, 3, 3}, generator);
    nn::functional::Conv2dOptions options;
    options.stride = {c.stride, c.stride};
    options.padding = {1, 1};
    std::vector<float> y[2], grad_x[2], grad_w[2];
    const ConvPath paths[2] = {ConvPath::Gemm, ConvPath::OneDnn};
    for (int p = 0; p < 2; ++p) {
      test::PathGuard guard(paths[p]);
      Tensor x = x0.detach().set_requires_grad(true);
      Tensor w = w0.detach().set_requires_grad(true);
      Tensor out = nn::functional::conv2d(x, w, Tensor(), options);
      const Tensor upstream =
          core::sin(core::arange(out.numel(), core::kFloat32).view(out.shape()) * 0.37) + 0.25;
      core::sum(out * upstream).backward();
      y[p] = out.to_vector<float>();
      grad_x[p] = x.grad().to_vector<float>();
      grad_w[p] = w.grad().to_vector<float>();
    }
    auto worst = [](const std::vector<float>& a, const std::vector<float>& b) {
      double scale = 1, diff = 0;
      for (size_t k = 0; k < a.size(); ++k) {
        scale = std::max(scale, double(std::fabs(a[k])));
        diff = std::max(diff, std::fabs(double(a[k]) - double(b[k])));
      }
      return diff / scale;
    };
    REQUIRE(y[0].size() == y[1].size());
    CHECK(worst(y[0], y[1]) <= 1e-5);
    CHECK(worst(grad_x[0], grad_x[1]) <= 1e-5);
    CHECK(worst(grad_w[0], grad_w[1]) <= 1e-5);
  }
}
