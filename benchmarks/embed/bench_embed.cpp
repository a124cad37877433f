// mpigrad-bench-embed: the cost of the C API boundary. The same training step (the in-situ
// example's models: the 1024 -> 1024 MLP and the 3x3 circular conv, batch 16, Adam) through
// mpigrad_train_step on caller arrays, against EmbeddedModel::train_step on tensors, in the
// same run, in alternating blocks so that both see the same machine; each side keeps its best
// block. Also prints the C API's training throughput, which benchmarks/embed/torch_embed.py
// sets beside PyTorch's.
//
// With --cuda-graphs it measures [train] cuda_graphs instead: the step time of a small MLP on
// cuda:0 (1024 -> 256 -> 256 -> 1024, batch 16, Adam: launch-bound, where a graph pays) replayed
// from a CUDA graph against the same model stepped as usual, in alternating blocks.
//
// Usage: mpigrad-bench-embed [--json FILE] [--steps N] [--repeats R] [--config-dir DIR]
//                            [--cuda-graphs]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../common/bench_util.h"
#include "mpigrad/core/cuda.h"
#include "mpigrad/launch/insitu/embedded_model.h"
#include "mpigrad/mpigrad_c.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace core = mpigrad::core;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Comparison {
  double c_api = 1e30, cpp = 1e30;  // seconds per step, best block
};

Comparison compare(const std::string& config, int steps, int repeats) {
  constexpr int kBatch = 16, kCells = 32 * 32;
  std::vector<float> u(size_t(kBatch) * kCells), du(u.size());
  for (size_t i = 0; i < u.size(); ++i) {
    u[i] = float(std::sin(0.01 * double(i)));
    du[i] = float(std::cos(0.01 * double(i)));
  }
  // C API: the caller's arrays, as a host code holds them.
  mpigrad_model handle;
  if (mpigrad_model_create(&handle, config.c_str(), "cpu") != MPIGRAD_SUCCESS) {
    std::fprintf(stderr, "mpigrad-bench-embed: %s\n", mpigrad_last_error());
    std::exit(1);
  }
  const int64_t shape[4] = {kBatch, 1, 32, 32};
  mpigrad_array input = mpigrad_host_array(u.data(), 4, shape, MPIGRAD_F32, MPIGRAD_ORDER_C);
  mpigrad_array label = mpigrad_host_array(du.data(), 4, shape, MPIGRAD_F32, MPIGRAD_ORDER_C);
  // C++ API: the same data as tensors.
  mpigrad::launch::EmbeddedModel model(config, core::kCPU);
  core::Tensor x = core::Tensor::from_vector<float>(u, {kBatch, 1, 32, 32});
  core::Tensor y = core::Tensor::from_vector<float>(du, {kBatch, 1, 32, 32});

  Comparison best;
  for (int r = 0; r <= repeats; ++r) {  // round 0 warms both up
    auto start = Clock::now();
    for (int s = 0; s < steps; ++s) {
      if (mpigrad_train_step(handle, &input, &label, nullptr) != MPIGRAD_SUCCESS) std::exit(1);
    }
    const double c_api = seconds_since(start) / steps;
    start = Clock::now();
    for (int s = 0; s < steps; ++s) model.train_step(x, y);
    const double cpp = seconds_since(start) / steps;
    if (r > 0) {
      best.c_api = std::min(best.c_api, c_api);
      best.cpp = std::min(best.cpp, cpp);
    }
  }
  mpigrad_model_destroy(&handle);
  return best;
}

struct GraphComparison {
  double eager = 1e30, graph = 1e30;  // seconds per step, best block
  std::string status;
};

GraphComparison compare_graphs(int steps, int repeats) {
  const std::string config =
      "[model]\nname = mlp\ninput_shape = 1024\nhidden = 256,256\noutputs = 1024\n"
      "[loss]\nname = mse\n[optim]\nname = adam\nlr = 0.0003\n[train]\nseed = 1\n"
      "cuda_graphs = ";
  const core::Device gpu = core::cuda(0);
  mpigrad::launch::EmbeddedModel eager(config + "false\n", gpu);
  mpigrad::launch::EmbeddedModel graphed(config + "true\n", gpu);
  // Device arrays that keep their addresses, as a GPU host's fields do.
  core::Tensor x = core::full({16, 1024}, 0.5, core::TensorOptions().device(gpu));
  core::Tensor y = core::full({16, 1024}, 0.25, core::TensorOptions().device(gpu));
  GraphComparison best;
  for (int r = 0; r <= repeats; ++r) {  // round 0 warms both up (and captures the graph)
    auto start = Clock::now();
    for (int s = 0; s < steps; ++s) eager.train_step(x, y);
    (void)eager.last_loss();  // waits for the device
    const double eager_step = seconds_since(start) / steps;
    start = Clock::now();
    for (int s = 0; s < steps; ++s) graphed.train_step(x, y);
    (void)graphed.last_loss();
    const double graph_step = seconds_since(start) / steps;
    if (r > 0) {
      best.eager = std::min(best.eager, eager_step);
      best.graph = std::min(best.graph, graph_step);
    }
  }
  best.status = graphed.cuda_graph_status();
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, config_dir = MPIGRAD_INSITU_DIR;
  int steps = 50, repeats = 7;
  bool cuda_graphs = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (arg == "--steps" && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else if (arg == "--repeats" && i + 1 < argc) {
      repeats = std::atoi(argv[++i]);
    } else if (arg == "--config-dir" && i + 1 < argc) {
      config_dir = argv[++i];
    } else if (arg == "--cuda-graphs") {
      cuda_graphs = true;
    } else {
      std::printf(
          "usage: %s [--json FILE] [--steps N] [--repeats R] [--config-dir DIR] "
          "[--cuda-graphs]\n",
          argv[0]);
      return arg == "--help" || arg == "-h" ? 0 : 1;
    }
  }
  mpigrad::bench::Results results;
  if (cuda_graphs) {
    if (!core::cuda_is_available()) {
      std::fprintf(stderr, "mpigrad-bench-embed: --cuda-graphs needs a GPU; none is visible\n");
      return 1;
    }
    const GraphComparison c = compare_graphs(steps, repeats);
    results.add_text("model", "mlp 1024-256-256-1024, batch 16, adam, cuda:0, device arrays");
    results.add_text("graph_status", c.status);
    results.add("eager_step_ms", c.eager * 1e3, "ms", "EmbeddedModel::train_step");
    results.add("graph_step_ms", c.graph * 1e3, "ms", "the same, cuda_graphs = true");
    results.add("eager_over_graph", c.eager / c.graph, "ratio", "> 1: the graph is faster");
  } else {
    results.add_text("batch", "16 samples of 1x32x32, float32, host, C order");
  }
  for (const char* name : {"mlp", "conv"}) {
    if (cuda_graphs) break;
    const Comparison c = compare(config_dir + "/" + name + ".ini", steps, repeats);
    const std::string prefix = std::string(name) + "_";
    results.add(prefix + "c_api_step_ms", c.c_api * 1e3, "ms", "mpigrad_train_step");
    results.add(prefix + "cpp_step_ms", c.cpp * 1e3, "ms", "EmbeddedModel::train_step");
    results.add(prefix + "c_api_over_cpp", c.c_api / c.cpp, "ratio", "target <= 1.02");
    results.add(prefix + "samples_per_s", 16.0 / c.c_api, "1/s", "through the C API");
  }
  return results.report(json_path, "mpigrad-bench-embed");
}
