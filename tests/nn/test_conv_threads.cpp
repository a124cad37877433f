// The CPU convolution's threads (kernels/cpu/conv_dnnl.cpp): a convolution too small to share
// runs its oneDNN primitive on the calling thread alone, so its three passes give the same bits
// at 1 and 2 threads (oneDNN's filter gradient otherwise sums the batch in a per-thread order),
// and a call leaves the OpenMP thread count as it found it.
#include <doctest/doctest.h>
#include <omp.h>

#include <cstring>
#include <string>
#include <vector>

#include "../thread_count.h"
#include "mpigrad/core/backend.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/core/threads.h"
#include "mpigrad/kernels/conv.h"

namespace {

using namespace mpigrad;  // NOLINT
using core::Tensor;
using kernels::cpu::ConvPass;

using test::ThreadCount;

// A 3x3 convolution of batch 8 over 16 -> 16 channels on 4x4 images: 0.3 MFLOP a pass, the size
// of MobileNetV3's late layers.
core::Conv2dShape small_shape() {
  core::Conv2dShape s;
  auto& g = s.geometry;
  g.channels = 16;
  g.height = g.width = 4;
  g.kernel_h = g.kernel_w = 3;
  g.pad_h = g.pad_w = 1;
  g.out_h = g.out_w = 4;
  s.batch = 8;
  s.out_channels = 16;
  return s;
}

struct PassOutputs {
  std::vector<float> y, grad_x, grad_w;
};

std::vector<float> values(const Tensor& t) {
  const float* p = static_cast<const float*>(t.data_ptr());
  return std::vector<float>(p, p + t.numel());
}

PassOutputs run_passes(const core::Conv2dShape& s, const Tensor& x, const Tensor& w,
                       const Tensor& gy) {
  Tensor y = core::empty(gy.shape()), gx = core::empty(x.shape()), gw = core::empty(w.shape());
  REQUIRE(kernels::cpu::conv2d_onednn(ConvPass::Forward, core::kFloat32, core::kFloat32, s,
                                      x.data_ptr(), w.data_ptr(), y.data_ptr()));
  REQUIRE(kernels::cpu::conv2d_onednn(ConvPass::BackwardData, core::kFloat32, core::kFloat32, s,
                                      gy.data_ptr(), w.data_ptr(), gx.data_ptr()));
  REQUIRE(kernels::cpu::conv2d_onednn(ConvPass::BackwardFilter, core::kFloat32, core::kFloat32, s,
                                      x.data_ptr(), gy.data_ptr(), gw.data_ptr()));
  return {values(y), values(gx), values(gw)};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("conv2d: a small oneDNN convolution gives the same bits at 1 and 2 threads") {
  const core::Conv2dShape s = small_shape();
  core::Generator generator(71);
  const Tensor x = core::randn({8, 16, 4, 4}, generator);
  const Tensor w = core::randn({16, 16, 3, 3}, generator);
  const Tensor gy = core::randn({8, 16, 4, 4}, generator);
  PassOutputs one, two;
  {
    ThreadCount threads(1);
    one = run_passes(s, x, w, gy);
  }
  {
    ThreadCount threads(2);
    two = run_passes(s, x, w, gy);
  }
  CHECK(same_bits(one.y, two.y));
  CHECK(same_bits(one.grad_x, two.grad_x));
  CHECK(same_bits(one.grad_w, two.grad_w));
}

TEST_CASE("conv2d: a oneDNN call leaves the thread count as it found it") {
  ThreadCount threads(2);
  core::Generator generator(72);
  const core::Conv2dShape small = small_shape();
  const Tensor x = core::randn({8, 16, 4, 4}, generator);
  const Tensor w = core::randn({16, 16, 3, 3}, generator);
  const Tensor gy = core::randn({8, 16, 4, 4}, generator);
  run_passes(small, x, w, gy);
  CHECK(omp_get_max_threads() == 2);
  CHECK(core::num_threads() == 2);
  (void)kernels::cpu::conv2d_path(ConvPass::Forward, core::kFloat32, small);
  (void)kernels::cpu::conv2d_onednn_implementation(ConvPass::BackwardFilter, core::kFloat32,
                                                   core::kFloat32, small);
  CHECK(omp_get_max_threads() == 2);
}
