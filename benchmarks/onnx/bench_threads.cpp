// Thread scaling (or bf16 against float32) of a training step, measured in one process: the same
// ONNX image classifier trained with SGD on 1 and on N threads in turns (blocks of a few steps
// each, A B A B ...), so that a slow stretch of a shared machine reaches both thread counts
// alike. Separate processes one after the other (what `mpigrad train` and run_zoo.py can do) put
// seconds between the two sides, and on a shared VM the host's drift over seconds is as large as
// the effect measured: ResNet-18 at 2 threads ran 21 to 30 ms a step in runs a minute apart.
//
//   mpigrad-bench-threads --model resnet18.onnx [--input 3,32,32] [--classes 10] [--batch 8]
//                         [--threads 2] [--block 4] [--blocks 12] [--keep-padding-taps]
//                         [--compare threads|bf16] [--json FILE]
//
// --compare bf16 alternates float32 and bfloat16 autocast (what `mpigrad train
// --train.precision=bf16` runs) instead of thread counts, both on --threads threads (default 1
// there), for the same reason: the two precisions a minute apart differ by the host's drift.
// --keep-padding-taps convolves with the whole kernel where conv2d would drop the taps that see
// only padding (nn/functional/conv.h), to measure what dropping them changes.
// Each block runs `block` steps on one thread count and times each; the first step of a block is
// left out (the other count's threads and caches were the warm ones). The figures: the median
// step of each count over all kept steps and their ratio; the fastest step of each and their ratio
// (what other load on the machine disturbed least); and the median and range of the ratio of each
// pair of neighbouring blocks (the steadier figure where the machine drifts).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "../common/bench_util.h"
#include "mpigrad/core/autocast.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/core/threads.h"
#include "mpigrad/nn/functional/conv.h"
#include "mpigrad/nn/loss.h"
#include "mpigrad/nn/onnx/onnx_model.h"
#include "mpigrad/nn/optim/sgd.h"

using namespace mpigrad;
using core::Tensor;

namespace {

struct Options {
  std::string model;
  std::vector<int64_t> input{3, 32, 32};
  int64_t classes = 10;
  int64_t batch = 8;
  int threads = 2;
  int block = 4;
  int blocks = 12;
  bool keep_padding_taps = false;
  bool compare_bf16 = false;  // else thread counts
  std::string json;
};

[[noreturn]] void usage(int status) {
  std::fprintf(status == 0 ? stdout : stderr,
               "usage: mpigrad-bench-threads --model F.onnx [--input C,H,W] [--classes K] "
               "[--batch B] [--threads N] [--block S] [--blocks R] [--keep-padding-taps] "
               "[--compare threads|bf16] [--json FILE]\n");
  std::exit(status);
}

std::vector<int64_t> parse_dims(const std::string& text) {
  std::vector<int64_t> dims;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) dims.push_back(std::atoll(item.c_str()));
  return dims;
}

Options parse(int argc, char** argv) {
  Options options;
  bool threads_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") usage(0);
    if (arg == "--keep-padding-taps") {
      options.keep_padding_taps = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", arg.c_str());
      usage(2);
    }
    const std::string value = argv[++i];
    if (arg == "--model") {
      options.model = value;
    } else if (arg == "--input") {
      options.input = parse_dims(value);
    } else if (arg == "--classes") {
      options.classes = std::atoll(value.c_str());
    } else if (arg == "--batch") {
      options.batch = std::atoll(value.c_str());
    } else if (arg == "--threads") {
      options.threads = std::atoi(value.c_str());
      threads_given = true;
    } else if (arg == "--block") {
      options.block = std::atoi(value.c_str());
    } else if (arg == "--blocks") {
      options.blocks = std::atoi(value.c_str());
    } else if (arg == "--compare") {
      if (value != "threads" && value != "bf16") {
        std::fprintf(stderr, "--compare takes threads or bf16, got %s\n", value.c_str());
        usage(2);
      }
      options.compare_bf16 = value == "bf16";
    } else if (arg == "--json") {
      options.json = value;
    } else {
      std::fprintf(stderr, "unknown option %s\n", arg.c_str());
      usage(2);
    }
  }
  if (options.compare_bf16 && !threads_given) options.threads = 1;
  const bool valid =
      !options.model.empty() && !options.input.empty() && options.classes >= 1 &&
      options.batch >= 1 && options.threads >= (options.compare_bf16 ? 1 : 2) &&
      options.block >= 2 && options.blocks >= 1 &&
      std::all_of(options.input.begin(), options.input.end(), [](int64_t d) { return d >= 1; });
  if (!valid) {
    std::fprintf(stderr,
                 "mpigrad-bench-threads: needs --model, dimensions >= 1, --threads >= 2 (>= 1 "
                 "with --compare bf16) and --block >= 2\n");
    usage(2);
  }
  return options;
}

}  // namespace

