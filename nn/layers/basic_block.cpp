#include "mpigrad/nn/layers/basic_block.h"

#include <memory>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/nn/init.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/batch_norm.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/layers/conv.h"

namespace mpigrad::nn {

namespace {

std::shared_ptr<Conv2d> block_conv(int64_t in_channels, int64_t out_channels, int64_t kernel,
                                   int64_t stride, core::Generator& generator) {
  auto conv = std::make_shared<Conv2d>(in_channels, out_channels, kernel, generator, stride,
                                       kernel / 2, /*bias=*/false);
  init::kaiming_normal_(conv->weight(), generator, 0.0, init::FanMode::FanOut,
                        init::Nonlinearity::ReLU);
  return conv;
}

}  // namespace

BasicBlock::BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride,
                       core::Generator& generator) {
  MPIGRAD_CHECK(in_channels >= 1 && out_channels >= 1 && stride >= 1,
                "BasicBlock: channels and "
                "stride must be at least 1, got in ",
                in_channels, ", out ", out_channels, ", stride ", stride);
  register_module("conv1", block_conv(in_channels, out_channels, 3, stride, generator));
  register_module("bn1", std::make_shared<BatchNorm2d>(out_channels));
  register_module("relu", std::make_shared<ReLU>());
  register_module("conv2", block_conv(out_channels, out_channels, 3, 1, generator));
  register_module("bn2", std::make_shared<BatchNorm2d>(out_channels));
  has_downsample_ = stride != 1 || in_channels != out_channels;
  if (has_downsample_) {
    register_module("downsample", std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
                                      block_conv(in_channels, out_channels, 1, stride, generator),
                                      std::make_shared<BatchNorm2d>(out_channels)}));
  }
}

Tensor BasicBlock::forward(const Tensor& input) {
  // Positions follow the registration order of the constructor.
  const auto children = named_children();
  Module& conv1 = *children[0].second;
  Module& bn1 = *children[1].second;
  Module& conv2 = *children[3].second;
  Module& bn2 = *children[4].second;
  Tensor out = batch_norm_then_relu(bn1, conv1(input));
  out = bn2(conv2(out));
  Tensor shortcut = has_downsample_ ? (*children[5].second)(input) : input;
  return core::relu(out + shortcut);
}

}  // namespace mpigrad::nn
