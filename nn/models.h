// defines: make_mlp, make_cnn
//
// The two classifiers `mpigrad train` offers, built from nn layers with PyTorch's default
// initialization drawn from an explicit generator, so every rank (and torch, through the
// checkpoint) can build the identical model.
//   mlp: Flatten, then [Linear, ReLU, Dropout] per hidden width, then Linear to the classes.
//   cnn: per conv width [Conv2d 3x3 pad 1, BatchNorm2d, ReLU, MaxPool2d 2], Flatten, then
//        [Linear, ReLU, Dropout] per hidden width, then Linear to the classes.
// Dropout layers are left out when dropout is 0. Names follow nn.Sequential's: "3.weight".
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "mpigrad/core/rng.h"
#include "mpigrad/core/shape.h"
#include "mpigrad/nn/layers/container.h"

namespace mpigrad::nn {

// input_shape is one sample's shape, e.g. [1, 28, 28].
std::shared_ptr<Sequential> make_mlp(const core::Shape& input_shape,
                                     const std::vector<int64_t>& hidden, int64_t num_classes,
                                     double dropout, core::Generator& generator);

// input_shape is [channels, height, width]; each conv block halves height and width.
std::shared_ptr<Sequential> make_cnn(const core::Shape& input_shape,
                                     const std::vector<int64_t>& channels,
                                     const std::vector<int64_t>& hidden, int64_t num_classes,
                                     double dropout, core::Generator& generator);

}  // namespace mpigrad::nn
