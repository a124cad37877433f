// Mixed precision on this CPU: bf16 autocast against fp32, side by side in one run.
//
// 1. GEMM: C = A B at 1024^3 (and --size), fp32 through the linked BLAS's sgemm against bf16
//    operands through gemm_mixed (oneDNN, AVX512-BF16), GFLOP/s and the ratio; and the same
//    bf16 product through the fallback every CPU without AVX512-BF16 takes (fp32 conversion +
//    sgemm), which says what the native path buys.
// 2. Training steps (zero_grad, forward, loss, backward, SGD step) of three models, each in
//    fp32 and under [train] precision = bf16, samples/s and the ratio bf16 / fp32:
//    the Fashion-MNIST CNN (examples/fashion_mnist_cnn.ini: conv 16, 32, hidden 128, batch 64),
//    ResNet-18 (width 64, 3x32x32 inputs, batch 32), and the 9.4M-parameter MLP of
//    bench_ddp (1024-2048-2048-1024-1024, batch 64).
// fp32 and bf16 alternate round by round and each keeps its best round, so a burst of load on a
// shared machine hits both alike.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/bench_util.h"
#include "mpigrad/core/autocast.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/kernels/matmul.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/layers/linear.h"
#include "mpigrad/nn/loss.h"
#include "mpigrad/nn/models.h"
#include "mpigrad/nn/optim/sgd.h"

