// The mpigrad side of the PyTorch parity check (parity.py in this folder).
//
//   mpigrad-parity-driver --model mlp|cnn --steps N --batch B --out DIR
//
// Builds the model with a fixed seed, writes its initial weights as a checkpoint
// (DIR/<model>_init.h5, PyTorch names and layouts), writes N random batches (DIR/<model>_data.h5:
// /x float32 [N, B, 1, 28, 28], /y int64 [N, B]), trains N steps of SGD (lr 0.05, momentum 0.9,
// weight decay 1e-4) on them and writes the per-step losses and the time per step
// (DIR/<model>_losses.h5: /loss float64 [N], attribute seconds_per_step).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mpigrad/core/hdf5.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/join.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/nn/checkpoint.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/batch_norm.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/layers/conv.h"
#include "mpigrad/nn/layers/linear.h"
#include "mpigrad/nn/layers/pooling.h"
#include "mpigrad/nn/loss.h"
#include "mpigrad/nn/optim/sgd.h"

using namespace mpigrad;  // NOLINT
using core::Tensor;

namespace {

std::shared_ptr<nn::Sequential> build(const std::string& kind, core::Generator& g) {
  using M = std::shared_ptr<nn::Module>;
  if (kind == "mlp") {
    return std::make_shared<nn::Sequential>(std::initializer_list<M>{
        std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(784, 256, g),
        std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(256, 128, g),
        std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(128, 10, g)});
  }
  return std::make_shared<nn::Sequential>(std::initializer_list<M>{
      std::make_shared<nn::Conv2d>(1, 16, 3, g, 1, 1), std::make_shared<nn::BatchNorm2d>(16),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2),
      std::make_shared<nn::Conv2d>(16, 32, 3, g, 1, 1), std::make_shared<nn::BatchNorm2d>(32),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2),
      std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(32 * 7 * 7, 10, g)});
}

}  // namespace

int main(int argc, char** argv) {
  std::string kind = "mlp", out = ".";
  int64_t steps = 20, batch = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--model")
      kind = argv[i + 1];
    else if (flag == "--steps")
      steps = std::stoll(argv[i + 1]);
    else if (flag == "--batch")
      batch = std::stoll(argv[i + 1]);
    else if (flag == "--out")
      out = argv[i + 1];
    else {
      std::fprintf(stderr, "mpigrad-parity-driver: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (kind != "mlp" && kind != "cnn") {
    std::fprintf(stderr, "mpigrad-parity-driver: --model must be mlp or cnn\n");
    return 2;
  }
  try {
    core::Generator init(1234), data(99);
    auto model = build(kind, init);
    nn::save_checkpoint(out + "/" + kind + "_init.h5", *model, nullptr, nullptr, 0, 0);

    std::vector<Tensor> xs, ys;
    for (int64_t s = 0; s < steps; ++s) {
      xs.push_back(core::randn({batch, 1, 28, 28}, data));
      Tensor u = core::rand({batch}, data, core::kFloat64) * 10.0;
      std::vector<int64_t> labels;
      for (double v : u.to_vector<double>()) labels.push_back(std::min<int64_t>(int64_t(v), 9));
      ys.push_back(Tensor::from_vector(labels, {batch}));
    }
    {
      core::hdf5::AtomicFileWriter writer(out + "/" + kind + "_data.h5");
      writer.file().write_tensor("/x", core::stack(xs));
      writer.file().write_tensor("/y", core::stack(ys));
      writer.commit();
    }

    nn::SGDOptions o;
    o.lr = 0.05;
    o.momentum = 0.9;
    o.weight_decay = 1e-4;
    nn::SGD sgd(model->parameters(), o);
    std::vector<double> losses;
    const auto start = std::chrono::steady_clock::now();
    for (int64_t s = 0; s < steps; ++s) {
      sgd.zero_grad();
      Tensor loss = nn::cross_entropy((*model)(xs[size_t(s)]), ys[size_t(s)]);
      loss.backward();
      sgd.step();
      losses.push_back(loss.item<double>());
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
        double(steps);
    core::hdf5::AtomicFileWriter writer(out + "/" + kind + "_losses.h5");
    writer.file().write_tensor("/loss", Tensor::from_vector(losses, {steps}));
    writer.file().write_attribute("/", "seconds_per_step", seconds);
    writer.commit();
    std::printf("%s: %lld steps, first loss %.6f, last loss %.6f, %.3f ms/step\n", kind.c_str(),
                static_cast<long long>(steps), losses.front(), losses.back(), seconds * 1e3);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpigrad-parity-driver: %s\n", e.what());
    return 1;
  }
  return 0;
}
