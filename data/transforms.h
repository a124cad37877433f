// Per-batch transforms for DataLoaderOptions::transform. They run in the loader's worker threads,
// so they are plain loops (no ops, no autograd, no nested thread pools).
#pragma once

#include <string>
#include <vector>

#include "mpigrad/data/data_loader.h"

namespace mpigrad::data {

// Replaces `field` (any numeric dtype, shape [batch, channels, ...] or [batch, features]) with
// float32 (x * scale - mean[c]) / std[c], c being the index along dim 1. One mean/std value
// applies to every channel. Fashion-MNIST: normalize_transform("x", 1.0 / 255, {0.2860}, {0.3530}).
BatchTransform normalize_transform(std::string field, double scale, std::vector<double> mean,
                                   std::vector<double> std);

// Applies the transforms in order.
BatchTransform compose_transforms(std::vector<BatchTransform> transforms);

}  // namespace mpigrad::data
