// torch.nn.Conv2d: weight [out_channels, in_channels/groups, kh, kw], optional bias
// [out_channels], stride, padding (zeros, or circular: the input wraps around, for periodic
// domains), dilation and groups; default init is PyTorch's (kaiming_uniform with a = sqrt(5),
// bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))).
#pragma once

#include <array>

#include "mpigrad/core/enum_names.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/nn/functional/conv.h"
#include "mpigrad/nn/module.h"

namespace mpigrad::nn {

enum class PaddingMode : uint8_t { Zeros, Circular };
inline constexpr core::EnumName<PaddingMode> kPaddingModeNames[] = {
    {PaddingMode::Zeros, "zeros"}, {PaddingMode::Circular, "circular"}};

struct Conv2dConfig {
  int64_t in_channels = 0, out_channels = 0;
  std::array<int64_t, 2> kernel_size{3, 3};
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
  bool bias = true;
  PaddingMode padding_mode = PaddingMode::Zeros;
};

class Conv2d : public Module {
 public:
  Conv2d(const Conv2dConfig& config, core::Generator& generator);
  // The common square case: Conv2d(in, out, kernel, generator, stride, padding).
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, core::Generator& generator,
         int64_t stride = 1, int64_t padding = 0, bool bias = true);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Conv2d"; }
  std::string extra_repr() const override;
  void reset_parameters(core::Generator& generator);

  Tensor& weight() { return *weight_; }
  Tensor& bias() { return *bias_; }
  const Conv2dConfig& config() const { return config_; }

 private:
  Conv2dConfig config_;
  Tensor* weight_ = nullptr;
  Tensor* bias_ = nullptr;
  Tensor no_bias_;
};

}  // namespace mpigrad::nn
