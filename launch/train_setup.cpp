#include "mpigrad/launch/train_setup.h"

#include <unistd.h>

#include "mpigrad/core/checked_math.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/nn/models.h"
#include "mpigrad/nn/optim/adam.h"
#include "mpigrad/nn/optim/sgd.h"

namespace mpigrad::launch {

void check_fits_in_memory(int64_t bytes, const std::string& what, int64_t memory_bytes) {
  if (memory_bytes < 0) {
    const long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page_bytes <= 0) return;  // unknown: nothing to compare with
    memory_bytes = int64_t(pages) * int64_t(page_bytes);
  }
  constexpr double kGiB = double(int64_t(1) << 30);
  MPIGRAD_CHECK(bytes <= memory_bytes / 2, what, ": needs ", bytes, " bytes (",
                double(bytes) / kGiB, " GiB), more than half of this machine's ",
                double(memory_bytes) / kGiB, " GiB of memory");
}

namespace {

// The weights of a `inputs` -> `outputs` layer (kernel x kernel for convolutions, plus the
// bias), checked: the sizes are the config's and the file's, and their product may not fit.
int64_t layer_parameters(int64_t inputs, int64_t outputs, int64_t kernel, const char* key) {
  const int64_t taps = core::checked_mul(kernel, kernel, "[model] kernel_size");
  int64_t weights = core::checked_mul(inputs, outputs, "[model] ", key, ": a layer of ", inputs,
                                      " inputs and ", outputs, " outputs");
  weights = core::checked_mul(weights, taps, "[model] ", key, ": a layer of ", inputs,
                              " inputs and ", outputs, " outputs with ", kernel, "x", kernel,
                              " kernels");
  return core::checked_add(weights, outputs, "[model] ", key, ": a layer of ", inputs,
                           " inputs and ", outputs, " outputs");
}

// What the model's parameters will take, counted before anything is allocated: a width of 2^62
// is an error naming its key, not an overflow inside a layer (or a kernel writing past a wrapped
// size), and a model that cannot fit in memory says so with the key that sized it.
void check_model_size(const ModelSection& model, const core::Shape& input_shape,
                      int64_t outputs) {
  int64_t parameters = 0;
  auto add = [&](int64_t count, const char* key) {
    parameters = core::checked_add(parameters, count, "[model] ", key, ": the parameter count");
    check_fits_in_memory(core::checked_mul(parameters, 4, "[model] ", key, ": the model's bytes"),
                         std::string("[model] ") + key + ": the model's " +
                             std::to_string(parameters) + " float32 parameters");
  };
  auto classifier = [&](int64_t features) {
    for (int64_t width : model.hidden) {
      add(layer_parameters(features, width, 1, "hidden"), "hidden");
      features = width;
    }
    add(layer_parameters(features, outputs, 1, "outputs ([data] num_classes)"), "outputs");
  };
  switch (model.name) {
    case ModelKind::Mlp:
      classifier(input_shape.numel());
      break;
    case ModelKind::Cnn: {
      if (input_shape.size() != 3) return;  // make_model says why
      int64_t channels = input_shape[0], height = input_shape[1], width = input_shape[2];
      for (int64_t out : model.channels) {
        add(layer_parameters(channels, out, 3, "channels"), "channels");
        channels = out;
        height /= 2;
        width /= 2;
      }
      classifier(core::checked_mul(core::checked_mul(channels, height, "[model] channels"),
                                   width, "[model] channels"));
      break;
    }
    case ModelKind::Conv: {
      if (input_shape.size() != 3) return;
      int64_t channels = input_shape[0];
      for (int64_t out : model.channels) {
        add(layer_parameters(channels, out, model.kernel_size, "channels"), "channels");
        channels = out;
      }
      add(layer_parameters(channels, outputs, model.kernel_size, "outputs ([data] num_classes)"),
          "outputs");
      break;
    }
  }
}

}  // namespace

std::shared_ptr<nn::Module> make_model(const ModelSection& model, const core::Shape& input_shape,
                                       int64_t outputs, uint64_t seed) {
  core::Generator generator(seed);
  MPIGRAD_CHECK(input_shape.numel() >= 1, "[model] input_shape: empty input ", input_shape);
  MPIGRAD_CHECK(outputs >= 1, "[model] outputs: must be at least 1, got ", outputs);
  const bool images = input_shape.size() == 3;
  check_model_size(model, input_shape, outputs);
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
