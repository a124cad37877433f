// The residual block of ResNet-18 and -34 (He et al. 2016, torchvision's BasicBlock):
//   out = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))
// conv1 is 3x3 with the block's stride, conv2 3x3 stride 1, both without bias. The shortcut is
// the identity, or, when the stride is not 1 or the channel count changes, `downsample`: a 1x1
// conv with the stride and a BatchNorm2d (children "downsample.0" and "downsample.1").
// Children are registered as conv1, bn1, relu, conv2, bn2[, downsample], so the names are
// torchvision's ("layer2.0.downsample.1.running_var") and a torch model loads a checkpoint by
// name. forward() looks its children up on every call, so convert_sync_batchnorm's swaps of
// bn1, bn2 and downsample.1 take effect.
// Convolutions are initialized as torchvision's ResNet does: kaiming_normal_ with fan_out and
// the ReLU gain; BatchNorm weights one, biases zero.
#pragma once

#include <cstdint>

#include "mpigrad/core/rng.h"
#include "mpigrad/nn/module.h"

namespace mpigrad::nn {

class BasicBlock : public Module {
 public:
  BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride, core::Generator& generator);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "BasicBlock"; }
  bool has_downsample() const { return has_downsample_; }

 private:
  bool has_downsample_ = false;
};

}  // namespace mpigrad::nn
