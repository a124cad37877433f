// mpigrad-bench-optimizer: the optimizer step alone, against the machine's memory bandwidth.
//
// Two parameter sets with the tensor shapes of real models: GPT-2 124M (148 tensors, 124.4M
// float32, one of them the 38.6M-element token embedding) and ResNet-18 (62 tensors, 11.7M
// float32, many of them BatchNorm vectors of 64 to 512). Each is stepped by SGD (momentum 0.9,
// weight decay), Adam and AdamW through the nn API, the way training calls them, on 1 thread and
// on the default thread count. A step must read and write every byte of its state once:
// SGD with momentum reads param, grad and momentum buffer and writes param and buffer (20 bytes
// an element), Adam reads param, grad and two moments and writes three (28 bytes). The GB/s of
// that traffic is set beside an in-place pass over 256 MiB (a = 0.5 * a + 0.25, read + write)
// split over the same threads, what a single pass over memory reaches. CPU seconds per step beside
// wall seconds show whether the second thread works (its CPU time pays for itself) or spins.
//
// Usage: mpigrad-bench-optimizer [--json FILE] [--quick] [--sets gpt2,resnet18]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../common/bench_util.h"
#include "mpigrad/mpigrad.h"

using namespace mpigrad::core;

namespace {

struct ParameterSet {
  std::string name;
  std::vector<std::vector<int64_t>> shapes;
};

ParameterSet gpt2_124m() {
  ParameterSet set{"gpt2", {}};
  const int64_t d = 768, vocab = 50257, context = 1024;
  set.shapes = {{vocab, d}, {context, d}};
  for (int layer = 0; layer < 12; ++layer) {
    const std::vector<std::vector<int64_t>> block = {
        {d}, {d}, {3 * d, d}, {3 * d}, {d, d}, {d}, {d}, {d}, {4 * d, d}, {4 * d}, {d, 4 * d}, {d}};
    set.shapes.insert(set.shapes.end(), block.begin(), block.end());
  }
  set.shapes.push_back({d});
  set.shapes.push_back({d});
  return set;
}

ParameterSet resnet18() {
  ParameterSet set{"resnet18", {{64, 3, 7, 7}, {64}, {64}}};
  auto conv_bn = [&](int64_t out, int64_t in, int64_t k) {
    set.shapes.push_back({out, in, k, k});
    set.shapes.push_back({out});
    set.shapes.push_back({out});
  };
  int64_t in = 64;
  for (int64_t width : {64, 128, 256, 512}) {
    for (int block = 0; block < 2; ++block) {
      conv_bn(width, block == 0 ? in : width, 3);
      conv_bn(width, width, 3);
      if (block == 0 && width != in) conv_bn(width, in, 1);
    }
    in = width;
  }
  set.shapes.push_back({1000, 512});
  set.shapes.push_back({1000});
  return set;
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

struct Timing {
  double wall = 0, cpu = 0;  // seconds per call, best repeat (wall) and its CPU time
};

Timing time_calls(const std::function<void()>& fn, int iterations, int repeats) {
  fn();  // warm-up: allocates the optimizer state
  Timing best{1e30, 0};
  for (int r = 0; r < repeats; ++r) {
    const double cpu0 = process_cpu_seconds();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) fn();
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    const double cpu = process_cpu_seconds() - cpu0;
    if (elapsed.count() / iterations < best.wall)
      best = {elapsed.count() / iterations, cpu / iterations};
  }
  return best;
}

// GB/s of an in-place pass, a = 0.5 * a + 0.25, over `bytes` of float32 split into one
// contiguous chunk per thread (read + write): the optimizers' kind of loop, which writes only
// lines it has read. (A copy to another buffer also reads each destination line before writing
// it, a third of its traffic uncounted; glibc's memcpy of a large buffer bypasses the cache.)
double copy_gbps(int64_t bytes, int threads, int repeats) {
  const int64_t n = bytes / int64_t(sizeof(float));
  std::vector<float> data(size_t(n), 1.0f);
  auto pass = [&] {
#pragma omp parallel num_threads(threads)
    {
      const int64_t chunk = n / omp_get_num_threads();
      const int64_t begin = chunk * omp_get_thread_num();
      const int64_t end = omp_get_thread_num() == omp_get_num_threads() - 1 ? n : begin + chunk;
      float* a = data.data();
      for (int64_t i = begin; i < end; ++i) a[i] = 0.5f * a[i] + 0.25f;
    }
  };
  const Timing t = time_calls(pass, 3, repeats);
  return 2.0 * double(bytes) / t.wall * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  bool quick = false;
  std::string sets = "gpt2,resnet18";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (arg == "--quick") {
      quick = true;
    } else if (arg == "--sets" && i + 1 < argc) {
      sets = argv[++i];
    } else if (arg == "--help" || arg == "-h") {
      std::printf("usage: %s [--json FILE] [--quick] [--sets gpt2,resnet18]\n", argv[0]);
      return 0;
    } else {
      std::fprintf(stderr, "mpigrad-bench-optimizer: unknown argument '%s' (try --help)\n",
                   arg.c_str());
      return 2;
    }
  }

