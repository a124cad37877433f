// The Fashion-MNIST CNN loaded from ONNX against the same CNN built in (issue 23): training
// samples/s of each, side by side in one run, and their ratio (target >= 0.95), plus what the
// graph walk costs per node. The ONNX file is benchmarks/onnx/make_parity_data.py's fashion_cnn
// (`mpigrad train`'s cnn with channels = 16,32 and hidden = 32, exported by PyTorch's legacy
// exporter); the built-in model is nn::make_cnn with the same layers. Both train with SGD on
// the same random batches of [B, 1, 28, 28] images, in turns (A B A B ...), and each figure is
// the best of its rounds, so drift of the machine's speed reaches both alike.
//
//   mpigrad-bench-onnx [--model FILE.onnx] [--batch 64] [--steps 10] [--rounds 5] [--json F]
//
// The per-node overhead is (forward time of the graph - forward time of the built-in model) /
// the graph's nodes, at batch 1, where the arithmetic is smallest beside the bookkeeping.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../common/bench_util.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/nn/loss.h"
#include "mpigrad/nn/models.h"
#include "mpigrad/nn/onnx/onnx_file.h"
#include "mpigrad/nn/onnx/onnx_model.h"
#include "mpigrad/nn/optim/sgd.h"

using namespace mpigrad;
using core::Tensor;

namespace {

struct Options {
  std::string model = MPIGRAD_SOURCE_DIR "/tests/data/onnx/fashion_cnn.legacy.onnx";
  int64_t batch = 64;
  int steps = 10;
  int rounds = 5;
  std::string json;
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--model") {
      options.model = value();
    } else if (arg == "--batch") {
      options.batch = std::atoll(value().c_str());
    } else if (arg == "--steps") {
      options.steps = std::atoi(value().c_str());
    } else if (arg == "--rounds") {
      options.rounds = std::atoi(value().c_str());
    } else if (arg == "--json") {
      options.json = value();
    } else {
      std::fprintf(stderr,
                   "usage: mpigrad-bench-onnx [--model F.onnx] [--batch B] [--steps S] "
                   "[--rounds R] [--json FILE]\n");
      std::exit(arg == "--help" || arg == "-h" ? 0 : 2);
    }
  }
  return options;
}

// One training step: forward, cross-entropy, backward, SGD.
void train_step(nn::Module& model, nn::SGD& optimizer, const Tensor& x, const Tensor& y) {
  Tensor loss = nn::cross_entropy(model(x), y);
  optimizer.zero_grad();
  loss.backward();
  optimizer.step();
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  std::shared_ptr<nn::OnnxModel> graph = nn::OnnxModel::load(options.model);
  const int nodes = nn::read_onnx_model(options.model).graph().node_size();
  core::Generator generator(0);
  std::shared_ptr<nn::Module> builtin =
      nn::make_cnn(core::Shape{1, 28, 28}, {16, 32}, {32}, 10, 0.0, generator);
  // The same weights in both, so both do the same arithmetic on the same numbers.
  (void)builtin->load_state_dict(graph->state_dict(), /*strict=*/false);

  core::Generator data(1);
  const Tensor x = core::randn({options.batch, 1, 28, 28}, data);
  std::vector<int64_t> labels(size_t(options.batch));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int64_t(i % 10);
  const Tensor y = Tensor::from_vector(labels, {options.batch});
  const Tensor x1 = x.narrow(0, 0, 1).contiguous();

  nn::SGD graph_sgd(graph->parameters(), nn::SGDOptions{.lr = 0.01, .momentum = 0.9});
  nn::SGD builtin_sgd(builtin->parameters(), nn::SGDOptions{.lr = 0.01, .momentum = 0.9});
  double graph_step = 1e30, builtin_step = 1e30, graph_forward = 1e30, builtin_forward = 1e30;
  for (int round = 0; round < options.rounds; ++round) {
    graph_step = std::min(
        graph_step,
        bench::seconds_per_call([&] { train_step(*graph, graph_sgd, x, y); }, options.steps, 1));
    builtin_step = std::min(
        builtin_step, bench::seconds_per_call([&] { train_step(*builtin, builtin_sgd, x, y); },
                                              options.steps, 1));
    core::NoGradGuard no_grad;
    graph_forward =
        std::min(graph_forward, bench::seconds_per_call([&] { (void)(*graph)(x1); }, 200, 1));
    builtin_forward =
        std::min(builtin_forward, bench::seconds_per_call([&] { (void)(*builtin)(x1); }, 200, 1));
  }
  const double batch = double(options.batch);
  bench::Results results;
  results.add_text("model", options.model);
  results.add_text("graph", std::to_string(nodes) + " nodes");
  results.add("onnx_samples_per_s", batch / graph_step, "samples/s", "ONNX graph, SGD step");
  results.add("builtin_samples_per_s", batch / builtin_step, "samples/s", "built-in cnn");
  results.add("ratio", builtin_step / graph_step, "x", "ONNX / built-in (target >= 0.95)");
  results.add("forward_batch1_onnx_us", graph_forward * 1e6, "us", "");
  results.add("forward_batch1_builtin_us", builtin_forward * 1e6, "us", "");
  results.add("overhead_per_node_us", (graph_forward - builtin_forward) / nodes * 1e6, "us",
              "(ONNX - built-in) forward at batch 1 / nodes");
  // An upper bound that noise cannot hide: the whole forward of a graph of many small nodes
  // (the parity transformer: 98 nodes, most of them shape arithmetic and [1, 6, 16] tensors)
  // divided by its nodes, the arithmetic included.
  const std::string many_nodes = MPIGRAD_SOURCE_DIR "/tests/data/onnx/transformer.legacy.onnx";
  std::shared_ptr<nn::OnnxModel> small = nn::OnnxModel::load(many_nodes);
  const int small_nodes = nn::read_onnx_model(many_nodes).graph().node_size();
  const Tensor tokens = core::zeros({1, 6}, core::kInt64);
  double small_forward = 1e30;
  for (int round = 0; round < options.rounds; ++round) {
    core::NoGradGuard no_grad;
    small_forward =
        std::min(small_forward, bench::seconds_per_call([&] { (void)(*small)(tokens); }, 200, 1));
  }
  results.add("transformer_forward_us", small_forward * 1e6, "us",
              std::to_string(small_nodes) + " nodes, batch 1, no grad");
  results.add("per_node_upper_bound_us", small_forward / small_nodes * 1e6, "us",
              "its forward / nodes (arithmetic included)");
  return results.report(options.json, "mpigrad-bench-onnx");
}
