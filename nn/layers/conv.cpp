#include "mpigrad/nn/layers/conv.h"

#include <cmath>
#include <sstream>

#include "mpigrad/nn/functional/padding.h"
#include "mpigrad/nn/init.h"

namespace mpigrad::nn {

namespace {
Conv2dConfig square(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding,
                    bool bias) {
  Conv2dConfig c;
  c.in_channels = in;
  c.out_channels = out;
  c.kernel_size = {kernel, kernel};
  c.stride = {stride, stride};
  c.padding = {padding, padding};
  c.bias = bias;
  return c;
}
std::string pair_text(const std::array<int64_t, 2>& v) {
  std::ostringstream out;
  out << "(" << v[0] << ", " << v[1] << ")";
  return out.str();
}
}  // namespace

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size,
               core::Generator& generator, int64_t stride, int64_t padding, bool bias)
    : Conv2d(square(in_channels, out_channels, kernel_size, stride, padding, bias), generator) {}

Conv2d::Conv2d(const Conv2dConfig& config, core::Generator& generator) : config_(config) {
  const auto& c = config_;
  MPIGRAD_CHECK(c.groups >= 1 && c.in_channels % c.groups == 0 && c.out_channels % c.groups == 0,
                "Conv2d: in_channels ", c.in_channels, " and out_channels ", c.out_channels,
                " must be divisible by groups ", c.groups);
  MPIGRAD_CHECK(c.kernel_size[0] >= 1 && c.kernel_size[1] >= 1, "Conv2d: kernel size must be >= 1");
  weight_ = &register_parameter("weight", core::empty({c.out_channels, c.in_channels / c.groups,
                                                       c.kernel_size[0], c.kernel_size[1]}));
  bias_ = c.bias ? &register_parameter("bias", core::empty({c.out_channels})) : &no_bias_;
  reset_parameters(generator);
}

void Conv2d::reset_parameters(core::Generator& generator) {
  init::kaiming_uniform_(*weight_, generator, std::sqrt(5.0));
  if (bias_->defined()) {
    const int64_t fan_in = init::compute_fans(*weight_).fan_in;
    const double bound = fan_in > 0 ? 1.0 / std::sqrt(double(fan_in)) : 0.0;
    init::uniform_(*bias_, -bound, bound, generator);
  }
}

Tensor Conv2d::forward(const Tensor& input) {
  functional::Conv2dOptions options;
  options.stride = config_.stride;
  if (config_.padding_mode == PaddingMode::Circular) {
    // torch does the same: pad circularly, then convolve without padding.
    options.dilation = config_.dilation;
    options.groups = config_.groups;
    return functional::conv2d(functional::pad_circular(input, config_.padding), *weight_, *bias_,
                              options);
  }
  options.padding = config_.padding;
  options.dilation = config_.dilation;
  options.groups = config_.groups;
  return functional::conv2d(input, *weight_, *bias_, options);
}

std::string Conv2d::extra_repr() const {
  const auto& c = config_;
  std::ostringstream out;
  out << c.in_channels << ", " << c.out_channels << ", kernel_size=" << pair_text(c.kernel_size)
      << ", stride=" << pair_text(c.stride);
  if (c.padding != std::array<int64_t, 2>{0, 0}) out << ", padding=" << pair_text(c.padding);
  if (c.dilation != std::array<int64_t, 2>{1, 1}) out << ", dilation=" << pair_text(c.dilation);
  if (c.groups != 1) out << ", groups=" << c.groups;
  if (!c.bias) out << ", bias=False";
  if (c.padding_mode != PaddingMode::Zeros) {
    out << ", padding_mode=" << core::enum_name(c.padding_mode, kPaddingModeNames);
  }
  return out.str();
}

}  // namespace mpigrad::nn
