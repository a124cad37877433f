// Conv2d on the CPU (im2col + batched GEMM) against the raw GEMM it reduces to.
//
// For each shape the baseline is one BLAS call of the same total size as the convolution's
// GEMMs: [out, in*kh*kw] x [in*kh*kw, N*oh*ow], with no im2col and no per-image loop. The
// ratio conv / GEMM says what the unrolling and per-image dispatch cost; close to 1 means the
// im2col path is as fast as this BLAS allows and a different algorithm (oneDNN, Winograd) would
// be the only way to go faster.
#include <cstdio>
#include <cstring>
#include <string>

#include "../common/bench_util.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/backend.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/kernels/matmul.h"
#include "mpigrad/nn/functional/conv.h"

using namespace mpigrad;  // NOLINT

namespace {
struct Shape {
  const char* name;
  int64_t n, c, h, w, oc, k, stride, pad;
};
}  // namespace

int main(int argc, char** argv) {
  std::string json;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) json = argv[++i];
  }
  const Shape shapes[] = {
      {"mnist_conv1 32x1x28x28 k3 ->16", 32, 1, 28, 28, 16, 3, 1, 1},
      {"mnist_conv2 32x16x14x14 k3 ->32", 32, 16, 14, 14, 32, 3, 1, 1},
      {"resnet 16x64x32x32 k3 ->64", 16, 64, 32, 32, 64, 3, 1, 1},
      {"resnet_down 16x64x32x32 k3 s2 ->128", 16, 64, 32, 32, 128, 3, 2, 1},
      {"pointwise 16x128x16x16 k1 ->256", 16, 128, 16, 16, 256, 1, 1, 0},
  };
  bench::Results results;
  core::Generator gen(0);
  for (const Shape& s : shapes) {
    core::Tensor x = core::randn({s.n, s.c, s.h, s.w}, gen);
    core::Tensor w = core::randn({s.oc, s.c, s.k, s.k}, gen);
    core::Tensor b = core::randn({s.oc}, gen);
    nn::functional::Conv2dOptions o;
    o.stride = {s.stride, s.stride};
    o.padding = {s.pad, s.pad};
    const int64_t oh = (s.h + 2 * s.pad - s.k) / s.stride + 1,
                  ow = (s.w + 2 * s.pad - s.k) / s.stride + 1;
    const int64_t m = s.oc, k = s.c * s.k * s.k, cols = s.n * oh * ow;
    const double flops = 2.0 * double(m) * double(k) * double(cols);

    core::Tensor a = core::randn({m, k}, gen), bb = core::randn({k, cols}, gen);
    core::Tensor c = core::empty({m, cols});
    kernels::GemmShape g;
    g.m = m;
    g.n = cols;
    g.k = k;
    g.lda = k;
    g.ldb = cols;
    g.ldc = cols;
    auto& backend = core::backend_for(core::kCPU);
    const double gemm_s = bench::seconds_per_call(
        [&] {
          backend.gemm(core::kFloat32, g, 1.0, a.data_ptr(), bb.data_ptr(), 0.0, c.data_ptr());
        },
        3);
    const double fwd_s = bench::seconds_per_call(
        [&] {
          core::NoGradGuard no_grad;
          nn::functional::conv2d(x, w, b, o);
        },
        3);
    core::Tensor xl = x.detach().set_requires_grad(true), wl = w.detach().set_requires_grad(true);
    const double fwd_bwd_s = bench::seconds_per_call(
        [&] {
          core::Tensor out = nn::functional::conv2d(xl, wl, b, o);
          out.backward(core::ones_like(out));
        },
        2, 3);
    const std::string key = s.name;
    results.add(key + " gemm", gemm_s * 1e3, "ms",
                std::to_string(int(flops / gemm_s / 1e9)) + " GFLOP/s");
    results.add(key + " conv fwd", fwd_s * 1e3, "ms",
                "ratio to gemm " + std::to_string(fwd_s / gemm_s).substr(0, 4) + ", " +
                    std::to_string(int(flops / fwd_s / 1e9)) + " GFLOP/s");
    results.add(key + " conv fwd+bwd", fwd_bwd_s * 1e3, "ms",
                "ratio to 3 gemms " + std::to_string(fwd_bwd_s / (3 * gemm_s)).substr(0, 4));
  }
  results.add_text("blas core", kernels::cpu::blas_core_name());
  return results.report(json, "mpigrad-bench-conv");
}
