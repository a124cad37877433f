// Training parity with PyTorch (issue 23): each model of tests/data/onnx, exported by both of
// PyTorch's exporters, is loaded as nn::OnnxModel and trained 20 SGD steps from the file's weights
// on the batches PyTorch trained on; every step's loss must agree with PyTorch's (recorded in
// float64 by benchmarks/onnx/make_parity_data.py) within 1e-4 relative. CI has no torch: the
// models, batches and losses are committed.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "mpigrad/core/hdf5.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/nn/loss.h"
#include "mpigrad/nn/onnx/onnx_model.h"
#include "mpigrad/nn/optim/sgd.h"

using namespace mpigrad;
using core::Tensor;

namespace {

const std::string kDataDir = MPIGRAD_SOURCE_DIR "/tests/data/onnx/";

struct Reference {
  Tensor x, y;
  std::vector<double> losses;
  std::string loss;
  double lr = 0, momentum = 0;
  int64_t batch_size = 0, steps = 0;
};

Reference read_reference(const std::string& model) {
  const core::hdf5::File file = core::hdf5::File::open(kDataDir + model + ".h5");
  Reference reference;
  reference.x = file.read_tensor("x");
  reference.y = file.read_tensor("y");
  reference.losses = file.read_tensor("losses").to(core::kFloat64).to_vector<double>();
  reference.loss = file.read_string_attribute("/", "loss");
  reference.lr = file.read_double_attribute("/", "lr");
  reference.momentum = file.read_double_attribute("/", "momentum");
  reference.batch_size = file.read_int_attribute("/", "batch_size");
  reference.steps = file.read_int_attribute("/", "steps");
  return reference;
}

// The per-step losses of mpigrad training the file's graph as PyTorch trained the module.
std::vector<double> train(const std::string& path, const Reference& reference) {
  std::shared_ptr<nn::OnnxModel> model = nn::OnnxModel::load(path);
  model->train();
  nn::SGD optimizer(model->parameters(),
                    nn::SGDOptions{.lr = reference.lr, .momentum = reference.momentum});
  std::vector<double> losses;
  for (int64_t step = 0; step < reference.steps; ++step) {
    const int64_t first = step * reference.batch_size;
    Tensor x = reference.x.narrow(0, first, reference.batch_size);
    // Targets in the model's dtype: float32 for a regression, int64 labels as they are.
    Tensor y = reference.y.narrow(0, first, reference.batch_size);
    Tensor output = model->forward(x);
    Tensor loss = reference.loss == "mse" ? nn::mse_loss(output, y.to(output.dtype()))
                                          : nn::cross_entropy(output, y);
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

// The largest relative difference of mpigrad's losses from PyTorch's, each step checked.
double check_parity(const std::string& model, const std::string& exporter) {
  const Reference reference = read_reference(model);
  REQUIRE(reference.losses.size() == size_t(reference.steps));
  const std::vector<double> losses = train(kDataDir + model + "." + exporter + ".onnx", reference);
  double worst = 0;
  for (size_t step = 0; step < losses.size(); ++step) {
    const double relative =
        std::abs(losses[step] - reference.losses[step]) / std::abs(reference.losses[step]);
    CAPTURE(step);
    CAPTURE(losses[step]);
    CAPTURE(reference.losses[step]);
    CHECK(relative <= 1e-4);
    worst = std::max(worst, relative);
  }
  MESSAGE(model, " (", exporter, "): 20 steps, loss ", reference.losses.front(), " -> ",
          reference.losses.back(), ", largest relative difference from PyTorch ", worst);
  return worst;
}

}  // namespace

TEST_CASE("ONNX parity with PyTorch: per-step SGD losses within 1e-4 relative") {
  for (const std::string model : {"mlp", "cnn_bn", "unet", "transformer"}) {
    for (const std::string exporter : {"legacy", "dynamo"}) {
      CAPTURE(model);
      CAPTURE(exporter);
      check_parity(model, exporter);
    }
  }
}

TEST_CASE("ONNX parity data: both exporters hold the same weights under PyTorch's names") {
  for (const std::string model : {"mlp", "cnn_bn", "unet", "transformer"}) {
    CAPTURE(model);
    auto legacy = nn::OnnxModel::load(kDataDir + model + ".legacy.onnx");
    auto dynamo = nn::OnnxModel::load(kDataDir + model + ".dynamo.onnx");
    const auto legacy_state = legacy->state_dict();
    const auto dynamo_state = dynamo->state_dict();
    for (const auto& [name, tensor] : legacy_state.tensors()) {
      CAPTURE(name);
      const Tensor* other = dynamo_state.find(name);
      REQUIRE(other != nullptr);
      CHECK(other->shape() == tensor.shape());
    }
  }
}
