#include "mpigrad/launch/train_setup.h"

#include "mpigrad/core/error.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/nn/models.h"
#include "mpigrad/nn/optim/adam.h"
#include "mpigrad/nn/optim/sgd.h"

namespace mpigrad::launch {

std::shared_ptr<nn::Module> make_model(const ModelSection& model, const core::Shape& input_shape,
                                       int64_t outputs, uint64_t seed) {
  core::Generator generator(seed);
  MPIGRAD_CHECK(input_shape.numel() >= 1, "[model] input_shape: empty input ", input_shape);
  MPIGRAD_CHECK(outputs >= 1, "[model] outputs: must be at least 1, got ", outputs);
  const bool images = input_shape.size() == 3;
  try {
    switch (model.name) {
      case ModelKind::Mlp:
        return nn::make_mlp(input_shape, model.hidden, outputs, model.dropout, generator);
      case ModelKind::Cnn:
        MPIGRAD_CHECK(images, "[model] name = cnn needs samples of shape [channels, height, "
                      "width], got ", input_shape);
        return nn::make_cnn(input_shape, model.channels, model.hidden, outputs, model.dropout,
                            generator, model.padding_mode);
      case ModelKind::Conv:
        MPIGRAD_CHECK(images, "[model] name = conv needs samples of shape [channels, height, "
                      "width], got ", input_shape);
        return nn::make_conv_net(input_shape, model.channels, outputs, model.kernel_size,
                                 model.padding_mode, generator);
      case ModelKind::ResNet:
        MPIGRAD_CHECK(images, "[model] name = resnet needs samples of shape [channels, height, "
                      "width], got ", input_shape);
        MPIGRAD_CHECK(model.depth == 18 || model.depth == 34, "[model] depth: resnet has depth "
                      "18 or 34 (basic blocks), got ", model.depth);
        return nn::make_resnet(input_shape, model.depth, model.width, outputs, generator);
    }
  } catch (const core::Error& error) {
    core::fail("[model]: ", error.what());
  }
  core::fail("[model] name: unhandled model kind");
}

std::unique_ptr<nn::Optimizer> make_optimizer(const OptimSection& optim, nn::Module& model) {
  switch (optim.name) {
    case OptimizerKind::Sgd:
      return std::make_unique<nn::SGD>(
          model.parameters(),
          nn::SGDOptions{.lr = optim.lr, .momentum = optim.momentum,
                         .weight_decay = optim.weight_decay});
    case OptimizerKind::Adam:
    case OptimizerKind::AdamW: {
      nn::AdamOptions options;
      options.lr = optim.lr;
      options.weight_decay = optim.weight_decay;
      if (optim.name == OptimizerKind::Adam) {
        return std::make_unique<nn::Adam>(model.parameters(), options);
      }
      return std::make_unique<nn::AdamW>(model.parameters(), options);
    }
  }
  core::fail("[optim] name: unhandled optimizer kind");
}

namespace {
int64_t cosine_length(const SchedSection& sched, int64_t run_steps) {
  return sched.total_steps > 0 ? sched.total_steps : run_steps;
}
}  // namespace

void check_schedule(const SchedSection& sched, int64_t run_steps) {
  if (sched.name == SchedulerKind::Cosine) {
    const int64_t total = cosine_length(sched, run_steps);
    MPIGRAD_CHECK(total > 0, "[sched] total_steps: cosine needs its length in steps (set "
                  "[sched] total_steps)");
    MPIGRAD_CHECK(sched.warmup_steps < total, "[sched] warmup_steps: ", sched.warmup_steps,
                  " must be below the cosine's ", total, " steps");
  }
  if (sched.name == SchedulerKind::MultiStep) {
    MPIGRAD_CHECK(!sched.milestones.empty(), "[sched] milestones: multistep needs at least one");
  }
}

std::unique_ptr<nn::LRScheduler> make_scheduler(const SchedSection& sched,
                                                nn::Optimizer& optimizer, int64_t run_steps) {
  check_schedule(sched, run_steps);
  switch (sched.name) {
    case SchedulerKind::None:
      return nullptr;
    case SchedulerKind::Cosine:
      return std::make_unique<nn::WarmupCosineLR>(optimizer, sched.warmup_steps,
                                                  cosine_length(sched, run_steps));
    case SchedulerKind::Step:
      return std::make_unique<nn::StepLR>(optimizer, sched.step_size, sched.gamma);
    case SchedulerKind::MultiStep:
      return std::make_unique<nn::MultiStepLR>(optimizer, sched.milestones, sched.gamma);
  }
  core::fail("[sched] name: unhandled scheduler kind");
}

RegressionLoss make_regression_loss(LossKind loss) {
  switch (loss) {
    case LossKind::Mse:
      return [](const core::Tensor& prediction, const core::Tensor& target, nn::Reduction r) {
        return nn::mse_loss(prediction, target, r);
      };
    case LossKind::L1:
      return [](const core::Tensor& prediction, const core::Tensor& target, nn::Reduction r) {
        return nn::l1_loss(prediction, target, r);
      };
    case LossKind::CrossEntropy:
      break;
  }
  core::fail("[loss] name: ", core::enum_name(loss, kLossKindNames), " is not a regression loss");
}

}  // namespace mpigrad::launch