namespace {

using namespace mpigrad;  // NOLINT
using core::Tensor;

struct Options {
  int64_t size = 1024;
  int repeats = 5;
  int iterations = 5;
  std::string models = "cnn,resnet18,mlp";
  std::string json;
};

double best_of_alternating(std::vector<std::function<void()>>& bodies, std::vector<double>& best,
                           int iterations, int repeats) {
  for (auto& body : bodies) body();  // warm-up: plans, caches, first allocations
  best.assign(bodies.size(), 1e30);
  for (int r = 0; r < repeats; ++r) {
    for (size_t i = 0; i < bodies.size(); ++i) {
      best[i] = std::min(best[i], bench::seconds_per_call(bodies[i], iterations, 1));
    }
  }
  return 0;
}

void bench_gemm(const Options& options, bench::Results& results) {
  const int64_t n = options.size;
  core::Generator generator(1);
  const Tensor a = core::randn({n, n}, generator), b = core::randn({n, n}, generator);
  const Tensor a16 = a.to(core::kBFloat16), b16 = b.to(core::kBFloat16);
  Tensor c = core::zeros({n, n});
  kernels::GemmShape shape;
  shape.m = shape.n = shape.k = n;
  shape.lda = shape.ldb = shape.ldc = n;
  float* out = c.data<float>();
  std::vector<std::function<void()>> bodies = {
      [&] {
        kernels::cpu::gemm(kernels::DType::Float32, shape, 1.0, a.data_ptr(), b.data_ptr(), 0.0,
                           out);
      },
      [&] {
        kernels::cpu::gemm_mixed(kernels::DType::BFloat16, shape, 1.0, a16.data_ptr(),
                                 b16.data_ptr(), 0.0, out);
      },
  };
  std::vector<double> best;
  best_of_alternating(bodies, best, 3, options.repeats);
  const double flops = 2.0 * double(n) * double(n) * double(n);
  const std::string tag = "gemm_" + std::to_string(n);
  results.add(tag + "_fp32_gflops", flops / best[0] / 1e9, "GFLOP/s", "sgemm (OpenBLAS)");
  results.add(tag + "_bf16_gflops", flops / best[1] / 1e9, "GFLOP/s",
              kernels::cpu::bf16_gemm_path());
  results.add(tag + "_bf16_over_fp32", best[0] / best[1], "x", "");
  std::printf("gemm %lld^3: fp32 %.1f GFLOP/s, bf16 %.1f GFLOP/s, bf16/fp32 %.2fx\n",
              static_cast<long long>(n), flops / best[0] / 1e9, flops / best[1] / 1e9,
              best[0] / best[1]);
  std::fflush(stdout);
}

// One model's training step in fp32 and in bf16, on the same inputs, each its own copy.
struct Model {
  std::string name;
  std::function<std::shared_ptr<nn::Module>()> build;
  Tensor x, target;
  bool classify = true;
  int64_t batch = 0;
};

void bench_model(const Model& m, const Options& options, bench::Results& results) {
  struct Run {
    std::shared_ptr<nn::Module> model;
    std::unique_ptr<nn::SGD> optimizer;
    std::optional<core::DType> autocast;
  };
  std::vector<Run> runs(2);
  runs[1].autocast = core::kBFloat16;
  std::vector<std::function<void()>> bodies;
  for (Run& run : runs) {
    run.model = m.build();
    run.optimizer = std::make_unique<nn::SGD>(run.model->parameters(),
                                              nn::SGDOptions{.lr = 1e-3, .momentum = 0.9});
    bodies.push_back([&run, &m] {
      run.optimizer->zero_grad();
      Tensor loss;
      {
        core::AutocastGuard autocast(run.autocast);
        Tensor out = (*run.model)(m.x);
        loss = m.classify ? nn::cross_entropy(out, m.target) : nn::mse_loss(out, m.target);
      }
      loss.backward();
      run.optimizer->step();
    });
  }
  std::vector<double> best;
  best_of_alternating(bodies, best, options.iterations, options.repeats);
  results.add(m.name + "_fp32_samples_per_s", double(m.batch) / best[0], "samples/s", "");
  results.add(m.name + "_bf16_samples_per_s", double(m.batch) / best[1], "samples/s", "");
  results.add(m.name + "_bf16_over_fp32", best[0] / best[1], "x", "");
  // As it comes: a model can take minutes on a loaded machine.
  std::printf("%s: fp32 %.1f samples/s, bf16 %.1f samples/s, bf16/fp32 %.2fx\n", m.name.c_str(),
              double(m.batch) / best[0], double(m.batch) / best[1], best[0] / best[1]);
  std::fflush(stdout);
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw core::Error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--size") {
      options.size = std::stoll(value());
    } else if (arg == "--repeats") {
      options.repeats = std::stoi(value());
    } else if (arg == "--iterations") {
      options.iterations = std::stoi(value());
    } else if (arg == "--models") {
      options.models = value();
    } else if (arg == "--json") {
      options.json = value();
    } else {
      std::printf(
          "usage: %s [--size N] [--models cnn,resnet18,mlp] [--iterations N] [--repeats N] "
          "[--json FILE]\n",
          argv[0]);
      std::exit(arg == "--help" || arg == "-h" ? 0 : 2);
    }
  }
  MPIGRAD_CHECK(options.size >= 1 && options.repeats >= 1 && options.iterations >= 1,
                "--size, --repeats and --iterations must be >= 1");
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options options = parse(argc, argv);
    bench::Results results;
    results.add_text("bf16_gemm_path", kernels::cpu::bf16_gemm_path());
    results.add_text("blas", kernels::cpu::blas_core_name());
    bench_gemm(options, results);

    core::Generator data(7);
    std::vector<Model> models;
    auto wanted = [&](const std::string& name) {
      return ("," + options.models + ",").find("," + name + ",") != std::string::npos;
    };
    if (wanted("cnn")) {
      models.push_back({"cnn",
                        [] {
                          core::Generator g(1);
                          return std::shared_ptr<nn::Module>(
                              nn::make_cnn({1, 28, 28}, {16, 32}, {128}, 10, 0.0, g));
                        },
                        core::randn({64, 1, 28, 28}, data), core::zeros({64}, core::kInt64), true,
                        64});
    }
    if (wanted("resnet18")) {
      models.push_back(
          {"resnet18",
           [] {
             core::Generator g(1);
             return std::shared_ptr<nn::Module>(nn::make_resnet({3, 32, 32}, 18, 64, 10, g));
           },
           core::randn({32, 3, 32, 32}, data), core::zeros({32}, core::kInt64), true, 32});
    }
    if (wanted("mlp")) {
      models.push_back({"mlp",
                        [] {
                          core::Generator g(0);
                          return std::shared_ptr<nn::Module>(
                              nn::make_mlp({1024}, {2048, 2048, 1024}, 1024, 0.0, g));
                        },
                        core::randn({64, 1024}, data), core::randn({64, 1024}, data), false, 64});
    }
    for (const Model& m : models) bench_model(m, options, results);
    return results.report(options.json, "mpigrad-bench-amp");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpigrad-bench-amp: %s\n", e.what());
    return 1;
  }
}
