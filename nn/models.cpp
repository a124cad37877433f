#include "mpigrad/nn/models.h"

#include "mpigrad/core/error.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/batch_norm.h"
#include "mpigrad/nn/layers/conv.h"
#include "mpigrad/nn/layers/dropout.h"
#include "mpigrad/nn/layers/linear.h"
#include "mpigrad/nn/layers/pooling.h"

namespace mpigrad::nn {

namespace {

// Dropout draws from its own stream, seeded from the model generator so it is reproducible.
void add_classifier_head(std::vector<std::shared_ptr<Module>>& layers, int64_t features,
                         const std::vector<int64_t>& hidden, int64_t num_classes, double dropout,
                         core::Generator& generator) {
  for (int64_t width : hidden) {
    layers.push_back(std::make_shared<Linear>(features, width, generator));
    layers.push_back(std::make_shared<ReLU>());
    if (dropout > 0) {
      layers.push_back(std::make_shared<Dropout>(dropout, nullptr, generator.seed() + 1));
    }
    features = width;
  }
  layers.push_back(std::make_shared<Linear>(features, num_classes, generator));
}

}  // namespace

std::shared_ptr<Sequential> make_mlp(const core::Shape& input_shape,
                                     const std::vector<int64_t>& hidden, int64_t num_classes,
                                     double dropout, core::Generator& generator) {
  MPIGRAD_CHECK(num_classes >= 2, "make_mlp: num_classes must be at least 2");
  std::vector<std::shared_ptr<Module>> layers;
  layers.push_back(std::make_shared<Flatten>());
  add_classifier_head(layers, input_shape.numel(), hidden, num_classes, dropout, generator);
  return std::make_shared<Sequential>(layers);
}

std::shared_ptr<Sequential> make_cnn(const core::Shape& input_shape,
                                     const std::vector<int64_t>& channels,
                                     const std::vector<int64_t>& hidden, int64_t num_classes,
                                     double dropout, core::Generator& generator) {
  MPIGRAD_CHECK(input_shape.size() == 3, "make_cnn: expected samples of shape [channels, height, "
                "width], got ", input_shape);
  int64_t in_channels = input_shape[0], height = input_shape[1], width = input_shape[2];
  std::vector<std::shared_ptr<Module>> layers;
  for (int64_t out_channels : channels) {
    MPIGRAD_CHECK(height >= 2 && width >= 2, "make_cnn: ", channels.size(),
                  " conv blocks halve ", input_shape, " below 1 pixel; use fewer channels entries");
    layers.push_back(std::make_shared<Conv2d>(in_channels, out_channels, 3, generator, 1, 1));
    layers.push_back(std::make_shared<BatchNorm2d>(out_channels));
    layers.push_back(std::make_shared<ReLU>());
    layers.push_back(std::make_shared<MaxPool2d>(2));
    in_channels = out_channels;
    height /= 2;
    width /= 2;
  }
  layers.push_back(std::make_shared<Flatten>());
  add_classifier_head(layers, in_channels * height * width, hidden, num_classes, dropout,
                      generator);
  return std::make_shared<Sequential>(layers);
}

}  // namespace mpigrad::nn
