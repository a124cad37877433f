#include "mpigrad/nn/resnet.h"

#include <memory>

#include "mpigrad/core/error.h"
#include "mpigrad/nn/init.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/basic_block.h"
#include "mpigrad/nn/layers/batch_norm.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/layers/conv.h"
#include "mpigrad/nn/layers/linear.h"
#include "mpigrad/nn/layers/pooling.h"

namespace mpigrad::nn {

std::vector<int64_t> resnet_stages(int64_t depth) {
  if (depth == 18) return {2, 2, 2, 2};
  if (depth == 34) return {3, 4, 6, 3};
  core::fail("ResNet: depth must be 18 or 34 (basic blocks), got ", depth);
}

ResNet::ResNet(const core::Shape& input_shape, const ResNetConfig& config,
               core::Generator& generator)
    : config_(config) {
  MPIGRAD_CHECK(input_shape.size() == 3,
                "ResNet: expected samples of shape [channels, height, "
                "width], got ",
                input_shape);
  MPIGRAD_CHECK(config.width >= 1, "ResNet: width must be at least 1, got ", config.width);
  MPIGRAD_CHECK(config.outputs >= 0, "ResNet: outputs must be at least 0, got ", config.outputs);
  const std::vector<int64_t> stages = resnet_stages(config.depth);
  const int64_t channels = input_shape[0];
  small_stem_ = input_shape[1] < 64 && input_shape[2] < 64;
  const int64_t kernel = small_stem_ ? 3 : 7, stride = small_stem_ ? 1 : 2;
  auto conv1 = std::make_shared<Conv2d>(channels, config.width, kernel, generator, stride,
                                        kernel / 2, /*bias=*/false);
  init::kaiming_normal_(conv1->weight(), generator, 0.0, init::FanMode::FanOut,
                        init::Nonlinearity::ReLU);
  register_module("conv1", conv1);
  register_module("bn1", std::make_shared<BatchNorm2d>(config.width));
  register_module("relu", std::make_shared<ReLU>());
  if (!small_stem_) register_module("maxpool", std::make_shared<MaxPool2d>(3, 2, 1));
  int64_t in_channels = config.width;
  for (size_t stage = 0; stage < stages.size(); ++stage) {
    const int64_t out_channels = config.width << stage;
    auto layer = std::make_shared<Sequential>();
    for (int64_t block = 0; block < stages[stage]; ++block) {
      const int64_t block_stride = (stage > 0 && block == 0) ? 2 : 1;
      layer->push_back(
          std::make_shared<BasicBlock>(in_channels, out_channels, block_stride, generator));
      in_channels = out_channels;
    }
    register_module("layer" + std::to_string(stage + 1), layer);
  }
  register_module("avgpool", std::make_shared<AdaptiveAvgPool2d>(1));
  register_module("flatten", std::make_shared<Flatten>());
  if (config.outputs > 0) {
    register_module("fc", std::make_shared<Linear>(in_channels, config.outputs, generator));
  }
}

Tensor ResNet::forward(const Tensor& input) {
  MPIGRAD_CHECK(input.dim() == 4, "ResNet: expected input [N, C, H, W], got ", input.shape());
  // The children run in registration order (the stem's BatchNorm and ReLU as one op); looked up
  // per call so SyncBatchNorm swaps apply.
  return forward_in_order(named_children(), input);
}

std::string ResNet::extra_repr() const {
  return "depth=" + std::to_string(config_.depth) + ", width=" + std::to_string(config_.width) +
         ", stem=" + (small_stem_ ? "small" : "imagenet") +
         ", outputs=" + std::to_string(config_.outputs);
}

}  // namespace mpigrad::nn