  initialize_cpu_runtime();
  const int default_threads = num_threads();
  mpigrad::bench::Results results;
  results.add_text("threads", std::to_string(default_threads));
  const int repeats = quick ? 2 : 5;
  std::vector<int> thread_counts = {1};
  if (default_threads > 1) thread_counts.push_back(default_threads);

  std::vector<double> copy(thread_counts.size());
  for (size_t i = 0; i < thread_counts.size(); ++i) {
    copy[i] = copy_gbps(int64_t(256) << 20, thread_counts[i], repeats);
    results.add("copy_gbps_t" + std::to_string(thread_counts[i]), copy[i], "GB/s",
                "256 MiB in-place pass, read + write");
  }

  for (const ParameterSet& set : {gpt2_124m(), resnet18()}) {
    if (sets.find(set.name) == std::string::npos) continue;
    Generator generator(1);
    std::vector<Tensor> params;
    int64_t elements = 0;
    for (const auto& shape : set.shapes) {
      Tensor p = randn(Shape(shape), generator).set_requires_grad();
      p.set_grad(randn(Shape(shape), generator));
      elements += p.numel();
      params.push_back(p);
    }
    results.add(set.name + "_tensors", double(params.size()), "count", "");
    results.add(set.name + "_elements", double(elements), "count", "float32");

    mpigrad::nn::SGDOptions sgd_options;
    sgd_options.lr = 1e-4;
    sgd_options.momentum = 0.9;
    sgd_options.weight_decay = 1e-4;
    mpigrad::nn::AdamOptions adam_options;
    adam_options.lr = 1e-5;
    struct Case {
      const char* name;
      std::unique_ptr<mpigrad::nn::Optimizer> optimizer;
      double bytes_per_element;
    };
    std::vector<Case> cases;
    cases.push_back({"sgd", std::make_unique<mpigrad::nn::SGD>(params, sgd_options), 20});
    cases.push_back({"adam", std::make_unique<mpigrad::nn::Adam>(params, adam_options), 28});
    cases.push_back({"adamw", std::make_unique<mpigrad::nn::AdamW>(params), 28});
    for (Case& c : cases) {
      for (size_t k = 0; k < thread_counts.size(); ++k) {
        const int threads = thread_counts[k];
        set_num_threads(threads);
        const int iterations = set.name == "gpt2" ? 1 : (quick ? 2 : 10);
        const Timing t = time_calls([&] { c.optimizer->step(); }, iterations, repeats);
        const double gbps = c.bytes_per_element * double(elements) / t.wall * 1e-9;
        const std::string key = set.name + "_" + c.name + "_t" + std::to_string(threads);
        results.add(key + "_ms", t.wall * 1e3, "ms", "one step, best of the repeats");
        results.add(key + "_cpu_ms", t.cpu * 1e3, "ms", "CPU time of that step, all threads");
        results.add(key + "_gbps", gbps, "GB/s", "state bytes read + written / wall time");
        results.add(key + "_of_copy", gbps / copy[k], "ratio",
                    "of the in-place pass on as many threads");
      }
      set_num_threads(default_threads);
    }
  }

  return results.report(json_path, "mpigrad-bench-optimizer");
}
