// mpigrad-bench-conv-paths: the CPU convolution's paths, im2col + sgemm, oneDNN's direct kernels
// and mpigrad's direct loops (depthwise shapes, and stems of 1 to 4 input channels), on the
// convolutions of the zoo's CNNs and of the built-in Fashion-MNIST CNN, side by side in one run.
//
// Each row is one convolution of ResNet-18/50, MobileNetV3 / EfficientNet-B0 or ConvNeXt-Tiny
// as the zoo trains them (batch 8, 32x32 input images), or of examples/fashion_mnist_cnn.ini
// (batch 64, 28x28 grayscale images), timed through the CPU backend for each
// pass (forward, backward data, backward filter) on each path, forced with
// kernels::cpu::set_conv2d_path_override, and reported in GFLOP/s (2 * multiply-adds of the
// convolution, the same count for all three passes). The last column is the path the rule
// (kernels::cpu::conv2d_path) takes; the summary adds up each family's time on each path (direct:
// where the direct loops cannot take a pass, its GEMM time) and on the rule's choices, which is
// what the rule must get right. The FLOPs count every tap, padding included, as the GEMM path
// computes. docs/benchmarks.md, "Convolution paths", holds a run of it.
//
// --bf16 times the mixed-precision passes instead (bfloat16 x, w and grad_y, float32 results:
// autocast's convolution), where direct loops do not apply.
//
// --family NAME (e.g. "mnist cnn") times one family's cases only.
//
//   mpigrad-bench-conv-paths [--threads N (1)] [--json FILE] [--quick] [--bf16] [--family NAME]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "../common/bench_util.h"
#include "mpigrad/core/backend.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/core/threads.h"
#include "mpigrad/kernels/conv.h"
#include "mpigrad/kernels/matmul.h"

using namespace mpigrad;  // NOLINT
using kernels::cpu::ConvPass;
using kernels::cpu::ConvPath;

