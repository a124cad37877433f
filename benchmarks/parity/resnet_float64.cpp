// mpigrad's ResNet in float64, for resnet_parity.py --float64: the float32 comparison of 10 steps
// can only agree to ~1e-3 (one ReLU input within rounding of 0 flips and the network magnifies
// it), so the tight check is mpigrad float64 against torch float64.
//
//   mpigrad-parity-resnet-float64 --checkpoint ckpt-step0.h5 --data train.h5 --width 8
//       [--depth 18 --classes 10 --steps 10 --batch 32 --lr 0.05 --momentum 0.9]
//
// Loads the initial weights that `mpigrad train` wrote, converts the model to float64, and takes
// the training program's steps on the same batches (x uint8 scaled by 1/255 as the program does,
// no shuffle): SGD on the mean cross-entropy, BatchNorm in training mode. Prints one loss per
// line with 15 significant digits.
#include <cstdio>
#include <string>

#include "mpigrad/core/error.h"
#include "mpigrad/core/hdf5.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/nn/checkpoint.h"
#include "mpigrad/nn/loss.h"
#include "mpigrad/nn/models.h"
#include "mpigrad/nn/optim/sgd.h"

using namespace mpigrad;  // NOLINT
using core::Tensor;

int main(int argc, char** argv) {
  std::string checkpoint, data;
  int64_t width = 8, depth = 18, classes = 10, steps = 10, batch = 32;
  double lr = 0.05, momentum = 0.9;
  try {
    for (int i = 1; i < argc; i += 2) {
      const std::string flag = argv[i];
      MPIGRAD_CHECK(i + 1 < argc, flag, " needs a value");
      const std::string value = argv[i + 1];
      if (flag == "--checkpoint")
        checkpoint = value;
      else if (flag == "--data")
        data = value;
      else if (flag == "--width")
        width = std::stoll(value);
      else if (flag == "--depth")
        depth = std::stoll(value);
      else if (flag == "--classes")
        classes = std::stoll(value);
      else if (flag == "--steps")
        steps = std::stoll(value);
      else if (flag == "--batch")
        batch = std::stoll(value);
      else if (flag == "--lr")
        lr = std::stod(value);
      else if (flag == "--momentum")
        momentum = std::stod(value);
      else
        core::fail("unknown option ", flag);
    }
    MPIGRAD_CHECK(!checkpoint.empty() && !data.empty(), "--checkpoint and --data are required");
    const core::hdf5::File file = core::hdf5::File::open(data);
    const Tensor x_all = file.read_tensor("x");
    const Tensor y_all = file.read_tensor("y");
    MPIGRAD_CHECK(x_all.dim() == 4 && x_all.dtype() == core::kUInt8, data,
                  ": expected uint8 images x [N, C, H, W], got ", x_all.shape());
    MPIGRAD_CHECK(x_all.size(0) >= steps * batch, data, " has ", x_all.size(0),
                  " samples, fewer than ", steps, " steps of ", batch);
    core::Generator generator(1);  // the weights come from the checkpoint
    auto model = nn::make_resnet({x_all.size(1), x_all.size(2), x_all.size(3)}, depth, width,
                                 classes, generator);
    nn::load_checkpoint_into(checkpoint, *model, nullptr, nullptr);
    model->to(core::kFloat64);
    model->train();
    nn::SGDOptions options;
    options.lr = lr;
    options.momentum = momentum;
    nn::SGD optimizer(model->parameters(), options);
    const Tensor x = x_all.to(core::kFloat64) / 255.0;  // as torch divides; 1 ulp from x * (1/255)
    for (int64_t step = 0; step < steps; ++step) {
      optimizer.zero_grad();
      Tensor loss = nn::cross_entropy((*model)(x.narrow(0, step * batch, batch)),
                                      y_all.narrow(0, step * batch, batch));
      loss.backward();
      optimizer.step();
      std::printf("%.15g\n", loss.item<double>());
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "mpigrad-parity-resnet-float64: %s\n", error.what());
    return 1;
  }
  return 0;
}
