// The models `mpigrad train` and the C API offer, built from nn layers with PyTorch's default
// initialization drawn from an explicit generator, so every rank (and torch, through the
// checkpoint) can build the identical model.
//   mlp:  Flatten, then [Linear, ReLU, Dropout] per hidden width, then Linear to the outputs
//         (no hidden width: one Linear layer).
//   cnn:  per conv width [Conv2d 3x3 pad 1, BatchNorm2d, ReLU, MaxPool2d 2], Flatten, then
//         [Linear, ReLU, Dropout] per hidden width, then Linear to the outputs.
//   conv: fully convolutional, for fields on a grid (a stencil): per conv width [Conv2d kxk
//         with same-size padding, ReLU], then a Conv2d kxk to `outputs` channels; the output
//         keeps the input's height and width. Circular padding makes the grid periodic.
//   resnet: ResNet-18 or -34 of nn/resnet.h (basic blocks, torchvision's names, a small 3x3
//         stem without max-pool for images below 64 pixels, the ImageNet stem otherwise).
// Dropout layers are left out when dropout is 0. Names follow nn.Sequential's: "3.weight".
//
// Encoders (two-stage training, nn/encoder_with_head.h) are the same models without their last
// Linear: the mlp's and cnn's layers up to and including the last hidden [Linear, ReLU,
// Dropout], mapping a sample to `features` values. make_mlp and make_cnn are their encoder plus
// that Linear, drawn in the same order, so a classifier's weights do not depend on the split.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "mpigrad/core/rng.h"
#include "mpigrad/core/shape.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/layers/conv.h"
#include "mpigrad/nn/resnet.h"

namespace mpigrad::nn {

// input_shape is one sample's shape, e.g. [1, 28, 28].
std::shared_ptr<Sequential> make_mlp(const core::Shape& input_shape,
                                     const std::vector<int64_t>& hidden, int64_t outputs,
                                     double dropout, core::Generator& generator);

// input_shape is [channels, height, width]; each conv block halves height and width.
std::shared_ptr<Sequential> make_cnn(const core::Shape& input_shape,
                                     const std::vector<int64_t>& channels,
                                     const std::vector<int64_t>& hidden, int64_t outputs,
                                     double dropout, core::Generator& generator,
                                     PaddingMode padding_mode = PaddingMode::Zeros);

// A model without its output layer: [batch, ...] -> [batch, features].
struct Encoder {
  std::shared_ptr<Module> module;  // any trunk: a Sequential, a ResNet without fc
  int64_t features = 0;
};

Encoder make_mlp_encoder(const core::Shape& input_shape, const std::vector<int64_t>& hidden,
                         double dropout, core::Generator& generator);
Encoder make_cnn_encoder(const core::Shape& input_shape, const std::vector<int64_t>& channels,
                         const std::vector<int64_t>& hidden, double dropout,
                         core::Generator& generator, PaddingMode padding_mode = PaddingMode::Zeros);

// input_shape is [channels, height, width]; kernel_size is odd.
std::shared_ptr<Sequential> make_conv_net(const core::Shape& input_shape,
                                          const std::vector<int64_t>& channels, int64_t outputs,
                                          int64_t kernel_size, PaddingMode padding_mode,
                                          core::Generator& generator);

// input_shape is [channels, height, width]; depth 18 or 34; width the first stage's channels.
// outputs = 0 means no fc: the encoder alone, whose output is [N, 8 * width] features.
std::shared_ptr<ResNet> make_resnet(const core::Shape& input_shape, int64_t depth, int64_t width,
                                    int64_t outputs, core::Generator& generator);

}  // namespace mpigrad::nn
