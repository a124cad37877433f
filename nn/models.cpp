#include "mpigrad/nn/models.h"

#include "mpigrad/core/checked_math.h"
#include "mpigrad/core/error.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/batch_norm.h"
#include "mpigrad/nn/layers/conv.h"
#include "mpigrad/nn/layers/dropout.h"
#include "mpigrad/nn/layers/linear.h"
#include "mpigrad/nn/layers/pooling.h"

namespace mpigrad::nn {

namespace {

// [Linear, ReLU, Dropout] per hidden width; returns the width of the last. Dropout draws from
// its own stream, seeded from the model generator so it is reproducible.
int64_t add_hidden_layers(std::vector<std::shared_ptr<Module>>& layers, int64_t features,
                          const std::vector<int64_t>& hidden, double dropout,
                          core::Generator& generator) {
  for (int64_t width : hidden) {
    layers.push_back(std::make_shared<Linear>(features, width, generator));
    layers.push_back(std::make_shared<ReLU>());
    if (dropout > 0) {
      layers.push_back(std::make_shared<Dropout>(dropout, nullptr, generator.seed() + 1));
    }
    features = width;
  }
  return features;
}

int64_t mlp_layers(std::vector<std::shared_ptr<Module>>& layers, const core::Shape& input_shape,
                   const std::vector<int64_t>& hidden, double dropout, core::Generator& generator) {
  layers.push_back(std::make_shared<Flatten>());
  return add_hidden_layers(layers, input_shape.numel(), hidden, dropout, generator);
}

// A conv whose output keeps the input's height and width (odd kernel, stride 1).
std::shared_ptr<Conv2d> same_size_conv(int64_t in_channels, int64_t out_channels, int64_t kernel,
                                       PaddingMode padding_mode, core::Generator& generator) {
  Conv2dConfig config;
  config.in_channels = in_channels;
  config.out_channels = out_channels;
  config.kernel_size = {kernel, kernel};
  config.padding = {kernel / 2, kernel / 2};
  config.padding_mode = padding_mode;
  return std::make_shared<Conv2d>(config, generator);
}

}  // namespace

std::shared_ptr<Sequential> make_mlp(const core::Shape& input_shape,
                                     const std::vector<int64_t>& hidden, int64_t outputs,
                                     double dropout, core::Generator& generator) {
  MPIGRAD_CHECK(outputs >= 1, "make_mlp: outputs must be at least 1, got ", outputs);
  std::vector<std::shared_ptr<Module>> layers;
  int64_t features = mlp_layers(layers, input_shape, hidden, dropout, generator);
  layers.push_back(std::make_shared<Linear>(features, outputs, generator));
  return std::make_shared<Sequential>(layers);
}

Encoder make_mlp_encoder(const core::Shape& input_shape, const std::vector<int64_t>& hidden,
                         double dropout, core::Generator& generator) {
  std::vector<std::shared_ptr<Module>> layers;
  int64_t features = mlp_layers(layers, input_shape, hidden, dropout, generator);
  return {std::make_shared<Sequential>(layers), features};
}

namespace {
int64_t cnn_layers(std::vector<std::shared_ptr<Module>>& layers, const core::Shape& input_shape,
                   const std::vector<int64_t>& channels, const std::vector<int64_t>& hidden,
                   double dropout, core::Generator& generator, PaddingMode padding_mode) {
  MPIGRAD_CHECK(input_shape.size() == 3,
                "make_cnn: expected samples of shape [channels, height, "
                "width], got ",
                input_shape);
  int64_t in_channels = input_shape[0], height = input_shape[1], width = input_shape[2];
  for (int64_t out_channels : channels) {
    MPIGRAD_CHECK(height >= 2 && width >= 2, "make_cnn: ", channels.size(), " conv blocks halve ",
                  input_shape, " below 1 pixel; use fewer channels entries");
    layers.push_back(same_size_conv(in_channels, out_channels, 3, padding_mode, generator));
    layers.push_back(std::make_shared<BatchNorm2d>(out_channels));
    layers.push_back(std::make_shared<ReLU>());
    layers.push_back(std::make_shared<MaxPool2d>(2));
    in_channels = out_channels;
    height /= 2;
    width /= 2;
  }
  layers.push_back(std::make_shared<Flatten>());
  const int64_t features = core::checked_mul(
      core::checked_mul(in_channels, height, "make_cnn: features"), width, "make_cnn: features");
  return add_hidden_layers(layers, features, hidden, dropout, generator);
}
}  // namespace

std::shared_ptr<Sequential> make_cnn(const core::Shape& input_shape,
                                     const std::vector<int64_t>& channels,
                                     const std::vector<int64_t>& hidden, int64_t outputs,
                                     double dropout, core::Generator& generator,
                                     PaddingMode padding_mode) {
  MPIGRAD_CHECK(outputs >= 1, "make_cnn: outputs must be at least 1, got ", outputs);
  std::vector<std::shared_ptr<Module>> layers;
  int64_t features =
      cnn_layers(layers, input_shape, channels, hidden, dropout, generator, padding_mode);
  layers.push_back(std::make_shared<Linear>(features, outputs, generator));
  return std::make_shared<Sequential>(layers);
}

Encoder make_cnn_encoder(const core::Shape& input_shape, const std::vector<int64_t>& channels,
                         const std::vector<int64_t>& hidden, double dropout,
                         core::Generator& generator, PaddingMode padding_mode) {
  std::vector<std::shared_ptr<Module>> layers;
  int64_t features =
      cnn_layers(layers, input_shape, channels, hidden, dropout, generator, padding_mode);
  return {std::make_shared<Sequential>(layers), features};
}

std::shared_ptr<Sequential> make_conv_net(const core::Shape& input_shape,
                                          const std::vector<int64_t>& channels, int64_t outputs,
                                          int64_t kernel_size, PaddingMode padding_mode,
                                          core::Generator& generator) {
  MPIGRAD_CHECK(input_shape.size() == 3,
                "make_conv_net: expected samples of shape [channels, "
                "height, width], got ",
                input_shape);
  MPIGRAD_CHECK(outputs >= 1, "make_conv_net: outputs must be at least 1, got ", outputs);
  MPIGRAD_CHECK(kernel_size >= 1 && kernel_size % 2 == 1,
                "make_conv_net: kernel_size must be "
                "odd (the output keeps the input's size), got ",
                kernel_size);
  std::vector<std::shared_ptr<Module>> layers;
  int64_t in_channels = input_shape[0];
  for (int64_t width : channels) {
    layers.push_back(same_size_conv(in_channels, width, kernel_size, padding_mode, generator));
    layers.push_back(std::make_shared<ReLU>());
    in_channels = width;
  }
  layers.push_back(same_size_conv(in_channels, outputs, kernel_size, padding_mode, generator));
  return std::make_shared<Sequential>(layers);
}

std::shared_ptr<ResNet> make_resnet(const core::Shape& input_shape, int64_t depth, int64_t width,
                                    int64_t outputs, core::Generator& generator) {
  return std::make_shared<ResNet>(
      input_shape, ResNetConfig{.depth = depth, .width = width, .outputs = outputs}, generator);
}

}  // namespace mpigrad::nn
