// ResNet-18 and -34 (basic blocks, stages of [2,2,2,2] and [3,4,6,3] blocks) with a base width
// w: stages of w, 2w, 4w, 8w channels and strides 1, 2, 2, 2, then a global average pool, a
// flatten and an fc layer to the outputs. Parameter and buffer names are torchvision's
// (conv1.weight, bn1.running_mean, layer1.0.conv1.weight, layer2.0.downsample.0.weight, fc.bias),
// so torchvision.models.resnet18 (with conv1/maxpool replaced to match the stem) loads a
// checkpoint by name.
//
// The stem depends on the image size, because the ImageNet stem (7x7 conv stride 2, then a 3x3
// max-pool stride 2) shrinks a 32-pixel image to 8 pixels before the first block:
//   small    height and width below 64 (CIFAR's 32, MNIST's 28): conv1 is 3x3 stride 1 padding
//            1 and there is no max-pool, as in the CIFAR ResNets;
//   imagenet height or width of 64 or more: conv1 7x7 stride 2 padding 3, then
//            maxpool 3x3 stride 2 padding 1, as torchvision.
// outputs = 0 builds the encoder alone: no fc, the output is [N, 8w] features (what a
// contrastive projection head or a linear probe sits on).
#pragma once

#include <cstdint>
#include <vector>

#include "mpigrad/core/rng.h"
#include "mpigrad/core/shape.h"
#include "mpigrad/nn/module.h"

namespace mpigrad::nn {

struct ResNetConfig {
  int64_t depth = 18;    // 18 or 34
  int64_t width = 64;    // channels of the first stage
  int64_t outputs = 10;  // 0: encoder only
};

// Blocks per stage: {2,2,2,2} for 18, {3,4,6,3} for 34; core::Error for another depth.
std::vector<int64_t> resnet_stages(int64_t depth);

class ResNet : public Module {
 public:
  // input_shape is one sample's [channels, height, width].
  ResNet(const core::Shape& input_shape, const ResNetConfig& config, core::Generator& generator);
  // [N, C, H, W] -> [N, outputs], or [N, 8w] features without fc.
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "ResNet"; }
  std::string extra_repr() const override;
  int64_t feature_count() const { return 8 * config_.width; }
  bool small_stem() const { return small_stem_; }

 private:
  ResNetConfig config_;
  bool small_stem_ = true;
};

}  // namespace mpigrad::nn
