// The main job's CNN against the machine's sgemm rate, measured in turns in one process: how
// much of the GEMM rate of the same threads a training step of the built-in Fashion-MNIST CNN
// reaches (issue 33's target: half). `mpigrad train --profile` beside a separate
// mpigrad-bench-core gives the same ratio, but on a shared VM the two processes see different
// moments of the host's drift; here each round times a block of CNN steps and then a block of
// 1024^3 cblas_sgemm calls, and the ratio is taken round by round.
//
//   mpigrad-bench-cnn-rate [--rounds 12] [--steps 10] [--gemms 4] [--batch 64] [--json FILE]
//
// The model is `mpigrad train`'s cnn as examples/fashion_mnist_cnn.ini builds it (channels 16,
// 32, hidden 128, 10 classes, no dropout; each block conv 3x3 -> BatchNorm -> ReLU -> 2x2 max
// pool), trained with SGD (momentum 0.9, weight decay 1e-4) on random [batch, 1, 28, 28] images.
// A step's FLOPs count the convolutions' and linear layers' multiply-adds twice: forward, the
// data gradient of every layer but the first, and every weight gradient (453 MFLOP at batch 64).
// The loader, normalization and metrics of `mpigrad train` are not in the step (its "data wait"
// row, about 0.1 ms of a 4-6 ms step).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../common/bench_util.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/core/threads.h"
#include "mpigrad/kernels/matmul.h"
#include "mpigrad/nn/loss.h"
#include "mpigrad/nn/models.h"
#include "mpigrad/nn/optim/sgd.h"

using namespace mpigrad;
using core::Tensor;

namespace {

struct Options {
  int rounds = 12, steps = 10, gemms = 4;
  int64_t batch = 64;
  std::string json;
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc || arg == "--help" || arg == "-h") {
      std::fprintf(arg == "--help" || arg == "-h" ? stdout : stderr,
                   "usage: mpigrad-bench-cnn-rate [--rounds R] [--steps S] [--gemms G] "
                   "[--batch B] [--json FILE]\n");
      std::exit(arg == "--help" || arg == "-h" ? 0 : 2);
    }
    const std::string value = argv[++i];
    if (arg == "--rounds") {
      options.rounds = std::atoi(value.c_str());
    } else if (arg == "--steps") {
      options.steps = std::atoi(value.c_str());
    } else if (arg == "--gemms") {
      options.gemms = std::atoi(value.c_str());
    } else if (arg == "--batch") {
      options.batch = std::atoll(value.c_str());
    } else if (arg == "--json") {
      options.json = value;
    } else {
      std::fprintf(stderr, "unknown option %s\n", arg.c_str());
      std::exit(2);
    }
  }
  if (options.rounds < 1 || options.steps < 2 || options.gemms < 1 || options.batch < 1) {
    std::fprintf(stderr, "mpigrad-bench-cnn-rate: --rounds, --gemms, --batch >= 1, --steps >= 2\n");
    std::exit(2);
  }
  return options;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// FLOPs of one training step of the cnn (see the head of this file).
double step_flops(int64_t batch) {
  const double b = double(batch);
  const double conv1 = 2 * b * 28 * 28 * 16 * 1 * 9;   // 1 -> 16 on 28x28
  const double conv2 = 2 * b * 14 * 14 * 32 * 16 * 9;  // 16 -> 32 on 14x14
  const double fc1 = 2 * b * (32 * 7 * 7) * 128, fc2 = 2 * b * 128 * 10;
  return conv1 * 2 + conv2 * 3 + fc1 * 3 + fc2 * 3;  // no data gradient for the input image
}

}  // namespace

namespace {

int run(const Options& options) {
  const int threads = core::num_threads();
  core::Generator generator(1);
  std::shared_ptr<nn::Module> model =
      nn::make_cnn(core::Shape{1, 28, 28}, {16, 32}, {128}, 10, 0.0, generator);
  nn::SGD sgd(model->parameters(),
              nn::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4});
  const Tensor x = core::randn({options.batch, 1, 28, 28}, generator);
  std::vector<int64_t> labels(size_t(options.batch));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int64_t(i % 10);
  const Tensor y = Tensor::from_vector(labels, {options.batch});
  auto step = [&] {
    Tensor loss = nn::cross_entropy((*model)(x), y);
    sgd.zero_grad();
    loss.backward();
    sgd.step();
  };

  const int n = 1024;
  const Tensor a = core::rand({n, n}, generator), b = core::rand({n, n}, generator);
  std::vector<float> c(size_t(n) * n);
  auto gemm = [&] {
    // BLAS threads itself here, as many threads as the CNN's (mpigrad keeps it at 1 otherwise).
    kernels::cpu::set_blas_threads(threads);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data<float>(), n,
                b.data<float>(), n, 0.0f, c.data(), n);
    kernels::cpu::set_blas_threads(1);
  };
  for (int i = 0; i < 3; ++i) step();
  gemm();

  const double flops = step_flops(options.batch), gemm_flops = 2.0 * n * n * double(n);
  std::vector<double> steps, gemm_rates, round_ratios;
  for (int round = 0; round < options.rounds; ++round) {
    std::vector<double> round_steps, round_rates;
    for (int i = 0; i < options.steps; ++i) {
      const auto start = std::chrono::steady_clock::now();
      step();
      if (i > 0) round_steps.push_back(seconds_since(start));  // the first follows the GEMMs
    }
    for (int i = 0; i < options.gemms; ++i) {
      const auto start = std::chrono::steady_clock::now();
      gemm();
      round_rates.push_back(gemm_flops / seconds_since(start));
    }
    round_ratios.push_back(flops / bench::median(round_steps) / bench::median(round_rates));
    steps.insert(steps.end(), round_steps.begin(), round_steps.end());
    gemm_rates.insert(gemm_rates.end(), round_rates.begin(), round_rates.end());
  }
  const double step_median = bench::median(steps), gemm_median = bench::median(gemm_rates);
  const double step_best = *std::min_element(steps.begin(), steps.end());
  const double gemm_best = *std::max_element(gemm_rates.begin(), gemm_rates.end());
  const auto [low, high] = std::minmax_element(round_ratios.begin(), round_ratios.end());
  bench::Results results;
  results.add_text("wait", core::openmp_wait_description());
  results.add("threads", threads, "", "the CNN's and sgemm's");
  results.add("step_mflop", flops * 1e-6, "MFLOP", "one training step");
  results.add("step_ms", step_median * 1e3, "ms", "median");
  results.add("step_ms_best", step_best * 1e3, "ms", "fastest");
  results.add("cnn_gflops", flops / step_median * 1e-9, "GFLOP/s", "at the median step");
  results.add("sgemm_gflops", gemm_median * 1e-9, "GFLOP/s", "1024^3 cblas_sgemm, median");
  results.add("sgemm_gflops_best", gemm_best * 1e-9, "GFLOP/s", "fastest");
  results.add("rate_ratio", bench::median(round_ratios), "x",
              "CNN / sgemm, median of the rounds' ratios (target >= 0.5)");
  results.add("rate_ratio_low", *low, "x", "lowest round");
  results.add("rate_ratio_high", *high, "x", "highest round");
  results.add("rate_ratio_best", flops / step_best / gemm_best, "x", "fastest step / fastest gemm");
  return results.report(options.json, "mpigrad-bench-cnn-rate");
}

}  // namespace

int main(int argc, char** argv) {
  core::apply_openmp_wait_defaults(argv);  // the wait `mpigrad train` would choose
  const Options options = parse(argc, argv);
  return bench::run_reporting_errors("mpigrad-bench-cnn-rate", [&] { return run(options); });
}