namespace {

struct Case {
  const char* family;
  const char* name;
  int64_t channels, size, out_channels, kernel, stride, pad, groups;
  int64_t batch = 8;
};

// The zoo's convolutions at 32x32 input (benchmarks/zoo/zoo_models.py): the spatial size each
// layer sees after the stems' downsampling.
const Case kCases[] = {
    {"dense stem", "resnet stem 7x7 s2 3->64 @32", 3, 32, 64, 7, 2, 3, 1},
    {"dense stem", "mbv3/effnet stem 3x3 s2 3->16 @32", 3, 32, 16, 3, 2, 1, 1},
    {"dense stem", "effnet stem 3x3 s2 3->32 @32", 3, 32, 32, 3, 2, 1, 1},
    {"dense stem", "convnext stem 4x4 s4 3->96 @32", 3, 32, 96, 4, 4, 0, 1},
    {"dense kxk", "resnet 3x3 64 @8", 64, 8, 64, 3, 1, 1, 1},
    {"dense kxk", "resnet 3x3 s2 64->128 @8", 64, 8, 128, 3, 2, 1, 1},
    {"dense kxk", "resnet 3x3 128 @4", 128, 4, 128, 3, 1, 1, 1},
    {"dense kxk", "resnet 3x3 256 @2", 256, 2, 256, 3, 1, 1, 1},
    {"dense kxk", "resnet 3x3 512 @1", 512, 1, 512, 3, 1, 1, 1},
    {"dense kxk", "convnext down 2x2 s2 96->192 @8", 96, 8, 192, 2, 2, 0, 1},
    {"pointwise", "resnet50 1x1 64->64 @8", 64, 8, 64, 1, 1, 0, 1},
    {"pointwise", "resnet50 1x1 64->256 @8", 64, 8, 256, 1, 1, 0, 1},
    {"pointwise", "resnet50 1x1 256->64 @8", 256, 8, 64, 1, 1, 0, 1},
    {"pointwise", "resnet50 1x1 512->128 @4", 512, 4, 128, 1, 1, 0, 1},
    {"pointwise", "resnet50 1x1 1024->256 @2", 1024, 2, 256, 1, 1, 0, 1},
    {"pointwise", "mbv3 1x1 16->72 @8", 16, 8, 72, 1, 1, 0, 1},
    {"pointwise", "effnet 1x1 96->24 @8", 96, 8, 24, 1, 1, 0, 1},
    {"pointwise", "effnet 1x1 320->1280 @1", 320, 1, 1280, 1, 1, 0, 1},
    {"pointwise s2", "resnet18 down 1x1 s2 64->128 @8", 64, 8, 128, 1, 2, 0, 1},
    {"pointwise s2", "resnet50 down 1x1 s2 256->512 @8", 256, 8, 512, 1, 2, 0, 1},
    {"grouped", "resnext 3x3 g32 128 @8", 128, 8, 128, 3, 1, 1, 32},
    {"grouped", "resnext 3x3 g32 256 @4", 256, 4, 256, 3, 1, 1, 32},
    {"depthwise 3x3", "effnet dw3x3 32 @16", 32, 16, 32, 3, 1, 1, 32},
    {"depthwise 3x3", "mbv3 dw3x3 s2 16 @16", 16, 16, 16, 3, 2, 1, 16},
    {"depthwise 3x3", "effnet dw3x3 240 @2", 240, 2, 240, 3, 1, 1, 240},
    {"depthwise 5x5", "effnet dw5x5 s2 144 @8", 144, 8, 144, 5, 2, 2, 144},
    {"depthwise 5x5", "mbv3 dw5x5 240 @2", 240, 2, 240, 5, 1, 2, 240},
    {"depthwise 5x5", "effnet dw5x5 672 @1", 672, 1, 672, 5, 1, 2, 672},
    {"depthwise 7x7", "convnext dw7x7 96 @8", 96, 8, 96, 7, 1, 3, 96},
    {"depthwise 7x7", "convnext dw7x7 192 @4", 192, 4, 192, 7, 1, 3, 192},
    {"depthwise 7x7", "convnext dw7x7 384 @2", 384, 2, 384, 7, 1, 3, 384},
    {"depthwise 7x7", "convnext dw7x7 768 @1", 768, 1, 768, 7, 1, 3, 768},
    // examples/fashion_mnist_cnn.ini at its batch of 64.
    {"mnist cnn", "mnist conv1 3x3 1->16 @28 b64", 1, 28, 16, 3, 1, 1, 1, 64},
    {"mnist cnn", "mnist conv2 3x3 16->32 @14 b64", 16, 14, 32, 3, 1, 1, 1, 64},
    // Grayscale and RGB stems at stride 1 and 2, the direct stem loops' other shapes.
    {"small stem", "gray 5x5 1->32 @28 b64", 1, 28, 32, 5, 1, 2, 1, 64},
    {"small stem", "gray 3x3 s2 1->16 @28 b64", 1, 28, 16, 3, 2, 1, 1, 64},
    {"small stem", "rgb 3x3 3->32 @32 b64", 3, 32, 32, 3, 1, 1, 1, 64},
    {"small stem", "rgba 3x3 s2 4->24 @33 b64", 4, 33, 24, 3, 2, 1, 1, 64},
};

core::Conv2dShape shape_of(const Case& c) {
  core::Conv2dShape s;
  s.batch = c.batch;
  s.out_channels = c.out_channels;
  s.groups = c.groups;
  auto& g = s.geometry;
  g.channels = c.channels;
  g.height = g.width = c.size;
  g.kernel_h = g.kernel_w = c.kernel;
  g.stride_h = g.stride_w = c.stride;
  g.pad_h = g.pad_w = c.pad;
  g.out_h = g.out_w = (c.size + 2 * c.pad - c.kernel) / c.stride + 1;
  return s;
}

double flops_of(const core::Conv2dShape& s) {
  const auto& g = s.geometry;
  return 2.0 * double(s.batch) * double(s.out_channels) * double(g.out_h * g.out_w) *
         double(g.channels / s.groups) * double(g.kernel_h * g.kernel_w);
}

const char* pass_name(ConvPass pass) {
  switch (pass) {
    case ConvPass::Forward:
      return "fwd";
    case ConvPass::BackwardData:
      return "bwd-data";
    case ConvPass::BackwardFilter:
      return "bwd-filter";
  }
  return "?";
}

// One case's tensors: x, w and y as the passes read them (float32, or bfloat16 with --bf16),
// and float32 ones the passes write.
struct Operands {
  core::Tensor x, w, y, x_out, w_out, y_out;
};

// Seconds per call of `pass` on `path`; mixed precision when the operands are bfloat16.
double time_pass(ConvPass pass, ConvPath path, const core::Conv2dShape& s, const Operands& o,
                 bool quick) {
  auto& backend = core::backend_for(core::kCPU);
  const ConvPath previous = kernels::cpu::set_conv2d_path_override(path);
  const bool mixed = o.x.dtype() != core::kFloat32;
  auto call = [&] {
    switch (pass) {
      case ConvPass::Forward:
        if (mixed) {
          return backend.conv2d_forward_mixed(o.x.dtype(), s, o.x.data_ptr(), o.w.data_ptr(),
                                              o.y_out.data<float>());
        }
        return backend.conv2d_forward(core::kFloat32, s, o.x.data_ptr(), o.w.data_ptr(),
                                      o.y_out.data_ptr());
      case ConvPass::BackwardData:
        if (mixed) {
          return backend.conv2d_backward_data_mixed(o.x.dtype(), s, o.y.data_ptr(), o.w.data_ptr(),
                                                    o.x_out.data<float>());
        }
        return backend.conv2d_backward_data(core::kFloat32, s, o.y.data_ptr(), o.w.data_ptr(),
                                            o.x_out.data_ptr());
      case ConvPass::BackwardFilter:
        if (mixed) {
          return backend.conv2d_backward_filter_mixed(o.x.dtype(), s, o.x.data_ptr(),
                                                      o.y.data_ptr(), o.w_out.data<float>());
        }
        return backend.conv2d_backward_filter(core::kFloat32, s, o.x.data_ptr(), o.y.data_ptr(),
                                              o.w_out.data_ptr());
    }
  };
  // About 20 ms a timing (5 ms with --quick), at least 3 calls.
  call();
  const double once = bench::seconds_per_call(call, 1, 1);
  const int iterations = std::max(3, int((quick ? 0.005 : 0.02) / std::max(once, 1e-7)));
  const double seconds = bench::seconds_per_call(call, iterations, quick ? 2 : 3);
  kernels::cpu::set_conv2d_path_override(previous);
  return seconds;
}

struct Totals {
  double gemm = 0, onednn = 0, direct = 0, rule = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string json;
  int threads = 1;
  bool quick = false;
  std::string only;  // --family: time that family's cases only
  core::DType operand = core::kFloat32;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json = argv[++i];
    } else if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--family") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else if (std::strcmp(argv[i], "--bf16") == 0) {
      operand = core::kBFloat16;
    } else {
      std::fprintf(stderr,
                   "usage: mpigrad-bench-conv-paths [--threads N] [--json FILE] [--quick] [--bf16] "
                   "[--family NAME]\n");
      return 2;
    }
  }
  core::set_num_threads(threads);
  bench::Results results;
  results.add_text("threads", std::to_string(threads));
  results.add_text("batch", "8 (the zoo's shapes), 64 (mnist cnn, small stem)");
  results.add_text("operands", core::dtype_name(operand));
  if (operand != core::kFloat32 && !kernels::cpu::has_native_bf16()) {
    std::printf("this CPU has no AVX512-BF16: bf16 never reaches oneDNN, both columns are GEMM\n");
  }
  core::Generator gen(0);
  std::map<std::string, std::map<ConvPass, Totals>> totals;
  std::vector<std::string> families;
  std::printf("%-36s %-10s %9s %9s %9s  %-6s %s\n", "convolution", "pass", "gemm GF/s", "dnnl GF/s",
              "dir GF/s", "rule", "oneDNN kernel");
  for (const Case& c : kCases) {
    if (!only.empty() && only != c.family) continue;
    const core::Conv2dShape s = shape_of(c);
    const auto& g = s.geometry;
    Operands o;
    o.x_out = core::randn({c.batch, c.channels, c.size, c.size}, gen);
    o.w_out = core::randn({c.out_channels, c.channels / c.groups, c.kernel, c.kernel}, gen);
    o.y_out = core::randn({c.batch, c.out_channels, g.out_h, g.out_w}, gen);
    o.x = o.x_out.to(operand);
    o.w = o.w_out.to(operand);
    o.y = o.y_out.to(operand);
    const double flops = flops_of(s);
    if (std::find(families.begin(), families.end(), c.family) == families.end()) {
      families.push_back(c.family);
    }
    for (ConvPass pass : {ConvPass::Forward, ConvPass::BackwardData, ConvPass::BackwardFilter}) {
      const double gemm_s = time_pass(pass, ConvPath::Gemm, s, o, quick);
      const double onednn_s = time_pass(pass, ConvPath::OneDnn, s, o, quick);
      const bool direct = kernels::cpu::has_direct_conv2d(pass, operand, s);
      const double direct_s = direct ? time_pass(pass, ConvPath::Direct, s, o, quick) : 0;
      const ConvPath chosen = kernels::cpu::conv2d_path(pass, operand, s);
      const std::string kernel =
          kernels::cpu::conv2d_onednn_implementation(pass, operand, core::kFloat32, s);
      Totals& t = totals[c.family][pass];
      t.gemm += gemm_s;
      t.onednn += onednn_s;
      t.direct += direct ? direct_s : gemm_s;
      t.rule += chosen == ConvPath::OneDnn   ? onednn_s
                : chosen == ConvPath::Direct ? direct_s
                                             : gemm_s;
      const char* chosen_name = chosen == ConvPath::OneDnn   ? "dnnl"
                                : chosen == ConvPath::Direct ? "direct"
                                                             : "gemm";
      char direct_text[32] = "-";
      if (direct) std::snprintf(direct_text, sizeof direct_text, "%.1f", flops / direct_s / 1e9);
      std::printf("%-36s %-10s %9.1f %9.1f %9s  %-6s %s\n", c.name, pass_name(pass),
                  flops / gemm_s / 1e9, flops / onednn_s / 1e9, direct_text, chosen_name,
                  kernel.c_str());
      const std::string key = std::string(c.name) + " " + pass_name(pass);
      results.add(key + " gemm", flops / gemm_s / 1e9, "GFLOP/s");
      if (direct) results.add(key + " direct", flops / direct_s / 1e9, "GFLOP/s");
      results.add(key + " dnnl", flops / onednn_s / 1e9, "GFLOP/s");
    }
  }
  std::printf("\n%-16s %-10s %9s %9s %9s %9s\n", "family", "pass", "gemm ms", "dnnl ms",
              "direct ms", "rule ms");
  for (const std::string& family : families) {
    for (ConvPass pass : {ConvPass::Forward, ConvPass::BackwardData, ConvPass::BackwardFilter}) {
      const Totals& t = totals[family][pass];
      std::printf("%-16s %-10s %9.3f %9.3f %9.3f %9.3f\n", family.c_str(), pass_name(pass),
                  t.gemm * 1e3, t.onednn * 1e3, t.direct * 1e3, t.rule * 1e3);
      const std::string key = family + " " + pass_name(pass);
      results.add(key + " gemm_ms", t.gemm * 1e3, "ms");
      results.add(key + " dnnl_ms", t.onednn * 1e3, "ms");
      results.add(key + " direct_ms", t.direct * 1e3, "ms");
      results.add(key + " rule_ms", t.rule * 1e3, "ms");
    }
  }
  if (!json.empty() && !results.write_json(json)) {
    std::fprintf(stderr, "mpigrad-bench-conv-paths: cannot write %s\n", json.c_str());
    return 1;
  }
  return 0;
}