namespace {

int run(const Options& options) {
  nn::functional::set_conv2d_drop_padding_taps(!options.keep_padding_taps);
  std::shared_ptr<nn::OnnxModel> model = nn::OnnxModel::load(options.model);
  nn::SGD sgd(model->parameters(), nn::SGDOptions{.lr = 0.01, .momentum = 0.9});

  std::vector<int64_t> shape{options.batch};
  shape.insert(shape.end(), options.input.begin(), options.input.end());
  core::Generator generator(1);
  const Tensor x = core::rand(core::Shape(shape), generator);
  std::vector<int64_t> labels(size_t(options.batch));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int64_t(i) % options.classes;
  const Tensor y = Tensor::from_vector(labels, {options.batch});

  // The two sides, A and B: thread counts, or float32 and bf16 autocast on one count.
  struct Side {
    int threads;
    std::optional<core::DType> autocast;
    std::string name;
  };
  const std::string n = std::to_string(options.threads);
  const Side sides[2] = {options.compare_bf16 ? Side{options.threads, std::nullopt, "float32"}
                                              : Side{1, std::nullopt, "1_thread"},
                         options.compare_bf16
                             ? Side{options.threads, core::kBFloat16, "bf16"}
                             : Side{options.threads, std::nullopt, n + "_threads"}};
  auto step = [&](const Side& side) {
    Tensor loss;
    {
      core::AutocastGuard autocast(side.autocast);  // the forward, as `mpigrad train` does
      loss = nn::cross_entropy((*model)(x), y);
    }
    sgd.zero_grad();
    loss.backward();
    sgd.step();
  };
  // Warm-up on both sides: each builds its own kernels' plans on its first steps.
  for (const Side& side : sides) {
    core::set_num_threads(side.threads);
    for (int i = 0; i < 3; ++i) step(side);
  }

  std::vector<double> one, many, pair_ratios;  // A's steps, B's steps
  double block_one = 0;
  for (int b = 0; b < 2 * options.blocks; ++b) {
    const bool single = b % 2 == 0;
    const Side& side = sides[single ? 0 : 1];
    core::set_num_threads(side.threads);
    std::vector<double> times;
    for (int i = 0; i < options.block; ++i) {
      const auto start = std::chrono::steady_clock::now();
      step(side);
      const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
      if (i > 0) times.push_back(elapsed.count());
    }
    const double block_median = bench::median(times);
    (single ? one : many).insert((single ? one : many).end(), times.begin(), times.end());
    if (single) {
      block_one = block_median;
    } else {
      pair_ratios.push_back(block_one / block_median);
    }
  }
  const double one_step = bench::median(one), many_step = bench::median(many);
  const auto [low, high] = std::minmax_element(pair_ratios.begin(), pair_ratios.end());
  bench::Results results;
  results.add_text("model", options.model);
  results.add_text("wait", core::openmp_wait_description());
  results.add_text("padding taps", options.keep_padding_taps ? "kept" : "dropped");
  if (options.compare_bf16) results.add_text("threads", n);
  const std::string& a = sides[0].name;
  const std::string& b = sides[1].name;
  results.add("step_ms_" + a, one_step * 1e3, "ms", "median of kept steps");
  results.add("step_ms_" + b, many_step * 1e3, "ms", "median of kept steps");
  results.add("speedup", one_step / many_step, "x", a + " / " + b + ", medians");
  const double one_best = *std::min_element(one.begin(), one.end());
  const double many_best = *std::min_element(many.begin(), many.end());
  results.add("best_ms_" + a, one_best * 1e3, "ms", "fastest kept step");
  results.add("best_ms_" + b, many_best * 1e3, "ms", "fastest kept step");
  results.add("speedup_best", one_best / many_best, "x", "of the fastest steps (least disturbed)");
  results.add("speedup_pairs_median", bench::median(pair_ratios), "x",
              "median over neighbouring block pairs");
  results.add("speedup_pairs_low", *low, "x", "");
  results.add("speedup_pairs_high", *high, "x", "");
  return results.report(options.json, "mpigrad-bench-threads");
}

}  // namespace

int main(int argc, char** argv) {
  core::apply_openmp_wait_defaults(argv);  // the wait `mpigrad train` would choose
  const Options options = parse(argc, argv);
  return bench::run_reporting_errors("mpigrad-bench-threads", [&] { return run(options); });
}
